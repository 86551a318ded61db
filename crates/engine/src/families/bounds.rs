//! Bounds of the families' golden-master tests (test builds only): each bound is a
//! measurement pinned in the test (the figures of docs/parity.md) times a stated margin,
//! so that a regression of 10× fails and a change of the numbers is seen and re-pinned.
//! Every check also shows that its bounds reject deliberately perturbed inputs: our error
//! grown tenfold (`reference + 10 × (ours − reference)`, which the metric scales exactly)
//! and, for logits, every value scaled by 1.01.

use std::ops::Range;
use std::path::Path;

use crate::fixtures::{Golden, argmax, npy, npy_i32, row_err};

/// Worst and median of a per-row metric.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rows {
    pub worst: f64,
    pub median: f64,
}

impl Rows {
    /// [`row_err`] of every row of `vocab` columns of `ours` against `reference`.
    pub fn of(ours: &[f32], reference: &[f32], vocab: usize) -> Rows {
        assert_eq!(ours.len(), reference.len());
        let mut e: Vec<f64> = ours
            .chunks(vocab)
            .zip(reference.chunks(vocab))
            .map(|(a, b)| row_err(a, b))
            .collect();
        e.sort_by(f64::total_cmp);
        Rows {
            worst: e[e.len() - 1],
            median: e[e.len() / 2],
        }
    }
}

/// The parity metric of one run of the fixture protocol.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Errors {
    pub prefill: Rows,
    pub decode: Rows,
    /// Decode steps whose argmax is the reference's next token.
    pub greedy: usize,
}

impl Errors {
    /// Our prefill rows and decode steps against the fixture's.
    pub fn of(pre: &[f32], dec: &[f32], g: &Golden) -> Errors {
        Errors {
            prefill: Rows::of(pre, &g.prefill, g.vocab),
            decode: Rows::of(dec, &g.decode, g.vocab),
            greedy: dec
                .chunks(g.vocab)
                .enumerate()
                .filter(|(i, r)| argmax(r) as u32 == g.decode_tokens[i + 1])
                .count(),
        }
    }
}

/// A fixture's measured [`Errors`] and the margin its bounds allow.
#[derive(Clone, Copy, Debug)]
pub struct Pinned {
    /// What the fixture measured (docs/parity.md).
    pub measured: Errors,
    /// Bounds on the worst rows: `worst_margin × measured` (below 10).
    pub worst_margin: f64,
    /// Bounds on the median rows: `median_margin × measured` (below 10).
    pub median_margin: f64,
    /// Greedy disagreements allowed beyond the measured ones.
    pub greedy_slack: usize,
}

impl Pinned {
    /// f32 weights: rows within `margin ×` the measured worst (medians not bounded), every
    /// greedy token the reference's.
    pub const fn f32(prefill: f64, decode: f64, margin: f64) -> Pinned {
        Pinned {
            measured: Errors {
                prefill: Rows {
                    worst: prefill,
                    median: f64::INFINITY,
                },
                decode: Rows {
                    worst: decode,
                    median: f64::INFINITY,
                },
                greedy: 32,
            },
            worst_margin: margin,
            median_margin: margin,
            greedy_slack: 0,
        }
    }

    /// The larger of the prefill and decode worst-row bounds.
    pub fn worst_bound(&self) -> f64 {
        let m = &self.measured;
        self.worst_margin * m.prefill.worst.max(m.decode.worst)
    }

    /// Every bound `e` breaks, named; empty when within.
    pub fn violations(&self, e: &Errors) -> Vec<String> {
        let m = &self.measured;
        let mut out = Vec::new();
        let (w, md) = (self.worst_margin, self.median_margin);
        for (what, got, measured, margin) in [
            ("worst prefill row", e.prefill.worst, m.prefill.worst, w),
            ("median prefill row", e.prefill.median, m.prefill.median, md),
            ("worst decode step", e.decode.worst, m.decode.worst, w),
            ("median decode step", e.decode.median, m.decode.median, md),
        ] {
            let bound = margin * measured;
            if got.is_nan() || got > bound {
                out.push(format!(
                    "{what} {got:.3e} > {bound:.3e} ({margin}× the measured {measured:.3e})"
                ));
            }
        }
        let want = m.greedy.saturating_sub(self.greedy_slack);
        if e.greedy < want {
            out.push(format!(
                "greedy agreement {}/32 < {want}/32 (measured {}/32)",
                e.greedy, m.greedy
            ));
        }
        out
    }

    /// Asserts our logits (`pre` every prefill row, `dec` the decode steps) within the
    /// bounds, and that the bounds reject our error grown tenfold (on each bound whose
    /// measured value is not zero) and every logit scaled by 1.01. Returns the errors.
    pub fn check(&self, name: &str, pre: &[f32], dec: &[f32], g: &Golden) -> Errors {
        for margin in [self.worst_margin, self.median_margin] {
            assert!(margin > 1.0 && margin < 10.0, "{name}: margin {margin}");
        }
        let e = Errors::of(pre, dec, g);
        eprintln!(
            "{name}: prefill worst {:.3e} median {:.3e}; decode worst {:.3e} median {:.3e}; \
             greedy {}/32",
            e.prefill.worst, e.prefill.median, e.decode.worst, e.decode.median, e.greedy
        );
        let v = self.violations(&e);
        assert!(v.is_empty(), "{name}: {}", v.join("; "));

        let grown = Errors::of(&grow(pre, &g.prefill, 10.0), &grow(dec, &g.decode, 10.0), g);
        let v = self.violations(&grown).join("; ");
        let m = &self.measured;
        for (what, measured) in [
            ("worst prefill row", m.prefill.worst),
            ("median prefill row", m.prefill.median),
            ("worst decode step", m.decode.worst),
            ("median decode step", m.decode.median),
        ] {
            if measured > 0.0 && measured.is_finite() {
                assert!(
                    v.contains(what),
                    "{name}: our error grown 10× passes the {what} bound (re-pin the \
                     measurement if it improved): {grown:?}"
                );
            }
        }
        let scaled = Errors::of(&scale(pre, 1.01), &scale(dec, 1.01), g);
        let vs = self.violations(&scaled);
        assert!(
            !vs.is_empty(),
            "{name}: logits scaled by 1.01 pass every bound: {scaled:?}"
        );
        eprintln!("{name}: our error grown 10× fails: {v}");
        eprintln!("{name}: logits scaled by 1.01 fail: {}", vs.join("; "));
        e
    }
}

/// `reference + k × (ours − reference)`: our error grown `k`-fold.
pub fn grow(ours: &[f32], reference: &[f32], k: f32) -> Vec<f32> {
    ours.iter()
        .zip(reference)
        .map(|(&a, &b)| b + k * (a - b))
        .collect()
}

/// Every value times `k`.
pub fn scale(x: &[f32], k: f32) -> Vec<f32> {
    x.iter().map(|v| v * k).collect()
}

/// A deliberate change of our values before they are compared.
#[derive(Clone, Copy, Debug)]
pub enum Perturb {
    /// Our values as they are.
    Off,
    /// Our error grown `k`-fold (see [`grow`]).
    Grown(f32),
    /// Our values times `k`.
    Scaled(f32),
}

/// Max over the fixture positions `pos` of max |ours − theirs| / max(1, max |theirs|) for
/// one per-layer array of rows of `width` values (ours: every position; theirs: the
/// positions `pos` only), `ours` perturbed by `p` first.
pub fn hidden_err(ours: &[f32], theirs: &[f32], pos: &[usize], width: usize, p: Perturb) -> f64 {
    let mut worst = 0f64;
    for (k, &i) in pos.iter().enumerate() {
        let a = &ours[i * width..(i + 1) * width];
        let b = &theirs[k * width..(k + 1) * width];
        let scale = b.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
        let d = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| {
                let x = match p {
                    Perturb::Off => x,
                    Perturb::Grown(k) => y + k * (x - y),
                    Perturb::Scaled(k) => x * k,
                };
                (x - y).abs() as f64
            })
            .fold(0.0, f64::max);
        worst = worst.max(d / scale);
    }
    worst
}

/// The reference's hidden states of a fixture (`hidden_*.npy`): the positions compared
/// and, at those positions, the embeddings and layer after layer the streams and the
/// attention and MLP (or MoE) block outputs.
pub struct HiddenRef {
    pub pos: Vec<usize>,
    pub embed: Vec<f32>,
    pub streams: Vec<f32>,
    pub attn: Vec<f32>,
    pub mlp: Vec<f32>,
}

impl HiddenRef {
    pub fn load(dir: &Path) -> HiddenRef {
        HiddenRef {
            pos: npy_i32(&dir.join("hidden_positions.npy"))
                .into_iter()
                .map(|v| v as usize)
                .collect(),
            embed: npy(&dir.join("hidden_embed.npy")).1,
            streams: npy(&dir.join("hidden_streams.npy")).1,
            attn: npy(&dir.join("hidden_attn_out.npy")).1,
            mlp: npy(&dir.join("hidden_mlp_out.npy")).1,
        }
    }

    /// Layer `i`'s part of an all-layers array of `w` values per position.
    pub fn at(&self, i: usize, w: usize) -> Range<usize> {
        let per = self.pos.len();
        i * per * w..(i + 1) * per * w
    }

    /// Per layer, the worst of our streams (`n·d` values per position) and attention and
    /// block outputs (`d`) — `ours` in that order, one entry per layer — against the
    /// reference's, ours perturbed by `p`; unperturbed, each layer's figures are printed
    /// (the block output as `block`).
    pub fn layer_errs(
        &self,
        name: &str,
        block: &str,
        ours: [&[Vec<f32>]; 3],
        (n, d): (usize, usize),
        p: Perturb,
    ) -> Vec<f64> {
        let [streams, attn, mlp] = ours;
        (0..streams.len())
            .map(|i| {
                let es = hidden_err(
                    &streams[i],
                    &self.streams[self.at(i, n * d)],
                    &self.pos,
                    n * d,
                    p,
                );
                let ea = hidden_err(&attn[i], &self.attn[self.at(i, d)], &self.pos, d, p);
                let em = hidden_err(&mlp[i], &self.mlp[self.at(i, d)], &self.pos, d, p);
                if matches!(p, Perturb::Off) {
                    eprintln!(
                        "{name} layer {i}: attn {ea:.2e}  {block} {em:.2e}  streams {es:.2e}"
                    );
                }
                es.max(ea).max(em)
            })
            .collect()
    }
}

/// A fixture's pinned hidden-state measurement: per layer, the worst of its attention and
/// MLP/MoE outputs and streams (0 where it equals the reference's bit for bit at the
/// sampled positions, which must stay exact).
#[derive(Clone, Copy, Debug)]
pub struct PinnedHidden {
    pub layers: &'static [f64],
    /// Every layer within `margin ×` its measured error (below 10).
    pub margin: f64,
}

impl PinnedHidden {
    /// Checks `errs(p)`, the per-layer errors with our values perturbed by `p`: unperturbed
    /// within the bounds, and both our error grown 10× and our values scaled by 1.01
    /// rejected.
    pub fn check(&self, name: &str, errs: impl Fn(Perturb) -> Vec<f64>) {
        assert!(self.margin > 1.0 && self.margin < 10.0, "{name}: margin");
        let violations = |e: &[f64]| -> Vec<String> {
            assert_eq!(e.len(), self.layers.len(), "{name}: layers pinned");
            let mut v = Vec::new();
            for (i, (&x, &m)) in e.iter().zip(self.layers).enumerate() {
                let bound = self.margin * m;
                if x.is_nan() || x > bound {
                    v.push(format!(
                        "layer {i} {x:.3e} > {bound:.3e} ({}× the measured {m:.2e})",
                        self.margin
                    ));
                }
            }
            v
        };
        let e = errs(Perturb::Off);
        let pins: Vec<String> = e.iter().map(|&x| format!("{:.2e}", round_up(x))).collect();
        eprintln!("{name}: hidden states per layer [{}]", pins.join(", "));
        let v = violations(&e);
        assert!(v.is_empty(), "{name}: {}", v.join("; "));
        for p in [Perturb::Grown(10.0), Perturb::Scaled(1.01)] {
            let v = violations(&errs(p));
            assert!(
                !v.is_empty(),
                "{name}: hidden states perturbed {p:?} pass every bound (re-pin the \
                 measurement if it improved)"
            );
            eprintln!("{name}: hidden states perturbed {p:?} fail: {}", v[0]);
        }
    }
}

/// `x` rounded up to three significant digits (what a pinned measurement records).
fn round_up(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return x;
    }
    let unit = 10f64.powi(x.log10().floor() as i32 - 2);
    (x / unit).ceil() * unit
}
