//! The CPU backend: quantized matrix products from `ds4-quant` (activations quantized
//! per block, as ggml's CPU backend does) and the elementwise operations written to
//! follow ggml's CPU arithmetic (`ggml-cpu/ops.cpp`): RMSNorm sums squares in f64,
//! RoPE angles advance by repeated f32 multiplication (rotations fused as GCC fuses
//! ggml's), softmax sums in f64, and the KV
//! cache is stored in f16 with the query and the attention weights rounded to f16
//! before their products, as llama.cpp does with its default f16 cache (flash
//! attention off). Work is spread over rayon's pool.

use std::sync::Arc;

use ds4_gguf::{GgufFile, TensorInfo};
use ds4_quant::{QMatrix, QuantizedActs};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

pub mod attention;
mod ggml_math;

use super::{AttnShape, Backend, Rope};
use crate::{EngineError, Result};

/// The CPU backend, with its own rayon pool.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
}

impl CpuBackend {
    /// A backend computing on `threads` threads.
    pub fn new(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("ds4-cpu-{i}"))
            .build()
            .map_err(|e| EngineError::Backend(format!("starting {threads} CPU threads: {e}")))?;
        Ok(CpuBackend { pool })
    }

    /// Threads of the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

/// A weight on the CPU: quantized matrices stay in the mapped file; vectors (norm
/// weights, biases) are decoded to f32 once.
pub enum CpuWeight {
    /// A matrix of `rows × cols` in its file type, read in place from the mapped file.
    Matrix {
        file: Arc<GgufFile>,
        info: TensorInfo,
        rows: usize,
        cols: usize,
    },
    /// A vector decoded to f32.
    Vector(Vec<f32>),
}

impl CpuWeight {
    fn matrix(&self) -> QMatrix<'_> {
        match self {
            CpuWeight::Matrix {
                file,
                info,
                rows,
                cols,
            } => QMatrix {
                ty: info.dtype,
                rows: *rows,
                cols: *cols,
                data: file.tensor_data(info),
            },
            CpuWeight::Vector(_) => unreachable!("a vector weight used as a matrix"),
        }
    }

    fn vector(&self) -> &[f32] {
        match self {
            CpuWeight::Vector(v) => v,
            CpuWeight::Matrix { .. } => unreachable!("a matrix weight used as a vector"),
        }
    }
}

/// One sequence's KV cache: per layer, `n_ctx × kv_dim` f16 values for K and for V.
#[derive(Clone)]
pub struct CpuKv {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    kv_dim: usize,
}

/// One step's inputs on the CPU.
pub struct CpuStep {
    tokens: Vec<u32>,
    pos0: usize,
}

impl Backend for CpuBackend {
    type Weight = CpuWeight;
    type Buf = Vec<f32>;
    type Kv = CpuKv;
    type Step = CpuStep;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn weight(&self, file: &Arc<GgufFile>, info: &TensorInfo) -> Result<CpuWeight> {
        let unsupported = || EngineError::UnsupportedTensorType {
            name: info.name.clone(),
            ty: info.dtype,
        };
        if !ds4_quant::is_supported(info.dtype) {
            return Err(unsupported());
        }
        let cols = info.dims[0] as usize;
        let rows = (info.n_elements() / info.dims[0].max(1)) as usize;
        if rows == 1 || info.dims.len() == 1 {
            let mut v = vec![0.0f32; cols];
            ds4_quant::dequantize_row(info.dtype, file.tensor_data(info), &mut v)
                .map_err(|_| unsupported())?;
            return Ok(CpuWeight::Vector(v));
        }
        Ok(CpuWeight::Matrix {
            file: file.clone(),
            info: info.clone(),
            rows,
            cols,
        })
    }

    fn buf(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn kv(&self, n_layer: usize, n_ctx: usize, kv_dim: usize) -> CpuKv {
        CpuKv {
            k: (0..n_layer)
                .map(|_| vec![f16::ZERO; n_ctx * kv_dim])
                .collect(),
            v: (0..n_layer)
                .map(|_| vec![f16::ZERO; n_ctx * kv_dim])
                .collect(),
            kv_dim,
        }
    }

    fn kv_snapshot(&self, kv: &CpuKv, len: usize) -> CpuKv {
        let n = len * kv.kv_dim;
        let copy = |layers: &Vec<Vec<f16>>| {
            layers
                .iter()
                .map(|l| {
                    let mut c = vec![f16::ZERO; l.len()];
                    c[..n].copy_from_slice(&l[..n]);
                    c
                })
                .collect()
        };
        CpuKv {
            k: copy(&kv.k),
            v: copy(&kv.v),
            kv_dim: kv.kv_dim,
        }
    }

    fn step(&self, tokens: &[u32], pos0: usize) -> CpuStep {
        CpuStep {
            tokens: tokens.to_vec(),
            pos0,
        }
    }

    fn embed(&self, step: &CpuStep, table: &CpuWeight, out: &mut Vec<f32>) {
        let m = table.matrix();
        let row_bytes = m.ty.row_bytes(m.cols).expect("validated at load");
        for (i, &t) in step.tokens.iter().enumerate() {
            let src = &m.data[t as usize * row_bytes..][..row_bytes];
            ds4_quant::dequantize_row(m.ty, src, &mut out[i * m.cols..][..m.cols])
                .expect("validated at load");
        }
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &CpuWeight, eps: f32, rows: usize, out: &mut Vec<f32>) {
        let w = w.vector();
        let n = w.len();
        let work = |(xr, yr): (&[f32], &mut [f32])| {
            let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
            let mean = (sum / n as f64) as f32;
            let scale = 1.0f32 / (mean + eps).sqrt();
            for ((y, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
                *y = (v * scale) * g;
            }
        };
        let (x, out) = (&x[..rows * n], &mut out[..rows * n]);
        if rows >= 16 {
            x.par_chunks(n).zip(out.par_chunks_mut(n)).for_each(work);
        } else {
            x.chunks(n).zip(out.chunks_mut(n)).for_each(work);
        }
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        x: &Vec<f32>,
        rows: usize,
        out: &mut Vec<f32>,
    ) {
        let m = w.matrix();
        let acts = QuantizedActs::new(
            ds4_quant::vec_dot_type(m.ty),
            &x[..rows * m.cols],
            rows,
            m.cols,
        );
        ds4_quant::matmul(&m, &acts, &mut out[..rows * m.rows]);
        if let Some(b) = bias {
            let b = b.vector();
            for row in out[..rows * m.rows].chunks_mut(m.rows) {
                for (o, &bv) in row.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
    }

    fn rope(&self, step: &CpuStep, rope: &Rope, n_head: usize, head_dim: usize, x: &mut Vec<f32>) {
        let row_len = n_head * head_dim;
        let theta_scale = rope.freq_base.powf(-2.0 / rope.n_dims as f32);
        let half = rope.n_dims / 2;
        for (i, row) in x[..step.tokens.len() * row_len]
            .chunks_mut(row_len)
            .enumerate()
        {
            // cos/sin per pair, as ggml's rope cache: theta advances by f32 products.
            let mut cs = Vec::with_capacity(half);
            let mut theta = (step.pos0 + i) as f32;
            for _ in 0..half {
                cs.push((theta.cos(), theta.sin()));
                theta *= theta_scale;
            }
            for head in row.chunks_mut(head_dim) {
                for (j, &(c, s)) in cs.iter().enumerate() {
                    let (a, b) = if rope.neox {
                        (j, j + half)
                    } else {
                        (2 * j, 2 * j + 1)
                    };
                    let (x0, x1) = (head[a], head[b]);
                    // ggml's `x0*cos - x1*sin` as GCC fuses it (one fma each).
                    head[a] = x0.mul_add(c, -(x1 * s));
                    head[b] = x0.mul_add(s, x1 * c);
                }
            }
        }
    }

    fn attention(
        &self,
        step: &CpuStep,
        kv: &mut CpuKv,
        layer: usize,
        shape: &AttnShape,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        out: &mut Vec<f32>,
    ) {
        let kv_dim = kv.kv_dim;
        let n_tok = step.tokens.len();
        let p0 = step.pos0;
        let (kc, vc) = (&mut kv.k[layer], &mut kv.v[layer]);
        kc[p0 * kv_dim..(p0 + n_tok) * kv_dim].convert_from_f32_slice(&k[..n_tok * kv_dim]);
        vc[p0 * kv_dim..(p0 + n_tok) * kv_dim].convert_from_f32_slice(&v[..n_tok * kv_dim]);
        attention::attention(shape, p0, n_tok, q, kc, vc, kv_dim, out);
    }

    fn swiglu(&self, gate: &Vec<f32>, up: &Vec<f32>, len: usize, out: &mut Vec<f32>) {
        ggml_math::swiglu(&gate[..len], &up[..len], &mut out[..len]);
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        for (a, &b) in x[..len].iter_mut().zip(&y[..len]) {
            *a += b;
        }
    }

    fn copy(&self, src: &Vec<f32>, src_off: usize, dst: &mut Vec<f32>, dst_off: usize, len: usize) {
        dst[dst_off..dst_off + len].copy_from_slice(&src[src_off..src_off + len]);
    }

    fn read(&self, buf: &Vec<f32>, off: usize, len: usize, out: &mut Vec<f32>) {
        out.extend_from_slice(&buf[off..off + len]);
    }
}
