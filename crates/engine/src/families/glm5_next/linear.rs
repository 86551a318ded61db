//! Weights of the `glm5_next` family and their products with activations.
//!
//! A [`Linear`] is an `nn.Linear` weight `[rows = out, cols = in]` applied as
//! `y = x Wᵀ` (the reference's convention, `docs/glm5_next.md` §0). Matrices stay in
//! their GGUF type in the mapped file. Two products exist:
//!
//! - [`Linear::forward`]: the model's ordinary projections. Quantized weights use
//!   `ds4_quant::matmul` (activations quantized to the weight type's `vec_dot_type`,
//!   as ggml's CPU backend does). Float weights follow the PyTorch reference rather
//!   than ggml: BF16/F16 weights round the activations to their type (the reference's
//!   bf16 model holds bf16 activations) and every float product accumulates in f32 with
//!   the crate's own kernel ([`dot_f32`]) — `ds4_quant`'s float products reproduce
//!   ggml's kernels (pairwise `vdpbf16ps` sums, tinyBLAS orders), which is no closer to
//!   PyTorch and, in the chaotic bf16 fixtures, measurably further from it.
//! - [`Linear::forward_exact`]: f32 activations times the weight's values without any
//!   rounding of the activations (the reference's float32 islands that multiply an
//!   upcast bf16 weight by f32 activations: the mHC `fn` products, §3/§10).
//!
//! Rows whose length is not a whole number of blocks (the tiny fixture models: 40, 48,
//! 16 columns) can only be float types; they use the crate's own f32 kernel
//! ([`dot_f32`]), which accumulates in f32 in 8 lanes.

use std::sync::Arc;

use ds4_gguf::{GgmlType, GgufFile, TensorInfo};
use ds4_quant::{QMatrix, QuantizedActs};
use half::{bf16, f16};
use rayon::prelude::*;

/// Where a weight's bytes live.
#[derive(Clone)]
enum Bytes {
    /// `len` bytes at absolute offset `start` of a mapped GGUF file.
    Mapped {
        file: Arc<GgufFile>,
        start: usize,
        len: usize,
    },
    /// Bytes built at load time (re-laid-out tensors), in the weight type's layout.
    Owned(Arc<Vec<u8>>),
}

/// A weight matrix `[rows, cols]` (row-major, each row `ty.row_bytes(cols)` bytes).
#[derive(Clone)]
pub struct Linear {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    bytes: Bytes,
}

/// Products with fewer multiply-adds than this stay on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 15;

impl Linear {
    /// A view of `rows` rows starting at row `row0` of tensor `info` of `file` (a whole
    /// 2-D tensor, or one expert's slice of a 3-D tensor). The caller has checked shape
    /// and type.
    pub(crate) fn mapped(
        file: &Arc<GgufFile>,
        info: &TensorInfo,
        row0: usize,
        rows: usize,
        cols: usize,
    ) -> Self {
        let rb = info.dtype.row_bytes(cols).unwrap_or(0);
        // The tensor's absolute position in the file (validated in bounds at open).
        let start = (file.data_offset() + info.offset) as usize + row0 * rb;
        Linear {
            ty: info.dtype,
            rows,
            cols,
            bytes: Bytes::Mapped {
                file: file.clone(),
                start,
                len: rows * rb,
            },
        }
    }

    /// An F32 matrix built from values (row-major `rows × cols`).
    pub(crate) fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Self {
        debug_assert_eq!(values.len(), rows * cols);
        let mut b = Vec::with_capacity(values.len() * 4);
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        Linear {
            ty: GgmlType::F32,
            rows,
            cols,
            bytes: Bytes::Owned(Arc::new(b)),
        }
    }

    /// The raw bytes of the matrix.
    pub(crate) fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { file, start, len } => &file.as_bytes()[*start..*start + *len],
            Bytes::Owned(b) => b,
        }
    }

    fn qmatrix(&self) -> QMatrix<'_> {
        QMatrix {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            data: self.data(),
        }
    }

    /// Whether this is a quantized matrix `ds4_quant` multiplies (its activations need
    /// whole 32- or 256-element blocks); float matrices use the family's own f32 kernel.
    fn quant_path(&self) -> bool {
        let act = ds4_quant::vec_dot_type(self.ty);
        let block = if act == GgmlType::Q8_K { 256 } else { 32 };
        !is_float(self.ty) && self.cols.is_multiple_of(block) && ds4_quant::is_supported(self.ty)
    }

    /// The float path of [`Linear::forward`]: activations rounded to a BF16/F16
    /// weight's type, then f32 products.
    fn forward_float(&self, x: &[f32], n: usize, out: &mut [f32]) {
        match self.ty {
            GgmlType::BF16 => {
                let r: Vec<f32> = x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
                self.forward_exact(&r, n, out)
            }
            GgmlType::F16 => {
                let r: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
                self.forward_exact(&r, n, out)
            }
            _ => self.forward_exact(x, n, out),
        }
    }

    /// All rows as f32 values (for re-layout at load time).
    pub(crate) fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        let rb = self.ty.row_bytes(self.cols).unwrap_or(0);
        let data = self.data();
        for (r, o) in out.chunks_exact_mut(self.cols).enumerate() {
            // The type and shape were validated at load; a failure leaves zeros.
            let _ = ds4_quant::dequantize_row(self.ty, &data[r * rb..(r + 1) * rb], o);
        }
        out
    }

    /// Row `r` as f32 values into `out` (an embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut Vec<f32>) {
        let rb = self.ty.row_bytes(self.cols).unwrap_or(0);
        decode_row(self.ty, &self.data()[r * rb..(r + 1) * rb], out);
    }

    /// `out[t·rows + r] = W[r] · x[t]` for `n` tokens of `x` (`n × cols`), the model's
    /// ordinary projection (see the module header for the arithmetic).
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32]) {
        debug_assert_eq!(x.len(), n * self.cols);
        debug_assert_eq!(out.len(), n * self.rows);
        if self.quant_path() {
            let acts = QuantizedActs::new(ds4_quant::vec_dot_type(self.ty), x, n, self.cols);
            ds4_quant::matmul(&self.qmatrix(), &acts, out);
        } else {
            self.forward_float(x, n, out);
        }
    }

    /// As [`Linear::forward`] with activations already quantized for this weight type
    /// (several matrices sharing one input quantize it once).
    pub fn forward_acts(&self, acts: &Acts, out: &mut [f32]) {
        if self.quant_path() {
            let q = acts.quantized(ds4_quant::vec_dot_type(self.ty));
            ds4_quant::matmul(&self.qmatrix(), &q, out);
        } else {
            self.forward_float(acts.x, acts.n, out);
        }
    }

    /// `out[t·rows + r] = W[r] · x[t]` in f32 with the activations as given (no rounding
    /// to the weight type), float weights only (quantized ones are dequantized per row).
    pub fn forward_exact(&self, x: &[f32], n: usize, out: &mut [f32]) {
        debug_assert_eq!(x.len(), n * self.cols);
        debug_assert_eq!(out.len(), n * self.rows);
        let cols = self.cols;
        let rows = self.rows;
        let data = self.data();
        let rb = self.ty.row_bytes(cols).unwrap_or(0);
        let ty = self.ty;
        // Per row: decode once, dot with every token.
        let row_job = |r: usize, w: &mut Vec<f32>, res: &mut [f32]| {
            decode_row(ty, &data[r * rb..(r + 1) * rb], w);
            for (t, o) in res.iter_mut().enumerate() {
                *o = dot_f32(w, &x[t * cols..(t + 1) * cols]);
            }
        };
        let mut tmp = vec![0f32; rows * n];
        if rows * cols * n >= PARALLEL_MIN_MACS && rayon::current_num_threads() > 1 {
            tmp.par_chunks_mut(n).enumerate().for_each_init(
                || Vec::with_capacity(cols),
                |w, (r, res)| row_job(r, w, res),
            );
        } else {
            let mut w = Vec::with_capacity(cols);
            for (r, res) in tmp.chunks_mut(n).enumerate() {
                row_job(r, &mut w, res);
            }
        }
        for t in 0..n {
            for r in 0..rows {
                out[t * rows + r] = tmp[r * n + t];
            }
        }
    }
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Decodes one row of a float or quantized type into `w` (resized).
fn decode_row(ty: GgmlType, src: &[u8], w: &mut Vec<f32>) {
    match ty {
        GgmlType::F32 => {
            w.clear();
            w.extend(
                src.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
        }
        GgmlType::BF16 => {
            w.clear();
            w.extend(
                src.chunks_exact(2)
                    .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
            );
        }
        GgmlType::F16 => {
            w.clear();
            w.extend(
                src.chunks_exact(2)
                    .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
            );
        }
        _ => {
            let n = src.len() / ty.type_size() * ty.block_size();
            w.resize(n, 0.0);
            let _ = ds4_quant::dequantize_row(ty, src, w);
        }
    }
}

/// f32 dot product accumulated in 8 lanes, then summed pairwise.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    let s4 = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (s4[0] + s4[2]) + (s4[1] + s4[3]) + tail
}

/// One input quantized lazily once per activation type, shared by several products.
pub struct Acts<'a> {
    pub x: &'a [f32],
    pub n: usize,
    pub cols: usize,
    cache: std::sync::Mutex<Vec<(GgmlType, Arc<QuantizedActs>)>>,
}

impl<'a> Acts<'a> {
    /// `n` tokens of `cols` values.
    pub fn new(x: &'a [f32], n: usize, cols: usize) -> Self {
        debug_assert_eq!(x.len(), n * cols);
        Acts {
            x,
            n,
            cols,
            cache: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn quantized(&self, ty: GgmlType) -> Arc<QuantizedActs> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, q)) = c.iter().find(|(t, _)| *t == ty) {
            return q.clone();
        }
        let q = Arc::new(QuantizedActs::new(ty, self.x, self.n, self.cols));
        c.push((ty, q.clone()));
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_sum() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot_f32(&a, &b) as f64 - exact).abs() < 1e-5);
    }

    #[test]
    fn owned_forward_is_row_dot() {
        let w = Linear::from_f32(
            3,
            5,
            &[
                1., 2., 3., 4., 5., 0., 1., 0., 1., 0., -1., -1., -1., -1., -1.,
            ],
        );
        let x = [1., 1., 1., 1., 1., 2., 0., 0., 0., 1.];
        let mut out = [0f32; 6];
        w.forward(&x, 2, &mut out);
        assert_eq!(out, [15., 2., -5., 7., 0., -3.]);
    }
}
