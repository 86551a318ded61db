//! Activations quantized once per matrix product input, in the form every kernel reads.
//!
//! ggml's CPU backend quantizes the activation rows to the weight type's
//! `vec_dot_type` before a matrix product; we reproduce its x86 quantizers exactly
//! (`quantize_row_q8_0`/`q8_1` of `arch/x86/quants.c`: ties to even, and
//! `quantize_row_q8_K_ref`), and F16/BF16 rounding for float weights. The result is
//! stored per token as separate arrays rather than ggml blocks: the int8 values, the
//! f32 block scales, and the exact sums of each 16 and 32 values (Q8_K's `bsums`; the
//! kernels also use them to undo the offsets of unsigned weight values).

use crate::GgmlType;
use crate::error::QuantError;
use crate::formats::{float, q8_0, q8_k};
use crate::fp::{f16_to_f32, f32_to_f16};
#[cfg(target_arch = "x86_64")]
use crate::kernels::{self, act_avx2};

/// Elements below which quantization stays on the calling thread.
const PARALLEL_MIN_ELEMS: usize = 1 << 15;

/// Activations (`n_tokens` rows of `cols` f32) quantized once to a weight type's
/// `vec_dot_type`, so several matrices with the same input reuse them.
#[derive(Clone, Debug)]
pub struct QuantizedActs {
    ty: GgmlType,
    n_tokens: usize,
    cols: usize,
    /// Int8 values, `n_tokens × cols` (quantized types).
    qs: Vec<i8>,
    /// Block scales as f32, `n_tokens × cols/block` (Q8_0/Q8_1: the stored f16's value).
    d: Vec<f32>,
    /// Q8_1's `s = f16(d·Σq)` as f32, `n_tokens × cols/32`.
    s: Vec<f32>,
    /// Exact sums of each 16 values, `n_tokens × cols/16`.
    sum16: Vec<i16>,
    /// Exact sums of each 32 values, `n_tokens × cols/32`.
    sum32: Vec<i32>,
    /// Float types: the activations rounded to F16/BF16 (or as given for F32).
    f: Vec<f32>,
    /// `-128·(a0 + a1 + a2 + a3)` for each 4 values, `n_tokens × cols/4`: what
    /// `vpdpbusd` over-counts when signed weights are stored as `v + 128` (and, shifted,
    /// for other offsets).
    corr4: Vec<i32>,
}

/// One token's activations, borrowed from [`QuantizedActs`].
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    pub sum16: &'a [i16],
    pub sum32: &'a [i32],
    /// `-128·Σ` of each 4 values (see the field of [`QuantizedActs`]).
    pub c4: &'a [i32],
    pub f: &'a [f32],
}

/// Elements per scale block of an activation type.
fn act_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_K => 256,
        GgmlType::Q8_0 | GgmlType::Q8_1 => 32,
        _ => 1,
    }
}

impl QuantizedActs {
    /// Quantizes `x` (`n_tokens` rows of `cols`, row-major) to `dot_ty`, which must be an
    /// activation type: F32, F16, BF16, Q8_0, Q8_1 or Q8_K (use
    /// [`crate::vec_dot_type`] of the weight type).
    ///
    /// # Panics
    /// If `dot_ty` is not an activation type, `cols` is not a multiple of its block size
    /// or `x.len() != n_tokens·cols` (programming errors; [`Self::try_new`] reports them).
    pub fn new(dot_ty: GgmlType, x: &[f32], n_tokens: usize, cols: usize) -> Self {
        match Self::try_new(dot_ty, x, n_tokens, cols) {
            Ok(a) => a,
            Err(e) => panic!("QuantizedActs::new: {e}"),
        }
    }

    /// As [`Self::new`], reporting bad arguments as errors.
    pub fn try_new(
        dot_ty: GgmlType,
        x: &[f32],
        n_tokens: usize,
        cols: usize,
    ) -> Result<Self, QuantError> {
        use GgmlType::*;
        if !matches!(dot_ty, F32 | F16 | BF16 | Q8_0 | Q8_1 | Q8_K) {
            return Err(QuantError::NotActivationType(dot_ty));
        }
        if !cols.is_multiple_of(act_block(dot_ty)) {
            return Err(QuantError::BadLength {
                ty: dot_ty,
                len: cols,
                block: act_block(dot_ty),
            });
        }
        if x.len() != n_tokens * cols {
            return Err(QuantError::ShapeMismatch {
                what: "activations",
                expected: n_tokens * cols,
                got: x.len(),
            });
        }
        let mut a = QuantizedActs {
            ty: dot_ty,
            n_tokens,
            cols,
            qs: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            sum16: Vec::new(),
            sum32: Vec::new(),
            f: Vec::new(),
            corr4: Vec::new(),
        };
        if matches!(dot_ty, F32 | F16 | BF16) {
            a.f = x.iter().map(|&v| float::round_act(dot_ty, v)).collect();
            return Ok(a);
        }
        let nsc = cols / act_block(dot_ty);
        a.qs = vec![0; n_tokens * cols];
        a.d = vec![0.0; n_tokens * nsc];
        a.s = if dot_ty == Q8_1 {
            vec![0.0; n_tokens * nsc]
        } else {
            Vec::new()
        };
        a.sum16 = vec![0; n_tokens * cols / 16];
        a.sum32 = vec![0; n_tokens * cols / 32];
        a.corr4 = vec![0; n_tokens * cols / 4];
        let out = TokenRows {
            ty: dot_ty,
            cols,
            nsc,
            qs: &mut a.qs,
            d: &mut a.d,
            s: &mut a.s,
            sum16: &mut a.sum16,
            sum32: &mut a.sum32,
            corr4: &mut a.corr4,
        };
        out.quantize(x);
        Ok(a)
    }

    /// The activation type (`vec_dot_type` of the weights these activations pair with).
    pub fn dot_type(&self) -> GgmlType {
        self.ty
    }

    /// Number of tokens (rows).
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Elements per token.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Token `t`'s activations as the kernels read them.
    #[inline]
    pub(crate) fn row(&self, t: usize) -> ActRow<'_> {
        let k = self.cols;
        let nsc = k / act_block(self.ty);
        fn sl(v: &[f32], t: usize, n: usize) -> &[f32] {
            if v.is_empty() {
                &[]
            } else {
                &v[t * n..t * n + n]
            }
        }
        ActRow {
            qs: if self.qs.is_empty() {
                &[]
            } else {
                &self.qs[t * k..t * k + k]
            },
            d: sl(&self.d, t, nsc),
            s: sl(&self.s, t, nsc),
            sum16: if self.sum16.is_empty() {
                &[]
            } else {
                &self.sum16[t * k / 16..(t + 1) * k / 16]
            },
            sum32: if self.sum32.is_empty() {
                &[]
            } else {
                &self.sum32[t * k / 32..(t + 1) * k / 32]
            },
            c4: if self.corr4.is_empty() {
                &[]
            } else {
                &self.corr4[t * k / 4..(t + 1) * k / 4]
            },
            f: if self.f.is_empty() {
                &[]
            } else {
                &self.f[t * k..t * k + k]
            },
        }
    }

    /// Token `t` in ggml's block layout (`block_q8_0`, `block_q8_1` or `block_q8_K`
    /// bytes; F16/BF16/F32 values for float types), for interoperability and tests.
    ///
    /// # Panics
    /// If `t >= n_tokens`.
    pub fn ggml_row(&self, t: usize) -> Vec<u8> {
        assert!(
            t < self.n_tokens,
            "token {t} out of range ({} tokens)",
            self.n_tokens
        );
        let r = self.row(t);
        let mut out = Vec::new();
        match self.ty {
            GgmlType::Q8_0 | GgmlType::Q8_1 => {
                for (b, qs) in r.qs.chunks_exact(32).enumerate() {
                    out.extend_from_slice(&f32_to_f16(r.d[b]).to_le_bytes());
                    if self.ty == GgmlType::Q8_1 {
                        out.extend_from_slice(&f32_to_f16(r.s[b]).to_le_bytes());
                    }
                    out.extend(qs.iter().map(|&q| q as u8));
                }
            }
            GgmlType::Q8_K => {
                for (b, qs) in r.qs.chunks_exact(256).enumerate() {
                    out.extend_from_slice(&r.d[b].to_le_bytes());
                    out.extend(qs.iter().map(|&q| q as u8));
                    for s in &r.sum16[16 * b..16 * b + 16] {
                        out.extend_from_slice(&s.to_le_bytes());
                    }
                }
            }
            _ => {
                let mut bytes = vec![0u8; self.cols * self.ty.type_size()];
                float::quantize(self.ty, r.f, &mut bytes);
                out = bytes;
            }
        }
        out
    }
}

/// Output arrays for a contiguous range of tokens.
struct TokenRows<'a> {
    ty: GgmlType,
    cols: usize,
    nsc: usize,
    qs: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    sum16: &'a mut [i16],
    sum32: &'a mut [i32],
    corr4: &'a mut [i32],
}

impl TokenRows<'_> {
    /// Quantizes the tokens of `x` (one per `cols`), splitting large ranges across the
    /// rayon pool.
    fn quantize(mut self, x: &[f32]) {
        let n = x.len() / self.cols;
        if x.len() < PARALLEL_MIN_ELEMS || n < 2 {
            for t in 0..n {
                self.quantize_token(t, &x[t * self.cols..(t + 1) * self.cols]);
            }
            return;
        }
        let mid = n / 2;
        let (ty, cols, nsc) = (self.ty, self.cols, self.nsc);
        let (qs0, qs1) = self.qs.split_at_mut(mid * cols);
        let (d0, d1) = self.d.split_at_mut(mid * nsc);
        let (s0, s1) = self
            .s
            .split_at_mut(if self.s.is_empty() { 0 } else { mid * nsc });
        let (a0, a1) = self.sum16.split_at_mut(mid * cols / 16);
        let (b0, b1) = self.sum32.split_at_mut(mid * cols / 32);
        let (c0, c1) = self.corr4.split_at_mut(mid * cols / 4);
        let left = TokenRows {
            ty,
            cols,
            nsc,
            qs: qs0,
            d: d0,
            s: s0,
            sum16: a0,
            sum32: b0,
            corr4: c0,
        };
        let right = TokenRows {
            ty,
            cols,
            nsc,
            qs: qs1,
            d: d1,
            s: s1,
            sum16: a1,
            sum32: b1,
            corr4: c1,
        };
        let (x0, x1) = x.split_at(mid * cols);
        rayon::join(|| left.quantize(x0), || right.quantize(x1));
    }

    /// Quantizes token `t` of this range.
    fn quantize_token(&mut self, t: usize, x: &[f32]) {
        let (ty, cols, nsc) = (self.ty, self.cols, self.nsc);
        let qs = &mut self.qs[t * cols..(t + 1) * cols];
        let d = &mut self.d[t * nsc..(t + 1) * nsc];
        let s: &mut [f32] = if self.s.is_empty() {
            &mut []
        } else {
            &mut self.s[t * nsc..(t + 1) * nsc]
        };
        let s16 = &mut self.sum16[t * cols / 16..(t + 1) * cols / 16];
        let s32 = &mut self.sum32[t * cols / 32..(t + 1) * cols / 32];
        let c4 = &mut self.corr4[t * cols / 4..(t + 1) * cols / 4];
        #[cfg(target_arch = "x86_64")]
        if kernels::isa() >= kernels::Isa::Avx2 {
            // SAFETY: AVX2, FMA and F16C were detected on this CPU.
            unsafe {
                match ty {
                    GgmlType::Q8_K => act_avx2::q8_k_row(x, qs, d, s16, s32),
                    _ => act_avx2::q8_0_row(x, qs, d, s, s16, s32),
                }
            }
            corr4(qs, c4);
            return;
        }
        match ty {
            GgmlType::Q8_K => {
                for (b, (xb, qb)) in x
                    .chunks_exact(256)
                    .zip(qs.chunks_exact_mut(256))
                    .enumerate()
                {
                    d[b] = q8_k::quantize_act(xb, qb);
                }
            }
            _ => {
                for (b, (xb, qb)) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)).enumerate() {
                    let (dh, sum, d_exact) = q8_0::quantize_act(xb, qb);
                    d[b] = f16_to_f32(dh);
                    if !s.is_empty() {
                        // ggml: y.s = FP32_TO_FP16(d · Σq) with the unrounded d.
                        s[b] = f16_to_f32(f32_to_f16(d_exact * sum as f32));
                    }
                }
            }
        }
        for (o, q) in s16.iter_mut().zip(qs.chunks_exact(16)) {
            *o = q.iter().map(|&v| v as i16).sum();
        }
        for (o, q) in s32.iter_mut().zip(qs.chunks_exact(32)) {
            *o = q.iter().map(|&v| v as i32).sum();
        }
        corr4(qs, c4);
    }
}

/// `-128·Σ` of each 4 values of `qs`, into `c4`.
fn corr4(qs: &[i8], c4: &mut [i32]) {
    for (o, q) in c4.iter_mut().zip(qs.chunks_exact(4)) {
        *o = -128 * (q[0] as i32 + q[1] as i32 + q[2] as i32 + q[3] as i32);
    }
}
