//! The CPU backend: the exact reference path.
//!
//! - Dense families (`Prec::Ggml`): quantized matrix products from `ds4-quant`
//!   (activations quantized per block, as ggml's CPU backend does) and elementwise
//!   operations in ggml's CPU arithmetic (`ggml-cpu/ops.cpp`): RMSNorm sums squares in
//!   f64, RoPE angles advance by repeated f32 multiplication, softmax sums in f64, and
//!   the KV cache is stored in f16 with the query and the attention weights rounded to
//!   f16 before their products, as llama.cpp does with its default f16 cache (flash
//!   attention off).
//! - MoE families (`Prec::F32`/`Bf16`): the PyTorch reference's arithmetic, operation
//!   by operation (one module per operation family).
//!
//! Work is spread over the backend's own rayon pool, whose threads spin through a
//! step ([`Spinners`]).

use std::ops::Range;
use std::sync::Arc;

use ds4_gguf::{GgufFile, TensorInfo};
use half::f16;
use half::slice::HalfFloatSliceExt;

pub mod attention;
mod delta;
mod dsa;
mod ggml_math;
mod mhc;
mod mla;
mod moe;
mod rope;
mod sink;
mod torch_math;
mod weight;

pub use weight::CpuWeight;

use super::{
    AttnShape, Backend, Buffers, CompressShape, DeltaForm, DeltaIn, DeltaJournal, DeltaReplay,
    DeltaShape, DeltaState, DeltaWeights, Experts, HcShape, HcWeights, MlaShape, Prec, Rope,
    Routing, SelectShape, SinkAttnShape,
};
use crate::{EngineError, Result};

/// The CPU backend, with its own rayon pool.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    spinners: Arc<Spinners>,
    /// The feature turned off by a test (see `crate::ablation`).
    #[cfg(test)]
    ablation: std::sync::Mutex<Option<crate::ablation::Ablation>>,
}

impl CpuBackend {
    /// A backend computing on `threads` threads.
    pub fn new(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("ds4-cpu-{i}"))
            .build()
            .map_err(|e| EngineError::Backend(format!("starting {threads} CPU threads: {e}")))?;
        Ok(CpuBackend {
            pool,
            spinners: Arc::default(),
            #[cfg(test)]
            ablation: std::sync::Mutex::new(None),
        })
    }

    /// Threads of the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Turns one feature off (tests only; see `crate::ablation`).
    #[cfg(test)]
    pub fn set_ablation(&self, a: Option<crate::ablation::Ablation>) {
        *self.ablation.lock().unwrap_or_else(|e| e.into_inner()) = a;
    }

    /// The feature turned off, if any (tests only).
    #[cfg(test)]
    pub(crate) fn ablation(&self) -> Option<crate::ablation::Ablation> {
        *self.ablation.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps the pool's threads awake while steps run. Between two operations rayon parks
/// an idle worker after a few dozen rounds of looking for work, and waking it costs
/// tens of µs, more than one of a decode step's small products takes. So each step
/// asks every other pool thread to look for the step's parallel work until no step is
/// running, as ggml's CPU threadpool keeps its workers spinning through a graph. Unlike
/// ggml's, a spinner that found nothing for [`SPIN_ROUNDS`] looks gives its core back
/// to the OS between looks (`sched_yield`): on a machine whose cores other processes
/// also want, pure spinning halved decode speed (docs/benchmarks.md), while on an idle
/// one the yield returns at once.
#[derive(Default)]
struct Spinners {
    /// Steps running on the pool.
    active: std::sync::atomic::AtomicUsize,
}

/// Looks for work (about 10 µs) before a spinner starts yielding its core.
const SPIN_ROUNDS: u32 = 64;

/// A spinner that has found no work for this long returns to rayon, which parks it
/// until work comes. Besides giving long gaps' cores back, this ends a spin that holds
/// the step's own work below it: a worker that took part of a step's parallel work from
/// its own loop (not while spinning) may pick up the spin job while it waits inside that
/// work; the step then waits for the part this worker holds, and the worker would spin
/// until the step ends (a CI run hung so in `qwen25_teacher_forced_matches_llamacpp`).
const SPIN_IDLE_LIMIT: std::time::Duration = std::time::Duration::from_millis(2);

thread_local! {
    /// Whether this thread runs a step or spins for one: a spinner asked for while
    /// waiting inside a step (rayon runs queued jobs there) must not spin, as the step
    /// it waits in counts as running.
    static IN_STEP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Spinners {
    /// Runs the step `f` on the current pool thread with the others spinning.
    fn step<R>(self: &Arc<Self>, pool: &rayon::ThreadPool, f: impl FnOnce() -> R) -> R {
        use std::sync::atomic::Ordering;
        self.active.fetch_add(1, Ordering::AcqRel);
        if pool.current_num_threads() > 1 {
            let me = self.clone();
            pool.spawn_broadcast(move |_| me.spin());
        }
        /// Ends the step, also when `f` panics (the spinners would spin on otherwise).
        struct End<'a>(&'a Spinners, bool);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                IN_STEP.set(self.1);
                self.0.active.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _end = End(self, IN_STEP.replace(true));
        f()
    }

    /// Runs the pool's work while a step is running.
    fn spin(&self) {
        use std::sync::atomic::Ordering;
        if IN_STEP.replace(true) {
            return;
        }
        let mut idle = 0;
        let mut since = None;
        while self.active.load(Ordering::Acquire) > 0 {
            if rayon::yield_now() == Some(rayon::Yield::Executed) {
                idle = 0;
                since = None;
            } else if idle < SPIN_ROUNDS {
                idle += 1;
                std::hint::spin_loop();
            } else if since.get_or_insert_with(std::time::Instant::now).elapsed() < SPIN_IDLE_LIMIT
            {
                std::thread::yield_now();
            } else {
                break;
            }
        }
        IN_STEP.set(false);
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

/// `buf[off..off + len]`, or an error naming the operation.
fn span<'a>(buf: &'a [f32], off: usize, len: usize, what: &str) -> Result<&'a [f32]> {
    buf.get(off..off + len).ok_or_else(|| {
        EngineError::Backend(format!(
            "{what}: {len} values at {off} from a buffer of {}",
            buf.len()
        ))
    })
}

fn span_mut<'a>(buf: &'a mut [f32], off: usize, len: usize, what: &str) -> Result<&'a mut [f32]> {
    let n = buf.len();
    buf.get_mut(off..off + len).ok_or_else(|| {
        EngineError::Backend(format!(
            "{what}: {len} values at {off} from a buffer of {n}"
        ))
    })
}

impl Buffers for CpuBackend {
    type Buf = Vec<f32>;
    type Ids = Vec<i32>;
}

impl Backend for CpuBackend {
    type Weight = CpuWeight;
    type Kv = CpuKv;
    type Step = CpuStep;
    /// Chosen at once (every operation has run when it returns).
    type Pick = u32;

    fn name(&self) -> &'static str {
        "cpu"
    }

    #[cfg(test)]
    fn ablation(&self) -> Option<crate::ablation::Ablation> {
        CpuBackend::ablation(self)
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(|| self.spinners.step(&self.pool, f))
    }

    fn weight(&self, file: &Arc<GgufFile>, info: &TensorInfo) -> Result<CpuWeight> {
        CpuWeight::from_file(file, info)
    }

    fn weight_f32(&self, name: &str, dims: &[usize], values: &[f32]) -> Result<CpuWeight> {
        CpuWeight::from_f32(name, dims, values)
    }

    fn buf(&self, len: usize) -> Result<Vec<f32>> {
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| EngineError::OutOfMemory {
                what: "a CPU buffer".into(),
                needed: len as u64 * 4,
                available: None,
            })?;
        v.resize(len, 0.0);
        Ok(v)
    }

    fn ids(&self, len: usize) -> Result<Vec<i32>> {
        Ok(vec![0; len])
    }

    fn copy(
        &self,
        src: &Vec<f32>,
        src_off: usize,
        dst: &mut Vec<f32>,
        dst_off: usize,
        len: usize,
    ) -> Result<()> {
        let s = span(src, src_off, len, "copy")?;
        span_mut(dst, dst_off, len, "copy")?.copy_from_slice(s);
        Ok(())
    }

    fn fill(&self, buf: &mut Vec<f32>, off: usize, len: usize, value: f32) -> Result<()> {
        span_mut(buf, off, len, "fill")?.fill(value);
        Ok(())
    }

    fn read(&self, buf: &Vec<f32>, off: usize, len: usize, out: &mut Vec<f32>) -> Result<()> {
        out.extend_from_slice(span(buf, off, len, "read")?);
        Ok(())
    }

    fn write(&self, buf: &mut Vec<f32>, off: usize, data: &[f32]) -> Result<()> {
        span_mut(buf, off, data.len(), "write")?.copy_from_slice(data);
        Ok(())
    }

    fn read_ids(&self, ids: &Vec<i32>, off: usize, len: usize, out: &mut Vec<i32>) -> Result<()> {
        let s = ids
            .get(off..off + len)
            .ok_or_else(|| EngineError::Backend("read_ids out of range".into()))?;
        out.extend_from_slice(s);
        Ok(())
    }

    fn write_ids(&self, ids: &mut Vec<i32>, off: usize, data: &[i32]) -> Result<()> {
        ids.get_mut(off..off + data.len())
            .ok_or_else(|| EngineError::Backend("write_ids out of range".into()))?
            .copy_from_slice(data);
        Ok(())
    }

    fn store_rows(
        &self,
        step: &CpuStep,
        src: &Vec<f32>,
        rows: usize,
        row_len: usize,
        dst: &mut Vec<f32>,
        cap: usize,
    ) -> Result<()> {
        let s = span(src, 0, rows * row_len, "store_rows")?;
        if dst.len() < cap * row_len || (rows > cap) {
            return Err(EngineError::Backend(format!(
                "store_rows: {rows} rows into {cap} slots of a buffer of {}",
                dst.len()
            )));
        }
        for (i, r) in s.chunks_exact(row_len).enumerate() {
            let slot = (step.pos0 + i) % cap;
            dst[slot * row_len..(slot + 1) * row_len].copy_from_slice(r);
        }
        Ok(())
    }

    fn step(&self, tokens: &[u32], pos0: usize) -> Result<CpuStep> {
        Ok(CpuStep {
            tokens: tokens.to_vec(),
            pos0,
        })
    }

    fn step_picked(&self, last: &u32, pos0: usize) -> Result<CpuStep> {
        self.step(&[*last], pos0)
    }

    fn pick(&self, _step: &CpuStep, logits: &Vec<f32>, n: usize) -> Result<u32> {
        Ok(crate::sampler::argmax(span(logits, 0, n, "pick")?))
    }

    fn take_pick(&self, pick: u32) -> Result<u32> {
        Ok(pick)
    }

    fn embed(
        &self,
        step: &CpuStep,
        table: &CpuWeight,
        streams: usize,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let d = table.cols;
        let o = span_mut(out, 0, step.tokens.len() * streams * d, "embed")?;
        for (&t, rows) in step.tokens.iter().zip(o.chunks_exact_mut(streams * d)) {
            let (first, rest) = rows.split_at_mut(d);
            table.row_f32(t as usize, first)?;
            p.round_all(first);
            for r in rest.chunks_exact_mut(d) {
                r.copy_from_slice(first);
            }
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        w: Option<&CpuWeight>,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = w.map(|w| w.expect_len(cols, "rms_norm")).transpose()?;
        let x = span(x, 0, rows * cols, "rms_norm")?;
        let out = span_mut(out, 0, rows * cols, "rms_norm")?;
        out.copy_from_slice(x);
        let work = |row: &mut [f32]| {
            if p == Prec::Ggml {
                ggml_math::rms_norm_row(row, w, eps)
            } else {
                torch_math::rms_norm_row(row, w, eps, p)
            }
        };
        if rows >= 16 {
            use rayon::prelude::*;
            out.par_chunks_mut(cols).for_each(work);
        } else {
            out.chunks_mut(cols).for_each(work);
        }
        Ok(())
    }

    fn rms_norm_cast_once(
        &self,
        x: &Vec<f32>,
        w: Option<&CpuWeight>,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = w
            .map(|w| w.expect_len(cols, "rms_norm_cast_once"))
            .transpose()?;
        let x = span(x, 0, rows * cols, "rms_norm_cast_once")?;
        let out = span_mut(out, 0, rows * cols, "rms_norm_cast_once")?;
        out.copy_from_slice(x);
        let work = |row: &mut [f32]| torch_math::rms_norm_row_cast_once(row, w, eps, p);
        if rows >= 16 {
            use rayon::prelude::*;
            out.par_chunks_mut(cols).for_each(work);
        } else {
            out.chunks_mut(cols).for_each(work);
        }
        Ok(())
    }

    fn layer_norm(
        &self,
        x: &Vec<f32>,
        w: &CpuWeight,
        b: &CpuWeight,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (w, b) = (
            w.expect_len(cols, "layer_norm")?,
            b.expect_len(cols, "layer_norm")?,
        );
        let out = span_mut(out, 0, rows * cols, "layer_norm")?;
        out.copy_from_slice(span(x, 0, rows * cols, "layer_norm")?);
        for row in out.chunks_exact_mut(cols) {
            torch_math::layer_norm_row(row, w, b, eps, p);
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        x: &Vec<f32>,
        rows: usize,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let n_out = w.rows * w.n;
        if w.n != 1 {
            return Err(EngineError::Backend(format!(
                "matmul: '{}' is a stack of {} matrices",
                w.name, w.n
            )));
        }
        // With a bias, the product is rounded after the addition.
        let product = match (bias, p) {
            (Some(_), Prec::Bf16) => Prec::F32,
            _ => p,
        };
        w.matrix(0).forward(x, rows, product, out)?;
        if let Some(b) = bias {
            let b = b.expect_len(n_out, "matmul bias")?;
            for row in out[..rows * n_out].chunks_mut(n_out) {
                for (o, &bv) in row.iter_mut().zip(b) {
                    *o = p.round(*o + bv);
                }
            }
        }
        Ok(())
    }

    fn matmul_grouped(
        &self,
        w: &CpuWeight,
        x: &Vec<f32>,
        rows: usize,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (g, n_in, n_out) = (w.n, w.cols, w.rows);
        let x = span(x, 0, rows * g * n_in, "matmul_grouped")?;
        let out = span_mut(out, 0, rows * g * n_out, "matmul_grouped")?;
        let mut xg = vec![0f32; rows * n_in];
        let mut og = vec![0f32; rows * n_out];
        for gi in 0..g {
            for t in 0..rows {
                xg[t * n_in..(t + 1) * n_in]
                    .copy_from_slice(&x[(t * g + gi) * n_in..(t * g + gi + 1) * n_in]);
            }
            w.matrix(gi).forward(&xg, rows, p, &mut og)?;
            for t in 0..rows {
                out[(t * g + gi) * n_out..(t * g + gi + 1) * n_out]
                    .copy_from_slice(&og[t * n_out..(t + 1) * n_out]);
            }
        }
        Ok(())
    }

    fn rope(
        &self,
        step: &CpuStep,
        r: &Rope,
        n_head: usize,
        head_dim: usize,
        p: Prec,
        x: &mut Vec<f32>,
    ) -> Result<()> {
        let n = step.tokens.len() * n_head * head_dim;
        let x = span_mut(x, 0, n, "rope")?;
        if r.n_dims > head_dim || !r.n_dims.is_multiple_of(2) {
            return Err(EngineError::Backend(format!(
                "rope of {} dimensions in heads of {head_dim}",
                r.n_dims
            )));
        }
        if p == Prec::Ggml {
            if r.trailing || r.yarn.is_some() || r.inverse {
                return Err(EngineError::Backend(
                    "ggml's rope has no trailing, YaRN or inverse form here".into(),
                ));
            }
            rope::ggml(r, step.pos0, n_head, head_dim, x);
        } else {
            rope::torch(r, step.pos0, n_head, head_dim, p, x);
        }
        Ok(())
    }

    fn kv(&self, n_layer: usize, n_ctx: usize, kv_dim: usize) -> Result<CpuKv> {
        let bytes = 2 * n_layer as u64 * n_ctx as u64 * kv_dim as u64 * 2;
        let alloc = || -> Result<Vec<Vec<f16>>> {
            (0..n_layer)
                .map(|_| {
                    let mut v = Vec::new();
                    v.try_reserve_exact(n_ctx * kv_dim)
                        .map_err(|_| EngineError::OutOfMemory {
                            what: "the KV cache".into(),
                            needed: bytes,
                            available: None,
                        })?;
                    v.resize(n_ctx * kv_dim, f16::ZERO);
                    Ok(v)
                })
                .collect()
        };
        Ok(CpuKv {
            k: alloc()?,
            v: alloc()?,
            kv_dim,
        })
    }

    /// Keeps only the first `len` positions (a snapshot's memory follows its length).
    fn kv_snapshot(&self, kv: &CpuKv, len: usize) -> Result<CpuKv> {
        let n = len * kv.kv_dim;
        let copy = |layers: &Vec<Vec<f16>>| -> Result<Vec<Vec<f16>>> {
            layers
                .iter()
                .map(|l| {
                    l.get(..n).map(<[f16]>::to_vec).ok_or_else(|| {
                        EngineError::Backend(format!(
                            "kv_snapshot: {len} positions of a cache of {}",
                            l.len() / kv.kv_dim.max(1)
                        ))
                    })
                })
                .collect()
        };
        Ok(CpuKv {
            k: copy(&kv.k)?,
            v: copy(&kv.v)?,
            kv_dim: kv.kv_dim,
        })
    }

    fn kv_restore(&self, dst: &mut CpuKv, src: &CpuKv, len: usize) -> Result<()> {
        let n = len * src.kv_dim;
        let fits = dst.kv_dim == src.kv_dim
            && dst.k.len() == src.k.len()
            && dst.k.iter().chain(&src.k).all(|l| l.len() >= n);
        if !fits {
            return Err(EngineError::Backend(format!(
                "kv_restore: {len} positions of a {}-layer cache into another shape",
                src.k.len()
            )));
        }
        for (d, s) in dst
            .k
            .iter_mut()
            .zip(&src.k)
            .chain(dst.v.iter_mut().zip(&src.v))
        {
            d[..n].copy_from_slice(&s[..n]);
        }
        Ok(())
    }

    fn kv_capacity(&self, kv: &CpuKv) -> Option<usize> {
        Some(kv.k.first().map_or(0, |l| l.len() / kv.kv_dim.max(1)))
    }

    fn kv_read(&self, kv: &CpuKv, len: usize, out: &mut Vec<u16>) -> Result<()> {
        let n = len * kv.kv_dim;
        for (k, v) in kv.k.iter().zip(&kv.v) {
            for l in [k, v] {
                let rows = l.get(..n).ok_or_else(|| {
                    EngineError::Backend(format!("kv_read: {len} positions past the cache"))
                })?;
                out.extend(rows.iter().map(|x| x.to_bits()));
            }
        }
        Ok(())
    }

    fn kv_write(&self, kv: &mut CpuKv, len: usize, data: &[u16]) -> Result<()> {
        let n = len * kv.kv_dim;
        if data.len() != 2 * kv.k.len() * n || kv.k.iter().any(|l| l.len() < n) {
            return Err(EngineError::Backend(format!(
                "kv_write: {} values for {len} positions of a {}-layer cache",
                data.len(),
                kv.k.len()
            )));
        }
        let mut chunks = data.chunks_exact(n.max(1));
        for (k, v) in kv.k.iter_mut().zip(kv.v.iter_mut()) {
            for l in [k, v] {
                if n == 0 {
                    continue;
                }
                let src = chunks.next().unwrap_or_default();
                for (d, &b) in l[..n].iter_mut().zip(src) {
                    *d = f16::from_bits(b);
                }
            }
        }
        Ok(())
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
    ) -> Result<()> {
        let kv_dim = kv.kv_dim;
        let n_tok = step.tokens.len();
        let p0 = step.pos0;
        let (Some(kc), Some(vc)) = (kv.k.get_mut(layer), kv.v.get_mut(layer)) else {
            return Err(EngineError::Backend(format!("attention: no layer {layer}")));
        };
        if (p0 + n_tok) * kv_dim > kc.len() {
            return Err(EngineError::Backend("attention: the cache is full".into()));
        }
        kc[p0 * kv_dim..(p0 + n_tok) * kv_dim].convert_from_f32_slice(span(
            k,
            0,
            n_tok * kv_dim,
            "attention k",
        )?);
        vc[p0 * kv_dim..(p0 + n_tok) * kv_dim].convert_from_f32_slice(span(
            v,
            0,
            n_tok * kv_dim,
            "attention v",
        )?);
        attention::attention(shape, p0, n_tok, q, kc, vc, kv_dim, out);
        Ok(())
    }

    fn swiglu(
        &self,
        gate: &Vec<f32>,
        up: &Vec<f32>,
        len: usize,
        limit: Option<f32>,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (g, u) = (span(gate, 0, len, "swiglu")?, span(up, 0, len, "swiglu")?);
        let o = span_mut(out, 0, len, "swiglu")?;
        if p == Prec::Ggml {
            ggml_math::swiglu(g, u, o);
        } else {
            o.copy_from_slice(g);
            moe::swiglu(self, o, u, limit, p);
        }
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize, p: Prec) -> Result<()> {
        let y = span(y, 0, len, "add")?;
        for (a, &b) in span_mut(x, 0, len, "add")?.iter_mut().zip(y) {
            *a = p.round(*a + b);
        }
        Ok(())
    }

    fn scale_sigmoid(
        &self,
        x: &mut Vec<f32>,
        gate: &Vec<f32>,
        rows: usize,
        cols: usize,
        gate_cols: usize,
        p: Prec,
    ) -> Result<()> {
        if gate_cols != 1 && gate_cols != cols {
            return Err(EngineError::Backend(format!(
                "scale_sigmoid: gates of {gate_cols} for rows of {cols}"
            )));
        }
        let g = span(gate, 0, rows * gate_cols, "scale_sigmoid")?;
        let x = span_mut(x, 0, rows * cols, "scale_sigmoid")?;
        for (r, row) in x.chunks_exact_mut(cols).enumerate() {
            for (c, v) in row.iter_mut().enumerate() {
                let gv = g[r * gate_cols + if gate_cols == 1 { 0 } else { c }];
                *v = p.round(*v * torch_math::sigmoid(gv));
            }
        }
        Ok(())
    }

    fn moe_route(
        &self,
        step: &CpuStep,
        logits: &Vec<f32>,
        rows: usize,
        bias: Option<&CpuWeight>,
        hash: Option<&CpuWeight>,
        r: &Routing,
        p: Prec,
        ids: &mut Vec<i32>,
        weights: &mut Vec<f32>,
    ) -> Result<()> {
        let e = r.n_expert;
        let k = r.n_used;
        let logits = span(logits, 0, rows * e, "moe_route")?;
        let bias = bias
            .map(|b| b.expect_len(e, "moe_route bias"))
            .transpose()?;
        let table = hash.map(|h| h.values()).transpose()?;
        if ids.len() < rows * k {
            return Err(EngineError::Backend("moe_route: ids too short".into()));
        }
        let weights = span_mut(weights, 0, rows * k, "moe_route")?;
        for t in 0..rows {
            let hashed = match table {
                Some(tab) => {
                    let tok = *step.tokens.get(t).ok_or_else(|| {
                        EngineError::Backend(
                            "moe_route: hash routing needs the step's tokens".into(),
                        )
                    })? as usize;
                    Some(tab.get(tok * k..(tok + 1) * k).ok_or_else(|| {
                        EngineError::Backend(format!(
                            "moe_route: token {tok} outside the hash table"
                        ))
                    })?)
                }
                None => None,
            };
            moe::route(
                self,
                &logits[t * e..(t + 1) * e],
                bias,
                hashed,
                r,
                p,
                &mut ids[t * k..(t + 1) * k],
                &mut weights[t * k..(t + 1) * k],
            )?;
        }
        Ok(())
    }

    fn moe_experts(
        &self,
        x: &Vec<f32>,
        rows: usize,
        ids: &Vec<i32>,
        weights: &Vec<f32>,
        k: usize,
        experts: &Experts<'_, CpuWeight>,
        limit: Option<f32>,
        wp: Prec,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let d = experts.gate.cols;
        let x = span(x, 0, rows * d, "moe_experts")?;
        let w = span(weights, 0, rows * k, "moe_experts")?;
        let ids = ids
            .get(..rows * k)
            .ok_or_else(|| EngineError::Backend("moe_experts: ids too short".into()))?;
        let out = span_mut(out, 0, rows * d, "moe_experts")?;
        moe::experts(self, x, rows, ids, w, k, experts, limit, wp, p, out)
    }

    fn hc_pre(
        &self,
        x: &Vec<f32>,
        rows: usize,
        w: &HcWeights<'_, CpuWeight>,
        shape: &HcShape,
        p: Prec,
        out: &mut Vec<f32>,
        mix: &mut Vec<f32>,
    ) -> Result<()> {
        let x = span(x, 0, rows * shape.n * shape.d, "hc_pre")?;
        let out = span_mut(out, 0, rows * shape.d, "hc_pre")?;
        let mix = span_mut(mix, 0, rows * shape.mix_len(), "hc_pre")?;
        mhc::pre(self, x, rows, w, shape, p, out, mix)
    }

    fn hc_post(
        &self,
        x: &mut Vec<f32>,
        y: &Vec<f32>,
        mix: &Vec<f32>,
        rows: usize,
        shape: &HcShape,
        p: Prec,
    ) -> Result<()> {
        let y = span(y, 0, rows * shape.d, "hc_post")?;
        let mix = span(mix, 0, rows * shape.mix_len(), "hc_post")?;
        let x = span_mut(x, 0, rows * shape.n * shape.d, "hc_post")?;
        mhc::post(self, x, y, mix, rows, shape, p);
        Ok(())
    }

    fn hc_head(
        &self,
        x: &Vec<f32>,
        rows: usize,
        w: Option<&HcWeights<'_, CpuWeight>>,
        shape: &HcShape,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let x = span(x, 0, rows * shape.n * shape.d, "hc_head")?;
        let out = span_mut(out, 0, rows * shape.d, "hc_head")?;
        mhc::head(self, x, rows, w, shape, p, out)
    }

    fn delta_net(
        &self,
        step: &CpuStep,
        rows: Range<usize>,
        x: &DeltaIn<'_, Self>,
        w: &DeltaWeights<'_, CpuWeight>,
        state: &mut DeltaState<'_, Self>,
        journal: Option<&mut DeltaJournal<Self>>,
        shape: &DeltaShape,
        form: DeltaForm,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let kc = shape.kernel;
        let conv_w = [
            w.conv[0].expect_len(shape.qk_len() * kc, "delta_net conv q")?,
            w.conv[1].expect_len(shape.qk_len() * kc, "delta_net conv k")?,
            w.conv[2].expect_len(shape.v_len() * kc, "delta_net conv v")?,
        ];
        let dt_bias = w.dt_bias.expect_len(shape.g_len(), "delta_net dt_bias")?;
        let decay = w.decay.expect_len(shape.v_heads, "delta_net decay")?;
        let journal = journal.map(|j| {
            (
                j.cap,
                [
                    &mut j.pre[..],
                    &mut j.k[..],
                    &mut j.v[..],
                    &mut j.g[..],
                    &mut j.beta[..],
                ],
            )
        });
        if let Some((cap, bufs)) = &journal {
            let c = 2 * shape.qk_len() + shape.v_len();
            let widths = [
                c,
                shape.qk_len(),
                shape.v_len(),
                shape.g_len(),
                shape.v_heads,
            ];
            if bufs.iter().zip(widths).any(|(b, w)| b.len() < cap * w) {
                return Err(EngineError::Backend("delta_net: journal too small".into()));
            }
        }
        let io = delta::Io {
            conv_state: &mut state.conv[..],
            s: &mut state.s[..],
            journal,
        };
        delta::run(
            self,
            step.pos0 + rows.start,
            rows,
            [x.q, x.k, x.v, x.g, x.beta],
            conv_w,
            dt_bias,
            decay,
            io,
            shape,
            form,
            p,
            out,
        )
    }

    fn delta_replay(
        &self,
        layers: &mut [DeltaReplay<'_, Self>],
        range: Range<usize>,
        shape: &DeltaShape,
    ) -> Result<()> {
        if let Some(l) = layers.iter().find(|l| range.len() > l.journal.cap) {
            return Err(EngineError::Backend(format!(
                "delta_replay of {} tokens from a journal of {}",
                range.len(),
                l.journal.cap
            )));
        }
        for DeltaReplay { journal, state } in layers {
            delta::replay(
                (
                    journal.cap,
                    [
                        &journal.pre[..],
                        &journal.k[..],
                        &journal.v[..],
                        &journal.g[..],
                        &journal.beta[..],
                    ],
                ),
                range.clone(),
                shape,
                &mut state.conv[..],
                &mut state.s[..],
            );
        }
        Ok(())
    }

    fn gated_norm(
        &self,
        o: &Vec<f32>,
        z: &Vec<f32>,
        w: &CpuWeight,
        rows: usize,
        shape: &DeltaShape,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let n = rows * shape.v_len();
        let w = w.expect_len(shape.v_dim, "gated_norm")?;
        let (o, z) = (span(o, 0, n, "gated_norm")?, span(z, 0, n, "gated_norm")?);
        let out = span_mut(out, 0, n, "gated_norm")?;
        delta::gated_norm(self, o, z, w, rows, shape, p, out);
        Ok(())
    }

    fn compress(
        &self,
        step: &CpuStep,
        rows: [&Vec<f32>; 2],
        ring: [&mut Vec<f32>; 2],
        cap: usize,
        ape: &CpuWeight,
        norm: Option<&CpuWeight>,
        rope: Option<&Rope>,
        shape: &CompressShape,
        p: Prec,
        entries: &mut Vec<f32>,
    ) -> Result<()> {
        let [kv, gate] = ring;
        let n = step.tokens.len();
        self.store_rows(step, rows[0], n, shape.row_len(), kv, cap)?;
        self.store_rows(step, rows[1], n, shape.row_len(), gate, cap)?;
        let norm = norm
            .map(|w| w.expect_len(shape.dim, "compress norm"))
            .transpose()?;
        dsa::compress(
            self,
            step.pos0,
            step.tokens.len(),
            kv,
            gate,
            cap,
            ape.values()?,
            norm,
            rope,
            shape,
            p,
            entries,
        )
    }

    fn dsa_select(
        &self,
        step: &CpuStep,
        q: &Vec<f32>,
        w: &Vec<f32>,
        entries: &Vec<f32>,
        rows: usize,
        shape: &SelectShape,
        ids: &mut Vec<i32>,
    ) -> Result<()> {
        dsa::select(self, step.pos0, q, w, entries, rows, shape, ids)
    }

    fn mla_attention(
        &self,
        step: &CpuStep,
        q: &Vec<f32>,
        latent: &Vec<f32>,
        k_b: &CpuWeight,
        v_b: &CpuWeight,
        sel: Option<&Vec<i32>>,
        rows: usize,
        shape: &MlaShape,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if sel.is_some() && shape.select.is_none() {
            return Err(EngineError::Backend(
                "mla_attention: a selection without pool settings".into(),
            ));
        }
        mla::attention(
            step.pos0,
            q,
            latent,
            k_b,
            v_b,
            sel.map(|s| &s[..]),
            rows,
            shape,
            p,
            out,
        )
    }

    fn sink_attention(
        &self,
        step: &CpuStep,
        q: &Vec<f32>,
        kv: &Vec<f32>,
        window: &Vec<f32>,
        cap: usize,
        entries: Option<(&Vec<f32>, Option<&Vec<i32>>)>,
        sinks: &CpuWeight,
        rows: usize,
        shape: &SinkAttnShape,
        p: Prec,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let sinks = sinks.expect_len(shape.heads, "sink_attention sinks")?;
        // Test switches: sinks removed (−inf) or left at the reference's init value 0.
        let ablated_sinks: Vec<f32>;
        let sinks = match (
            crate::ablated!(self, SinksOff),
            crate::ablated!(self, SinksZero),
        ) {
            (true, _) => {
                ablated_sinks = vec![f32::NEG_INFINITY; shape.heads];
                &ablated_sinks[..]
            }
            (_, true) => {
                ablated_sinks = vec![0.0; shape.heads];
                &ablated_sinks[..]
            }
            _ => sinks,
        };
        let entries = entries.map(|(e, sel)| (&e[..], sel.map(|s| (&s[..], shape.per_query))));
        sink::attention(
            step.pos0, q, kv, window, cap, entries, sinks, rows, shape, p, out,
        )
    }
}

#[cfg(test)]
mod spin_tests {
    use super::*;

    /// A spinner asked for outside a step while a step runs elsewhere and no work comes
    /// (the worker of the hang above, inside the step's work it took) returns within its
    /// idle limit instead of spinning until the step ends.
    #[test]
    fn a_spinner_without_work_returns() {
        use std::sync::atomic::Ordering;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let spinners = Arc::new(Spinners::default());
        // A step that never ends while the spinner runs.
        spinners.active.fetch_add(1, Ordering::AcqRel);
        let (tx, rx) = std::sync::mpsc::channel();
        let me = spinners.clone();
        pool.spawn(move || {
            me.spin();
            let _ = tx.send(());
        });
        // Generous for a loaded machine: the limit is 2 ms of finding nothing.
        let returned = rx.recv_timeout(std::time::Duration::from_secs(20)).is_ok();
        spinners.active.fetch_sub(1, Ordering::AcqRel);
        assert!(returned, "the spinner was still spinning after 20 s");
    }
}
