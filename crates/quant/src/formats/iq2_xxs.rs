//! IQ2_XXS: super-blocks of 256 weights; each group of 8 is a point of a 256-entry
//! codebook of magnitudes with 7 stored sign bits (the eighth makes the count of
//! negatives even); 4-bit scale per 32, f16 `d`. 2.0625 bits per weight.
//!
//! Layout (`block_iq2_xxs`, 66 bytes): `d: f16`, then per 32 weights `ib` two u32:
//! `a = qs[8ib..8ib+4]` holds the codebook indices of the four groups (one byte each),
//! `b` holds the four 7-bit sign fields at bits `7k` and the scale `ls = b >> 28`.
//! Value = `d·(0.5 + ls)/4 · grid · ±1` (`dequantize_row_iq2_xxs`). Dot product pairs
//! with Q8_K activations.
//!
//! Quantization: ggml only quantizes IQ2_XXS with an importance matrix. Ours needs none:
//! it weighs errors by `x²` (magnitude weighting). Per 32 weights it flips the least
//! important sign if the count of negatives is odd, scans 13 scales (codebook points
//! taken from the nearest neighbours of the rounded level pattern, as ggml's search
//! does), refits the scale by least squares, then quantizes the scale to 4 bits and
//! picks the final points by an exact search of the codebook. It is not bit-identical
//! to ggml's quantizer, but its blocks are valid and decode with the format's own rule
//! (about 0.25 µs per weight on one core).

use super::Unpacked;
use super::iq2_grid::IQ2XXS_GRID;
use crate::fp::{f32_to_f16, rd_f16, rd_u32, wr_u16};

pub(crate) const BYTES: usize = 66;

/// Magnitude levels of the codebook.
const LEVELS: [f32; 3] = [8.0, 25.0, 43.0];

/// Full 8-bit sign pattern for a 7-bit field: bit 7 is the parity of the low seven.
#[inline]
pub(crate) fn ksigns(s7: u32) -> u8 {
    (s7 | ((s7.count_ones() & 1) << 7)) as u8
}

/// Magnitude `j` (0..8) of codebook point `idx`.
#[inline]
pub(crate) fn grid(idx: u8, j: usize) -> u8 {
    (IQ2XXS_GRID[idx as usize] >> (8 * j)) as u8
}

/// Dequantizes whole blocks (`dequantize_row_iq2_xxs`).
pub(crate) fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = rd_f16(b, 0);
        for ib in 0..8 {
            let aux0 = rd_u32(b, 2 + 8 * ib);
            let aux1 = rd_u32(b, 2 + 8 * ib + 4);
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let signs = ksigns((aux1 >> (7 * l)) & 127);
                for j in 0..8 {
                    let g = grid((aux0 >> (8 * l)) as u8, j) as f32;
                    let s = if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
                    y[32 * ib + 8 * l + j] = db * g * s;
                }
            }
        }
    }
}

/// Best codebook point for one group of 8 targets `xv` (signs already folded in) at
/// scale `s`, minimizing `Σ w·(s·g - xv)²`. Returns `(index, error)`. When the
/// per-element best levels form a codebook point, that point is the exact optimum;
/// otherwise `exact` searches all 256 points (split into two halves of 4 elements,
/// whose 81 level patterns each are costed once), and the fast search only the points
/// nearest to that level pattern (the two closest distances, as ggml's IQ2 quantizer).
fn best_point(xv: &[f32], w: &[f32], s: f32, exact: bool) -> (u8, f32) {
    let mut cost = [[0f32; 3]; 8];
    let mut code = [0u8; 8];
    for j in 0..8 {
        let mut best = 0;
        for (k, lv) in LEVELS.iter().enumerate() {
            let diff = s * lv - xv[j];
            cost[j][k] = w[j] * diff * diff;
            if cost[j][k] < cost[j][best] {
                best = k;
            }
        }
        code[j] = best as u8;
    }
    let t = tables();
    let key = code_key(&code);
    let err_of = |idx: u8| -> f32 {
        (0..8)
            .map(|j| cost[j][t.levels[idx as usize][j] as usize])
            .sum()
    };
    if t.index[key] >= 0 {
        let idx = t.index[key] as u8;
        return (idx, err_of(idx));
    }
    if exact {
        // half[h][p]: cost of elements 4h..4h+4 at level pattern p (base 3, element
        // 4h least significant), built digit by digit.
        let mut half = [[0f32; 81]; 2];
        for (h, costs) in half.iter_mut().enumerate() {
            costs[..3].copy_from_slice(&cost[4 * h]);
            let mut n = 3;
            for j in 1..4 {
                for p in (0..3 * n).rev() {
                    costs[p] = costs[p % n] + cost[4 * h + j][p / n];
                }
                n *= 3;
            }
        }
        let mut best = (0u8, f32::INFINITY);
        for idx in 0..256 {
            let err = half[0][t.halves[idx][0] as usize] + half[1][t.halves[idx][1] as usize];
            if err < best.1 {
                best = (idx as u8, err);
            }
        }
        return (best.0, err_of(best.0));
    }
    let (lo, hi) = (
        t.neighbours_at[key] as usize,
        t.neighbours_at[key + 1] as usize,
    );
    let mut best = (0u8, f32::INFINITY);
    for &idx in &t.neighbours[lo..hi] {
        let err = err_of(idx);
        if err < best.1 {
            best = (idx, err);
        }
    }
    best
}

/// Level (0, 1, 2) of a codebook magnitude byte.
#[inline]
fn level_of(g: u8) -> u8 {
    match g {
        0x08 => 0,
        0x19 => 1,
        _ => 2,
    }
}

/// Base-3 key of a level pattern (0..6561).
#[inline]
fn code_key(code: &[u8; 8]) -> usize {
    code.iter().rev().fold(0usize, |k, &c| k * 3 + c as usize)
}

/// Search tables, built once: the level pattern of every codebook point, the point of
/// every on-grid pattern, and for every other pattern its nearest points.
struct Tables {
    levels: [[u8; 8]; 256],
    /// Base-3 keys of elements 0..4 and 4..8 of each point.
    halves: [[u8; 2]; 256],
    index: Vec<i16>,
    neighbours_at: Vec<u32>,
    neighbours: Vec<u8>,
}

fn tables() -> &'static Tables {
    static T: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut levels = [[0u8; 8]; 256];
        let mut halves = [[0u8; 2]; 256];
        let mut index = vec![-1i16; 6561];
        for idx in 0..256 {
            for j in 0..8 {
                levels[idx][j] = level_of(grid(idx as u8, j));
            }
            let key = code_key(&levels[idx]);
            index[key] = idx as i16;
            halves[idx] = [(key % 81) as u8, (key / 81) as u8];
        }
        let mut neighbours_at = Vec::with_capacity(6562);
        let mut neighbours = Vec::new();
        for key in 0..6561usize {
            neighbours_at.push(neighbours.len() as u32);
            if index[key] >= 0 {
                continue;
            }
            let mut code = [0u8; 8];
            let mut k = key;
            for c in code.iter_mut() {
                *c = (k % 3) as u8;
                k /= 3;
            }
            let dist = |idx: usize| -> u32 {
                (0..8)
                    .map(|j| {
                        let d = LEVELS[levels[idx][j] as usize] - LEVELS[code[j] as usize];
                        (d * d) as u32
                    })
                    .sum()
            };
            let mut d: Vec<(u32, u8)> = (0..256).map(|i| (dist(i), i as u8)).collect();
            d.sort_unstable();
            let first = d[0].0;
            let second = d.iter().map(|e| e.0).find(|&x| x > first).unwrap_or(first);
            neighbours.extend(d.iter().take_while(|e| e.0 <= second).map(|e| e.1));
        }
        neighbours_at.push(neighbours.len() as u32);
        Tables {
            levels,
            halves,
            index,
            neighbours_at,
            neighbours,
        }
    })
}

/// One 32-weight group prepared for the search: targets with signs folded in, weights,
/// and the four 7-bit sign fields.
struct Group32 {
    xv: [f32; 32],
    w: [f32; 32],
    signs: [u32; 4],
}

impl Group32 {
    fn new(x: &[f32]) -> Self {
        let mut g = Group32 {
            xv: [0.0; 32],
            w: [0.0; 32],
            signs: [0; 4],
        };
        for k in 0..4 {
            let mut s = 0u32;
            for i in 0..8 {
                let v = x[8 * k + i];
                g.w[8 * k + i] = v * v;
                g.xv[8 * k + i] = v.abs();
                if v < 0.0 {
                    s |= 1 << i;
                }
            }
            if s.count_ones() % 2 == 1 {
                // The stored signs must have an even count of negatives: flip the
                // element that matters least, which then targets -|x|.
                let imin = (0..8)
                    .min_by(|&a, &b| x[8 * k + a].abs().total_cmp(&x[8 * k + b].abs()))
                    .unwrap_or(0);
                g.xv[8 * k + imin] = -g.xv[8 * k + imin];
                s ^= 1 << imin;
            }
            g.signs[k] = s & 127;
        }
        g
    }

    /// Codebook points for scale `s` and the total weighted error (`exact`: see
    /// [`best_point`]).
    fn assign(&self, s: f32, exact: bool) -> ([u8; 4], f32) {
        let mut idx = [0u8; 4];
        let mut err = 0.0;
        for k in 0..4 {
            let (i, e) = best_point(
                &self.xv[8 * k..8 * k + 8],
                &self.w[8 * k..8 * k + 8],
                s,
                exact,
            );
            idx[k] = i;
            err += e;
        }
        (idx, err)
    }

    /// Best free scale (before the 4-bit scale quantization).
    fn search_scale(&self) -> f32 {
        let max = self.xv.iter().fold(0.0f32, |m, &v| m.max(v));
        if max <= 0.0 {
            return 0.0;
        }
        let mut best = (0.0f32, f32::INFINITY);
        for step in 0..=12 {
            let s0 = max / (24.0 + 2.0 * step as f32);
            let (idx, _) = self.assign(s0, false);
            // Least-squares scale for this assignment.
            let (mut sxg, mut sgg) = (0.0f32, 0.0f32);
            for k in 0..4 {
                for j in 0..8 {
                    let g = grid(idx[k], j) as f32;
                    let i = 8 * k + j;
                    sxg += self.w[i] * self.xv[i] * g;
                    sgg += self.w[i] * g * g;
                }
            }
            let s = if sgg > 0.0 && sxg > 0.0 {
                sxg / sgg
            } else {
                s0
            };
            let (_, err) = self.assign(s, false);
            if err < best.1 {
                best = (s, err);
            }
        }
        best.0
    }
}

/// Quantizes whole super-blocks (see the module documentation for the method).
pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(BYTES)) {
        b.fill(0);
        let groups: Vec<Group32> = (0..8)
            .map(|ib| Group32::new(&x[32 * ib..32 * ib + 32]))
            .collect();
        let scales: Vec<f32> = groups.iter().map(Group32::search_scale).collect();
        let max_scale = scales.iter().fold(0.0f32, |m, &s| m.max(s));
        if max_scale <= 0.0 {
            continue;
        }
        // Effective scale of a 32-group is d·(0.5 + ls)/4; ls = 15 reaches max_scale.
        let dh = f32_to_f16(max_scale * 4.0 / 15.5);
        wr_u16(b, 0, dh);
        let d = rd_f16(b, 0);
        if d <= 0.0 {
            continue;
        }
        for (ib, g) in groups.iter().enumerate() {
            let center = (scales[ib] * 4.0 / d - 0.5).round() as i32;
            let mut best = (0u32, [0u8; 4], f32::INFINITY);
            for ls in (center - 1).max(0)..=(center + 1).min(15) {
                let s = d * (0.5 + ls as f32) * 0.25;
                let (idx, err) = g.assign(s, true);
                if err < best.2 {
                    best = (ls as u32, idx, err);
                }
            }
            let (ls, idx, _) = best;
            let aux0 = u32::from_le_bytes(idx);
            let aux1 = g.signs[0]
                | (g.signs[1] << 7)
                | (g.signs[2] << 14)
                | (g.signs[3] << 21)
                | (ls << 28);
            b[2 + 8 * ib..6 + 8 * ib].copy_from_slice(&aux0.to_le_bytes());
            b[6 + 8 * ib..10 + 8 * ib].copy_from_slice(&aux1.to_le_bytes());
        }
    }
}

/// Decodes a block: signed codebook magnitudes, sub-block scales `2·ls + 1`, `d`.
pub(crate) fn unpack(b: &[u8], u: &mut Unpacked) {
    u.d = rd_f16(b, 0);
    for ib in 0..8 {
        let aux0 = rd_u32(b, 2 + 8 * ib);
        let aux1 = rd_u32(b, 2 + 8 * ib + 4);
        u.sub[ib] = 2 * (aux1 >> 28) as i32 + 1;
        for l in 0..4 {
            let signs = ksigns((aux1 >> (7 * l)) & 127);
            for j in 0..8 {
                let g = grid((aux0 >> (8 * l)) as u8, j) as i8;
                u.vals[32 * ib + 8 * l + j] = if signs & (1 << j) != 0 { -g } else { g };
            }
        }
    }
}
