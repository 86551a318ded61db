//! Every kernel against the scalar reference of `order`, bit for bit: row kernels
//! (scalar, AVX2, AVX-512) and panel kernels (AVX2, AVX-512), for every weight type,
//! every path ggml can take for it, random shapes and token counts.

use proptest::prelude::*;

use super::out::Out;
use super::panel::Panel;
use super::*;
use crate::formats;
use crate::fp::f32_to_f16;
use crate::{QMatrix, QuantizedActs, vec_dot_type};

/// Weight types with matrix kernels.
pub(crate) const WEIGHT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::MXFP4,
];

/// xorshift64* — a tiny deterministic generator for test data.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Roughly normal (sum of uniforms), times `scale`.
    pub(crate) fn normal(&mut self, scale: f32) -> f32 {
        let s: f32 = (0..4)
            .map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32)
            .sum();
        (s - 2.0) * 1.7 * scale
    }
}

/// f16 scale fields of each block type: (offset, may be negative).
fn scale_fields(ty: GgmlType) -> &'static [(usize, bool)] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ2_XXS => &[(0, true)],
        Q4_1 | Q5_1 => &[(0, true), (2, true)],
        Q2_K => &[(80, false), (82, false)],
        Q3_K => &[(108, true)],
        Q4_K | Q5_K => &[(0, false), (2, false)],
        Q6_K => &[(208, true)],
        _ => &[],
    }
}

/// A weight matrix: half the rows quantized from random data, half random bytes with
/// sane scales (every bit pattern of the payload is valid).
pub(crate) fn random_matrix(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut data = vec![0u8; rows * rb];
    for (r, row) in data.chunks_exact_mut(rb).enumerate() {
        if r % 2 == 0 || scale_fields(ty).is_empty() {
            let x: Vec<f32> = (0..cols).map(|_| rng.normal(0.5)).collect();
            formats::quantize(ty, &x, row);
        } else {
            for b in row.iter_mut() {
                *b = rng.next() as u8;
            }
            for blk in row.chunks_exact_mut(ty.type_size()) {
                for &(off, neg) in scale_fields(ty) {
                    let mut v = rng.normal(0.05);
                    if !neg {
                        v = v.abs();
                    }
                    blk[off..off + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
                }
            }
        }
    }
    data
}

/// All results of one kernel, token-major.
fn run_with(rows: usize, n_tokens: usize, f: impl Fn(&Out)) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows * n_tokens];
    let o = Out::new(&mut out, rows, 0);
    f(&o);
    out
}

fn assert_same(what: &str, ty: GgmlType, got: &[f32], want: &[f32]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what} {ty}: element {i}: {g} vs reference {w}"
        );
    }
}

/// The paths ggml can take for weights of `ty` with `rows × cols` (see `order::path`).
fn paths(ty: GgmlType, cols: usize) -> Vec<Path> {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => {
            let mut p = vec![Path::VecDot];
            if cols.is_multiple_of(formats::float::tinyblas_step(ty)) {
                p.push(Path::TinyBlas);
            }
            p
        }
        Q4_0 | Q4_K | Q2_K | MXFP4 => {
            let mut p = vec![Path::VecDot, Path::RepackGemv, Path::RepackGemm];
            if !matches!(ty, Q4_0 | MXFP4) {
                p.push(Path::Tiled);
            }
            p
        }
        Q3_K | Q5_K | Q6_K | IQ2_XXS => vec![Path::VecDot, Path::Tiled],
        _ => vec![Path::VecDot],
    }
}

/// Every kernel (row kernels, panel kernels, each instruction set) against the scalar
/// reference of `order`, for every path of the type.
fn check_all_kernels(ty: GgmlType, rows: usize, cols: usize, n_tokens: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let data = random_matrix(ty, rows, cols, &mut rng);
    let w = QMatrix {
        ty,
        rows,
        cols,
        data: &data,
    };
    let xs: Vec<f32> = (0..cols * n_tokens).map(|_| rng.normal(1.0)).collect();
    let x = QuantizedActs::new(vec_dot_type(ty), &xs, n_tokens, cols);
    let mut isas = vec![Isa::Scalar];
    if isa() >= Isa::Avx2 {
        isas.push(Isa::Avx2);
    }
    if isa() >= Isa::Avx512 {
        isas.push(Isa::Avx512);
    }
    for path in paths(ty, cols) {
        let reference = run_with(rows, n_tokens, |o| {
            gemv_scalar(&w, &x, 0..rows, 0..n_tokens, path, o)
        });
        for &i in &isas {
            let what = format!("{path:?} row kernel {i:?}");
            let got = run_with(rows, n_tokens, |o| {
                gemv(i, &w, &x, 0..rows, 0..n_tokens, path, o)
            });
            if matches!(path, Path::VecDot | Path::RepackGemv | Path::TinyBlas) {
                assert_same(&what, ty, &got, &reference);
            }
            if has_panel(i, ty, path) {
                let got = run_with(rows, n_tokens, |o| {
                    let pr = panel_rows(i);
                    let mut p = Panel::new(ty, pr);
                    for r0 in (0..rows).step_by(pr) {
                        gemm(
                            i,
                            &w,
                            &x,
                            r0,
                            pr.min(rows - r0),
                            0..n_tokens,
                            path,
                            &mut p,
                            o,
                        );
                    }
                });
                assert_same(
                    &format!("{path:?} panel kernel {i:?}"),
                    ty,
                    &got,
                    &reference,
                );
            }
        }
    }
}

#[test]
fn simd_panel_fill_equals_portable_fill() {
    if isa() < Isa::Avx2 {
        return;
    }
    for ty in WEIGHT_TYPES
        .into_iter()
        .filter(|&t| formats::layout(t).is_some())
    {
        let mut rng = Rng(99);
        let (rows, cols) = (13, 512);
        let data = random_matrix(ty, rows, cols, &mut rng);
        let w = QMatrix {
            ty,
            rows,
            cols,
            data: &data,
        };
        for pr in [8, 16] {
            let mut a = Panel::new(ty, pr);
            let mut b = Panel::new(ty, pr);
            a.fill(&w, 3, 10.min(pr));
            fill_panel(Isa::Avx2, &mut b, &w, 3, 10.min(pr));
            assert_eq!(a.vals, b.vals, "{ty} values");
            assert_eq!((&a.sub, &a.min), (&b.sub, &b.min), "{ty} sub-block scales");
            assert_eq!((&a.d, &a.aux), (&b.d, &b.aux), "{ty} scales");
        }
    }
}

#[test]
fn every_kernel_matches_the_reference_on_fixed_shapes() {
    for ty in WEIGHT_TYPES {
        let cols = if ty.block_size() == 256 { 512 } else { 96 };
        for n_tokens in [1, 2, 3, 4, 9] {
            check_all_kernels(ty, 19, cols, n_tokens, 7 + n_tokens as u64);
        }
    }
}

#[test]
fn float_kernels_match_the_reference_with_ragged_lengths() {
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for cols in [1, 7, 16, 37, 100] {
            for n_tokens in [1, 3, 6] {
                check_all_kernels(ty, 9, cols, n_tokens, cols as u64 * 31 + n_tokens as u64);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_kernel_matches_the_reference(
        ty_i in 0..WEIGHT_TYPES.len(),
        rows in 1usize..40,
        blocks in 1usize..5,
        n_tokens in 1usize..12,
        seed in any::<u64>(),
    ) {
        let ty = WEIGHT_TYPES[ty_i];
        let cols = blocks * ty.block_size().max(32);
        check_all_kernels(ty, rows, cols, n_tokens, seed);
    }
}
