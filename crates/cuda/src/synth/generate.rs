//! The synthetic-weight generators, shared by the host (GGUF files) and the device
//! (`synth_blocks` and `synth_floats` in `kernels/dequant.cu`), so that a model built in
//! GPU memory and the same model written to a file hold identical bytes.
//!
//! Every tensor has a key, `key = splitmix64(seed ^ fnv1a64(tensor name))`
//! ([`tensor_key`]); splitmix64 is Steele, Lea and Flood's (2014).
//!
//! - Quantized blocks ([`blocks`]): every byte of block `b` comes from splitmix64
//!   counters: `base = splitmix64(key ^ b·0xD1B54A32D192ED03)`, word `i` of the block is
//!   `splitmix64(base + i)` (little-endian, truncated to the block size). Then the f16
//!   scales are overwritten with finite values of a fixed exponent per type and a random
//!   mantissa (from `splitmix64(base ^ 0xA5A5…)`), chosen so that weights have a standard
//!   deviation of about 0.02, and Q6_K's int8 sub-block scales are folded into
//!   [-32, 31].
//! - Element `i` of a float tensor draws `u = splitmix64(key ^ i·0x9E3779B97F4A7C15) >> 40`,
//!   24 random bits. Random floats ([`floats`]) are `(u − 2²³)·2⁻²⁸`, uniform in
//!   [-1/32, 1/32) (standard deviation 0.018), exact in f32 and rounded to the tensor's
//!   type (F16, BF16) to nearest even; norm weights ([`norms`]) are `0.5 + u·2⁻²⁴`, in
//!   [0.5, 1.5); biases ([`biases`]) `(u·2⁻²⁴ − 0.5)·0.2`, in [-0.1, 0.1).
//!
//! Blocks and random floats are integer arithmetic up to one rounding, so host and device
//! agree bit for bit; norms, biases, constants and hash-routing tables ([`expert_ids`])
//! are F32 or I32 and generated on the host only ([`super::on_host`]).

use ds4_gguf::GgmlType;
use rayon::prelude::*;

use super::{Init, Tensor};

/// splitmix64's output function of `x` (the state advanced once).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a 64-bit hash of a tensor name.
pub fn fnv1a64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The generator key of tensor `name` under `seed`.
pub fn tensor_key(seed: u64, name: &str) -> u64 {
    splitmix64(seed ^ fnv1a64(name))
}

/// f16 bits with exponent field `e` and mantissa `m`.
fn f16_bits(e: u16, m: u16) -> [u8; 2] {
    ((e << 10) | m).to_le_bytes()
}

/// Block `b` of a tensor of type `ty` with key `key`, written into `out` (one block).
pub fn block(ty: GgmlType, key: u64, b: u64, out: &mut [u8]) {
    let base = splitmix64(key ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03));
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let r = splitmix64(base.wrapping_add(i as u64)).to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    let m = (splitmix64(base ^ 0xA5A5_A5A5_A5A5_A5A5) & 0x3FF) as u16;
    use GgmlType::*;
    match ty {
        Q4_0 => out[0..2].copy_from_slice(&f16_bits(7, m)),
        Q4_1 => {
            out[0..2].copy_from_slice(&f16_bits(7, m));
            // min = -8·d: the sign bit set, the exponent three higher.
            out[2..4].copy_from_slice(&(0x8000u16 | (10 << 10) | m).to_le_bytes());
        }
        Q5_0 => out[0..2].copy_from_slice(&f16_bits(6, m)),
        Q8_0 => out[0..2].copy_from_slice(&f16_bits(3, m)),
        Q4_K => {
            out[0..2].copy_from_slice(&f16_bits(2, m));
            out[2..4].copy_from_slice(&f16_bits(5, m));
        }
        Q5_K => {
            out[0..2].copy_from_slice(&f16_bits(1, m));
            out[2..4].copy_from_slice(&f16_bits(5, m));
        }
        Q6_K => {
            for s in &mut out[192..208] {
                *s = (*s & 0x3F).wrapping_add(224);
            }
            out[208..210].copy_from_slice(&f16_bits(1, m));
        }
        IQ2_XXS => out[0..2].copy_from_slice(&f16_bits(4, m)),
        Q2_K => {
            out[80..82].copy_from_slice(&f16_bits(3, m));
            out[82..84].copy_from_slice(&f16_bits(3, m));
        }
        _ => {}
    }
}

/// Whether [`block`] generates valid blocks of `ty`.
pub fn supported(ty: GgmlType) -> bool {
    crate::layout::MATRIX_TYPES.contains(&ty)
}

/// `n_blocks` blocks of `ty` for tensor key `key` (GGUF layout), generated in parallel.
pub fn blocks(ty: GgmlType, key: u64, n_blocks: usize) -> Vec<u8> {
    let bs = ty.type_size();
    let mut out = vec![0u8; n_blocks * bs];
    out.par_chunks_mut(bs * 1024)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (i, blk) in chunk.chunks_mut(bs).enumerate() {
                block(ty, key, (c * 1024 + i) as u64, blk);
            }
        });
    out
}

/// 24 random bits for element `i` of the tensor with key `key`.
fn unit_bits(key: u64, i: u64) -> u32 {
    (splitmix64(key ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 40) as u32
}

/// `unit_bits` in [0, 1).
fn unit(key: u64, i: u64) -> f32 {
    unit_bits(key, i) as f32 * (1.0 / 16_777_216.0)
}

/// Random float `i` of the tensor with key `key`: uniform in [-1/32, 1/32), exact in f32.
pub fn float(key: u64, i: u64) -> f32 {
    (unit_bits(key, i) as i32 - (1 << 23)) as f32 * (1.0 / 268_435_456.0)
}

/// `n` random floats (see [`float`]) of type `ty` (F32, F16 or BF16; rounded to nearest
/// even), as the tensor's bytes, generated in parallel.
///
/// # Panics
/// On another type (callers choose the type from the model's plan).
pub fn floats(ty: GgmlType, key: u64, n: usize) -> Vec<u8> {
    let size = ty.type_size();
    let mut out = vec![0u8; n * size];
    out.par_chunks_mut(size * 4096)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (j, e) in chunk.chunks_mut(size).enumerate() {
                let x = float(key, (c * 4096 + j) as u64);
                match ty {
                    GgmlType::F32 => e.copy_from_slice(&x.to_le_bytes()),
                    GgmlType::F16 => e.copy_from_slice(&half::f16::from_f32(x).to_le_bytes()),
                    GgmlType::BF16 => e.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
                    _ => panic!("random floats of type {ty}"),
                }
            }
        });
    out
}

/// `n` norm weights in [0.5, 1.5).
pub fn norms(key: u64, n: usize) -> Vec<f32> {
    (0..n as u64).map(|i| 0.5 + unit(key, i)).collect()
}

/// `n` biases in [-0.1, 0.1).
pub fn biases(key: u64, n: usize) -> Vec<f32> {
    (0..n as u64).map(|i| (unit(key, i) - 0.5) * 0.2).collect()
}

/// A hash-routing table `[rows, k]` (i32): row `t` holds the distinct expert ids
/// `(first + j·(n_expert / k)) mod n_expert`, `first` random per row (`synth_gguf.py`'s
/// `expert_ids`).
pub fn expert_ids(key: u64, rows: usize, k: usize, n_expert: u32) -> Vec<i32> {
    let step = n_expert / k.max(1) as u32;
    (0..rows as u64)
        .flat_map(|t| {
            let first = unit_bits(key, t) % n_expert;
            (0..k as u32).map(move |j| ((first + j * step) % n_expert) as i32)
        })
        .collect()
}

/// The bytes of tensor `t` of a model with generator seed `seed`.
///
/// # Panics
/// On an init the generators do not make in `t`'s type (random blocks of a type
/// [`block`] does not support, random floats of a non-float type, norms, biases or
/// constants of a type other than F32, expert ids of a type other than I32): the model
/// plans never ask for one.
pub fn tensor_bytes(seed: u64, t: &Tensor) -> Vec<u8> {
    let key = tensor_key(seed, &t.name);
    let n = t.n_elements() as usize;
    let f32s = |v: Vec<f32>| {
        assert_eq!(
            t.ty,
            GgmlType::F32,
            "{}: {:?} values are f32",
            t.name,
            t.init
        );
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    };
    match t.init {
        Init::Blocks => {
            assert!(supported(t.ty), "{}: no random blocks of {}", t.name, t.ty);
            blocks(t.ty, key, n / t.ty.block_size())
        }
        Init::Floats => floats(t.ty, key, n),
        Init::Norm => f32s(norms(key, n)),
        Init::Bias => f32s(biases(key, n)),
        Init::Const(c) => f32s(vec![c; n]),
        Init::ExpertIds(n_expert) => {
            assert_eq!(t.ty, GgmlType::I32, "{}: expert ids are i32", t.name);
            let k = t.dims[0] as usize;
            expert_ids(key, n / k, k, n_expert)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_SEED;
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // Reference: the first outputs of splitmix64 seeded with 0 (Vigna's splitmix64.c:
        // state += golden gamma, then the mix), 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn fnv1a64_matches_the_reference() {
        // FNV-1a 64 test vectors (Fowler/Noll/Vo): "" and "a".
        assert_eq!(fnv1a64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn scales_are_finite_and_in_range() {
        for ty in crate::layout::MATRIX_TYPES {
            let data = blocks(ty, tensor_key(7, "blk.0.attn_q.weight"), 64);
            for blk in data.chunks(ty.type_size()) {
                let d_at = match ty {
                    GgmlType::Q6_K => 208,
                    GgmlType::Q2_K => 80,
                    _ => 0,
                };
                let d = half::f16::from_le_bytes([blk[d_at], blk[d_at + 1]]).to_f32();
                assert!(d.is_finite() && d > 0.0 && d < 0.01, "{ty}: d = {d}");
            }
        }
    }

    #[test]
    fn vectors_are_in_range() {
        let key = tensor_key(1, "output_norm.weight");
        assert!(norms(key, 1000).iter().all(|v| (0.5..1.5).contains(v)));
        assert!(biases(key, 1000).iter().all(|v| (-0.1..0.1).contains(v)));
    }

    #[test]
    fn floats_match_known_values() {
        // Independent reference: splitmix64 and numpy's float16 (round to nearest even)
        // in Python; bf16 rounded to nearest even by hand from the f32 bits.
        let key = tensor_key(DEFAULT_SEED, "blk.0.ssm_f_a.weight");
        let f32s: Vec<u32> = (4..8).map(|i| float(key, i).to_bits()).collect();
        assert_eq!(f32s, [0xbbb0_e008, 0x3adb_8460, 0xbc91_c776, 0x399a_2e00]);
        let bits = |ty| {
            floats(ty, key, 8)[8..]
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect::<Vec<u16>>()
        };
        assert_eq!(bits(GgmlType::F16), [0x9d87, 0x16dc, 0xa48e, 0x0cd1]);
        assert_eq!(bits(GgmlType::BF16), [0xbbb1, 0x3adc, 0xbc92, 0x399a]);
        let all = floats(GgmlType::F32, key, 100_000);
        let v: Vec<f64> = all
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        assert!(
            mean.abs() < 5e-4 && (sd - 0.018).abs() < 5e-4,
            "{mean} {sd}"
        );
        assert!(v.iter().all(|x| (-1.0 / 32.0..1.0 / 32.0).contains(x)));
    }
}
