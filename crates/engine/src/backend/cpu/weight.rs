//! Weights on the CPU and their products with activations.
//!
//! A [`CpuWeight`] is a tensor in its GGUF type, read in place from the mapped file
//! (or built at load time): `n` stacked matrices of `rows × cols` (a 1-D tensor is one
//! row). Small float tensors and vectors are also decoded to f32 once.
//!
//! Two products ([`matmul`]), picked by the family's [`Prec`]:
//!
//! - ggml's (`Prec::Ggml`, and every other quantized weight): `ds4_quant` quantizes the
//!   activations to the weight type's `vec_dot_type` per block and runs ggml's kernels
//!   (for float weights too), every token along the kernel ggml uses for a one-token
//!   product ([`ds4_quant::try_matmul_per_token`]): a token's result does not depend on
//!   how the prompt was split into steps (ggml's batched kernels round differently for
//!   repacked and float weights).
//! - the PyTorch reference's (`Prec::F32`/`Bf16`, float weights and MXFP4, whose
//!   values are the checkpoint's FP4 values exactly): each weight row
//!   decoded to f32 and dotted with the activations as given, accumulated in f32 by
//!   [`dot_f32`]. (ggml's float kernels sum pairwise in `vdpbf16ps` and tinyBLAS
//!   orders, which is no closer to PyTorch and, in the chaotic bf16 fixtures,
//!   measurably further from it.)

use std::sync::Arc;

use ds4_gguf::{GgmlType, GgufFile, TensorInfo};
use ds4_quant::{QMatrix, QuantizedActs};
use half::{bf16, f16};
use rayon::prelude::*;

use crate::backend::Prec;
use crate::{EngineError, Result};

/// Float tensors with at most this many elements are also kept decoded to f32.
const DECODE_MAX: usize = 1 << 20;
/// Products with fewer multiply-adds than this stay on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 15;

/// Where a weight's bytes live.
#[derive(Clone)]
enum Bytes {
    /// `len` bytes at absolute offset `start` of a mapped GGUF file.
    Mapped {
        file: Arc<GgufFile>,
        start: usize,
        len: usize,
    },
    /// Bytes built at load time, in the weight type's layout.
    Owned(Arc<Vec<u8>>),
}

/// A weight on the CPU (see the module header).
#[derive(Clone)]
pub struct CpuWeight {
    pub(crate) name: String,
    pub(crate) ty: GgmlType,
    /// Elements per row.
    pub(crate) cols: usize,
    /// Rows per matrix.
    pub(crate) rows: usize,
    /// Stacked matrices.
    pub(crate) n: usize,
    bytes: Bytes,
    values: Option<Arc<Vec<f32>>>,
}

fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

impl CpuWeight {
    /// Tensor `info` of `file`. Types `ds4_quant` cannot decode are an error naming the
    /// tensor; I32 tensors (id tables) are kept as values.
    pub fn from_file(file: &Arc<GgufFile>, info: &TensorInfo) -> Result<Self> {
        let unsupported = || EngineError::UnsupportedTensorType {
            name: info.name.clone(),
            ty: info.dtype,
        };
        if info.dtype != GgmlType::I32 && !ds4_quant::is_supported(info.dtype) {
            return Err(unsupported());
        }
        let dims: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
        let cols = dims.first().copied().unwrap_or(1);
        let rows = dims.get(1).copied().unwrap_or(1);
        let n = dims.iter().skip(2).product::<usize>().max(1);
        let bytes = Bytes::Mapped {
            file: file.clone(),
            start: (file.data_offset() + info.offset) as usize,
            len: info.n_bytes() as usize,
        };
        let mut w = CpuWeight {
            name: info.name.clone(),
            ty: info.dtype,
            cols,
            rows,
            n,
            bytes,
            values: None,
        };
        let elems = cols * rows * n;
        let small_float = is_float(info.dtype) && elems <= DECODE_MAX;
        if small_float || rows * n == 1 || info.dtype == GgmlType::I32 {
            w.values = Some(Arc::new(w.decode_all().map_err(|_| unsupported())?));
        }
        Ok(w)
    }

    /// An F32 weight of ggml dims `dims` from `values`.
    pub fn from_f32(name: &str, dims: &[usize], values: &[f32]) -> Result<Self> {
        let cols = dims.first().copied().unwrap_or(1);
        let rows = dims.get(1).copied().unwrap_or(1);
        let n = dims.iter().skip(2).product::<usize>().max(1);
        if cols * rows * n != values.len() {
            return Err(EngineError::Backend(format!(
                "weight '{name}': {} values for dims {dims:?}",
                values.len()
            )));
        }
        let mut b = Vec::with_capacity(values.len() * 4);
        for v in values {
            b.extend_from_slice(&v.to_le_bytes());
        }
        Ok(CpuWeight {
            name: name.to_string(),
            ty: GgmlType::F32,
            cols,
            rows,
            n,
            bytes: Bytes::Owned(Arc::new(b)),
            values: (values.len() <= DECODE_MAX).then(|| Arc::new(values.to_vec())),
        })
    }

    /// The raw bytes.
    pub(crate) fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { file, start, len } => &file.as_bytes()[*start..*start + *len],
            Bytes::Owned(b) => b,
        }
    }

    fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols).unwrap_or(0)
    }

    /// Elements in all.
    pub(crate) fn len(&self) -> usize {
        self.cols * self.rows * self.n
    }

    /// The f32 values of a small tensor (vectors, conv kernels, id tables).
    pub(crate) fn values(&self) -> Result<&[f32]> {
        self.values.as_deref().map(|v| &v[..]).ok_or_else(|| {
            EngineError::Backend(format!(
                "tensor '{}' ({} × {} × {} {}) is used as a small vector",
                self.name, self.cols, self.rows, self.n, self.ty
            ))
        })
    }

    /// Checks that the tensor holds `len` elements (for vectors used by an operation).
    pub(crate) fn expect_len(&self, len: usize, what: &str) -> Result<&[f32]> {
        let v = self.values()?;
        if v.len() != len {
            return Err(EngineError::Backend(format!(
                "{what}: tensor '{}' has {} values, expected {len}",
                self.name,
                v.len()
            )));
        }
        Ok(v)
    }

    fn decode_all(&self) -> std::result::Result<Vec<f32>, ds4_quant::QuantError> {
        if self.ty == GgmlType::I32 {
            return Ok(self
                .data()
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
                .collect());
        }
        let mut out = vec![0f32; self.len()];
        let rb = self.row_bytes();
        let data = self.data();
        for (r, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            ds4_quant::dequantize_row(self.ty, &data[r * rb..(r + 1) * rb], o)?;
        }
        Ok(out)
    }

    /// Matrix `e` of a stack as a view (the whole tensor for `e = 0` of a 2-D one).
    pub(crate) fn matrix(&self, e: usize) -> Mat<'_> {
        let rb = self.row_bytes();
        let size = self.rows * rb;
        Mat {
            w: self,
            data: &self.data()[e * size..(e + 1) * size],
            rows: self.rows,
        }
    }

    /// Row `r` of the whole tensor as f32 values into `out` (an embedding lookup).
    pub(crate) fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        let rb = self.row_bytes();
        let data = self.data();
        if (r + 1) * rb > data.len() {
            return Err(EngineError::Backend(format!(
                "row {r} of tensor '{}' is out of range",
                self.name
            )));
        }
        decode_row(self.ty, &data[r * rb..(r + 1) * rb], out);
        Ok(())
    }
}

/// One matrix of a weight: `rows × w.cols` in `w.ty`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    w: &'a CpuWeight,
    data: &'a [u8],
    rows: usize,
}

impl Mat<'_> {
    fn qmatrix(&self) -> Result<QMatrix<'_>> {
        QMatrix::new(self.w.ty, self.rows, self.w.cols, self.data)
            .map_err(|e| EngineError::Backend(format!("tensor '{}' as a matrix: {e}", self.w.name)))
    }

    /// Whether the reference arithmetic multiplies this matrix as floats: float types,
    /// and MXFP4, which holds a checkpoint's FP4 values exactly (DeepSeek-V4's routed
    /// experts), so the reference's product of those values is a float product.
    fn float_path(&self, p: Prec) -> bool {
        p != Prec::Ggml && (is_float(self.w.ty) || self.w.ty == GgmlType::MXFP4)
    }

    /// `out[t·rows + r] = W[r] · x[t]` for `n` rows of `x` (see the module header),
    /// rounded by `p`.
    pub(crate) fn forward(&self, x: &[f32], n: usize, p: Prec, out: &mut [f32]) -> Result<()> {
        let cols = self.w.cols;
        if x.len() < n * cols || out.len() < n * self.rows {
            return Err(EngineError::Backend(format!(
                "product with '{}': {} inputs for {n} × {cols}, {} outputs for {n} × {}",
                self.w.name,
                x.len(),
                out.len(),
                self.rows
            )));
        }
        let (x, out) = (&x[..n * cols], &mut out[..n * self.rows]);
        if self.float_path(p) {
            self.forward_f32(x, n, out);
        } else {
            let acts = QuantizedActs::try_new(ds4_quant::vec_dot_type(self.w.ty), x, n, cols)
                .map_err(|e| EngineError::Backend(format!("'{}': {e}", self.w.name)))?;
            ds4_quant::try_matmul_per_token(&self.qmatrix()?, &acts, out)
                .map_err(|e| EngineError::Backend(format!("'{}': {e}", self.w.name)))?;
        }
        p.round_all(out);
        Ok(())
    }

    /// As [`Mat::forward`] with the activations already quantized (several matrices
    /// sharing one input quantize it once; float paths use `acts.x`).
    pub(crate) fn forward_acts(&self, acts: &Acts, p: Prec, out: &mut [f32]) -> Result<()> {
        if self.float_path(p) {
            return self.forward(acts.x, acts.n, p, out);
        }
        let q = acts.quantized(ds4_quant::vec_dot_type(self.w.ty))?;
        let out = &mut out[..acts.n * self.rows];
        ds4_quant::try_matmul_per_token(&self.qmatrix()?, &q, out)
            .map_err(|e| EngineError::Backend(format!("'{}': {e}", self.w.name)))?;
        p.round_all(out);
        Ok(())
    }

    /// `F.linear(x.float(), w.float())`: f32 products of the activations as given with
    /// the upcast weight rows, whatever the weight type (the reference's f32 islands).
    pub(crate) fn forward_upcast(&self, x: &[f32], n: usize, out: &mut [f32]) {
        self.forward_f32(&x[..n * self.w.cols], n, &mut out[..n * self.rows]);
    }

    /// f32 products with the upcast weight rows: per row, decode once, dot with every
    /// token.
    fn forward_f32(&self, x: &[f32], n: usize, out: &mut [f32]) {
        let (cols, rows, ty) = (self.w.cols, self.rows, self.w.ty);
        let rb = self.w.row_bytes();
        let data = self.data;
        let row_job = |r: usize, w: &mut Vec<f32>, res: &mut [f32]| {
            w.resize(cols, 0.0);
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

    /// All values as f32 (expanding a small matrix for the bf16 reference path).
    pub(crate) fn to_f32(self) -> Vec<f32> {
        let cols = self.w.cols;
        let rb = self.w.row_bytes();
        let mut out = vec![0f32; self.rows * cols];
        for (r, o) in out.chunks_exact_mut(cols).enumerate() {
            decode_row(self.w.ty, &self.data[r * rb..(r + 1) * rb], o);
        }
        out
    }
}

/// Decodes one row of a float or quantized type into `w` (of the row's length).
fn decode_row(ty: GgmlType, src: &[u8], w: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, b) in w.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::BF16 => {
            for (o, b) in w.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        GgmlType::F16 => {
            for (o, b) in w.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        // Types and lengths are checked at load; a failure would leave the row as is.
        _ => {
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
pub(crate) struct Acts<'a> {
    pub x: &'a [f32],
    pub n: usize,
    pub cols: usize,
    cache: std::sync::Mutex<Vec<(GgmlType, Arc<QuantizedActs>)>>,
}

impl<'a> Acts<'a> {
    /// `n` tokens of `cols` values.
    pub fn new(x: &'a [f32], n: usize, cols: usize) -> Self {
        Acts {
            x: &x[..n * cols],
            n,
            cols,
            cache: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn quantized(&self, ty: GgmlType) -> Result<Arc<QuantizedActs>> {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, q)) = c.iter().find(|(t, _)| *t == ty) {
            return Ok(q.clone());
        }
        let q = Arc::new(
            QuantizedActs::try_new(ty, self.x, self.n, self.cols)
                .map_err(|e| EngineError::Backend(format!("quantizing activations: {e}")))?,
        );
        c.push((ty, q.clone()));
        Ok(q)
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
        let w = CpuWeight::from_f32(
            "w",
            &[5, 3],
            &[
                1., 2., 3., 4., 5., 0., 1., 0., 1., 0., -1., -1., -1., -1., -1.,
            ],
        )
        .unwrap();
        let x = [1., 1., 1., 1., 1., 2., 0., 0., 0., 1.];
        let mut out = [0f32; 6];
        w.matrix(0).forward(&x, 2, Prec::F32, &mut out).unwrap();
        assert_eq!(out, [15., 2., -5., 7., 0., -3.]);
    }
}
