//! The MoE families' operations on the device (GLM-5.3 first): each records ready-made
//! launches ([`Op::Kernel`]) of the kernels in `norm.cu`, `float_gemv.cu`, `moe.cu`,
//! `mhc.cu`, `delta.cu`, `sparse.cu` and the expert GEMVs of `gemv.cu`, with
//! parameter structs laid out as the kernels declare them (`#[repr(C)]`, same field
//! order). Positions are read from the step buffer on the device, and every parameter
//! is fixed per cache (capacities, not current lengths), so a decode step records the
//! same launches at every token and replays as one CUDA graph.
//!
//! Scratch memory between launches of one operation (expert intermediates, mixes,
//! kernel inputs, scores) comes from a per-backend arena keyed by purpose; it only
//! grows, and growing it drops the captured graphs.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ds4_engine::backend::{
    CompressShape, DeltaForm, DeltaIn, DeltaJournal, DeltaReplay, DeltaShape, DeltaState,
    DeltaWeights, Experts, Gate, HcShape, HcWeights, MlaShape, OutGate, PoolSelect, Prec, Rope,
    Routing, Scoring, SelectShape, SinkAttnShape,
};
use ds4_engine::{EngineError, Result};
use ds4_gguf::GgmlType;

use crate::backend::{CudaBackend, CudaBuf, CudaStep};
use crate::driver::{DPtr, DevMem, Func};
use crate::gemm::Sgemm;
use crate::layout::{act_need, gemv_smem_bytes};
use crate::ops::{
    CompressParams, DeltaParams, ExpertGemv, FG_THREADS, FloatSeg, GatedNormArgs, HC_COLS,
    HcPostArgs, HcPreArgs, KArgs, KernelOp, LayerNormArgs, MatRef, NormRefArgs, Op, REPLAY_LAYERS,
    ReduceTail, ReplayLayer, ReplayParams, RopeTorchArgs, RouteParams, SinkParams, StoreRowsArgs,
    float_blocks, float_lanes,
};
use crate::weights::CudaWeight;

/// `1` when `p` rounds to bf16 at the operation's cast points.
fn rb(p: Prec) -> i32 {
    (p == Prec::Bf16) as i32
}

fn blocks(n: u64, per: u64) -> u32 {
    n.div_ceil(per).max(1).min(u32::MAX as u64) as u32
}

fn bad(what: impl Into<String>) -> EngineError {
    EngineError::Backend(what.into())
}

fn weight_err(e: crate::error::CudaError) -> EngineError {
    EngineError::Backend(e.to_string())
}

/// The device pointer of an optional vector weight that must hold `len` values (0 when
/// absent; its memory joins the launch's `keep`), or an error naming `what`.
fn opt_values<'a>(
    w: Option<&'a CudaWeight>,
    len: usize,
    what: &str,
    keep: &mut Vec<&'a Arc<DevMem>>,
) -> Result<DPtr> {
    let Some(w) = w else { return Ok(0) };
    let (m, l) = w.values().map_err(weight_err)?;
    if l != len {
        return Err(bad(format!("{what} length")));
    }
    keep.push(m);
    Ok(m.ptr())
}

#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy)]
struct FloatGemv {
    w: DPtr,
    w_gstride: i64,
    x: DPtr,
    x_tstride: i64,
    x_gstride: i64,
    out: DPtr,
    o_tstride: i64,
    o_gstride: i64,
    bias: DPtr,
    ty: i32,
    n_out: i32,
    n_in: i32,
    n_tok: i32,
    rb: i32,
    lanes: i32,
}

#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy)]
struct FloatExperts {
    w: DPtr,
    w2: DPtr,
    w_gstride: i64,
    x: DPtr,
    x_tstride: i64,
    ids: DPtr,
    out: DPtr,
    ty: i32,
    k: i32,
    n_in: i32,
    rows: i32,
    rb: i32,
    pair: i32,
    lim: f32,
    /// Padding, zero (see [`crate::ops`]).
    pad: i32,
}

/// `MoeSorted` of kernels/moe_mma.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy)]
struct MoeSorted {
    offs: DPtr,
    tiles: DPtr,
    perm: DPtr,
}

/// `MoeMma` of kernels/moe_mma.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy)]
struct MoeMma {
    w: [DPtr; 4],
    w2: [DPtr; 4],
    estride: [i64; 4],
    estride2: [i64; 4],
    ty: i32,
    ty2: i32,
    x: DPtr,
    s: MoeSorted,
    out: DPtr,
    k: i32,
    n_expert: i32,
    n_in: i32,
    rows: i32,
    rb: i32,
    lim: f32,
}

/// `moe_mma.cu`'s tile sizes (pairs; gate/up and down matrix rows) and expert limit.
const MM_TM: usize = 64;
const MM_TN_GATE_UP: usize = 64;
const MM_TN_DOWN: usize = 128;
const MM_MAX_E: usize = 1024;

/// Steps of at least this many tokens run quantized experts on tensor cores, grouped by
/// expert; shorter ones one GEMV per (token, expert) pair.
const MMA_MIN_ROWS: usize = 16;

/// Float products of at least this many tokens (f32 policy) run as cuBLAS f32 GEMMs.
const SGEMM_MIN_ROWS: usize = 16;
/// `hc_mixes`' tokens and mix rows per block and columns per step (kernels/mhc.cu: HC_MT,
/// HC_MI, HC_KC).
const HC_MIX_TOKENS: usize = 16;
const HC_MIX_ROWS: usize = 24;
const HC_MIX_COLS: usize = 128;
/// MLA prefill with a selection runs as dense GEMMs with a masked softmax while the
/// context is at most this many times the selected tokens (see `mla_op`).
const MLA_DENSE_SELECTED: usize = 8;
/// `delta_recurrent`'s largest number of state columns per block (kernels/delta.cu
/// `REC_COLS`), two threads each.
const REC_COLS: usize = 64;

/// State columns per `delta_recurrent` block for value heads of `dv`: a multiple of 16,
/// so that the block is whole warps.
fn rec_cols(dv: usize) -> usize {
    dv.min(REC_COLS).next_multiple_of(16)
}

fn rec_blocks(dv: usize) -> u32 {
    dv.div_ceil(rec_cols(dv)) as u32
}

fn rec_threads(dv: usize) -> u32 {
    2 * rec_cols(dv) as u32
}

/// `delta_step`'s largest conv kernel (kernels/delta.cu `STEP_KC`).
const DELTA_STEP_KC: usize = 4;

/// `mla_softmax`'s selection mask must fit the default shared memory.
const MLA_SOFTMAX_SMEM: usize = 48 * 1024;

/// Bytes of `mla_softmax`'s selection mask over `keys` keys: one bit per pool.
fn mla_mask_bytes(keys: usize, pool: usize) -> usize {
    (keys / pool / 32 + 1) * 4
}

/// Queries per chunk of the MLA prefill GEMMs: each chunk scores every key its last query
/// sees, so smaller chunks compute fewer masked scores (256 measured faster than 512 and
/// 1024 at 4096 tokens).
const MLA_GEMM_QUERIES: usize = 256;
/// MLA prefill expands per-head keys and values (f32) while they take at most this many
/// bytes (a context of 8192 tokens at GLM-5.3's 64 heads of 256 + 256).
const MLA_EXPAND_BYTES: usize = 1 << 30;

/// What the dense MLA GEMMs read and write (see `mla_dense_gemm`); device pointers with
/// the allocations to keep alive.
enum MlaIo<'a> {
    /// Absorbed queries `q̃ [rows, Ha, rkv]` attend over the latents; the context
    /// `ctx [rows, Ha, rkv]` stays in latent space.
    Latent {
        qt: &'a Arc<DevMem>,
        ctx: &'a Arc<DevMem>,
    },
    /// Queries `[rows, Ha, dn]` attend over expanded keys `[t, Ha, dn]`, values
    /// `[t, Ha, dv]` sum into `out [rows, Ha, dv]`.
    Expanded {
        q: (DPtr, &'a Arc<DevMem>),
        keys: &'a Arc<DevMem>,
        vals: &'a Arc<DevMem>,
        out: (DPtr, &'a Arc<DevMem>),
    },
}

impl<'a> MlaIo<'a> {
    /// The score GEMM (`scores [nq, Ha, tk]`, column-major `[tk, nq·Ha]`) and the mix
    /// GEMM of queries `q0..q0+nq` seeing `tk` keys, and what they read and write.
    fn chunk(
        &self,
        latent: &'a CudaBuf,
        scores: &'a Arc<DevMem>,
        sh: &MlaShape,
        q0: usize,
        nq: usize,
        tk: usize,
    ) -> (Sgemm, Sgemm, Vec<&'a Arc<DevMem>>) {
        let (ha, rkv, dn, dv) = (sh.heads, sh.rank, sh.qk_dim, sh.v_dim);
        match *self {
            MlaIo::Latent { qt, ctx } => {
                let score = Sgemm {
                    trans_a: true,
                    m: tk as i32,
                    n: (nq * ha) as i32,
                    k: rkv as i32,
                    a: latent.ptr(),
                    lda: rkv as i32,
                    stride_a: 0,
                    b: qt.ptr() + (q0 * ha * rkv * 4) as u64,
                    ldb: rkv as i32,
                    stride_b: 0,
                    c: scores.ptr(),
                    ldc: tk as i32,
                    stride_c: 0,
                    batch: 1,
                };
                let mix = Sgemm {
                    trans_a: false,
                    m: rkv as i32,
                    n: (nq * ha) as i32,
                    k: tk as i32,
                    a: latent.ptr(),
                    lda: rkv as i32,
                    stride_a: 0,
                    b: scores.ptr(),
                    ldb: tk as i32,
                    stride_b: 0,
                    c: ctx.ptr() + (q0 * ha * rkv * 4) as u64,
                    ldc: rkv as i32,
                    stride_c: 0,
                    batch: 1,
                };
                (score, mix, vec![qt, &latent.mem, scores, ctx])
            }
            // One GEMM per head (batched): head h's scores of query j at
            // (j·Ha + h)·tk, the same block layout as the latent form's.
            MlaIo::Expanded { q, keys, vals, out } => {
                let score = Sgemm {
                    trans_a: true,
                    m: tk as i32,
                    n: nq as i32,
                    k: dn as i32,
                    a: keys.ptr(),
                    lda: (ha * dn) as i32,
                    stride_a: dn as i64,
                    b: q.0 + (q0 * ha * dn * 4) as u64,
                    ldb: (ha * dn) as i32,
                    stride_b: dn as i64,
                    c: scores.ptr(),
                    ldc: (ha * tk) as i32,
                    stride_c: tk as i64,
                    batch: ha as i32,
                };
                let mix = Sgemm {
                    trans_a: false,
                    m: dv as i32,
                    n: nq as i32,
                    k: tk as i32,
                    a: vals.ptr(),
                    lda: (ha * dv) as i32,
                    stride_a: dv as i64,
                    b: scores.ptr(),
                    ldb: (ha * tk) as i32,
                    stride_b: tk as i64,
                    c: out.0 + (q0 * ha * dv * 4) as u64,
                    ldc: (ha * dv) as i32,
                    stride_c: dv as i64,
                    batch: ha as i32,
                };
                (score, mix, vec![q.1, keys, vals, scores, out.1])
            }
        }
    }
}

#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy)]
struct SelectParams {
    step: DPtr,
    q: DPtr,
    w: DPtr,
    entries: DPtr,
    scores: DPtr,
    ids: DPtr,
    rows: i32,
    heads: i32,
    dim: i32,
    rate: i32,
    top_k: i32,
    max_entries: i32,
    scale: f32,
    wscale: f32,
}

#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy)]
struct MlaParams {
    step: DPtr,
    q: DPtr,
    keys: DPtr,
    vals: DPtr,
    sel: DPtr,
    out: DPtr,
    part_o: DPtr,
    part_m: DPtr,
    part_l: DPtr,
    counters: DPtr,
    k_ts: i64,
    v_ts: i64,
    k_hs: i32,
    v_hs: i32,
    kdim: i32,
    vdim: i32,
    rows: i32,
    heads: i32,
    pool: i32,
    per_q: i32,
    tail: i32,
    rb: i32,
    scale: f32,
    /// Keys and values are the same rows, staged in shared memory a tile at a time.
    stage: i32,
}

/// `sink_scores`' limits (kernels/sparse.cu): heads per block, warps per block, and the
/// head dim it keeps in registers.
const SINK_HG: usize = 16;
const SINK_WARPS: u64 = 8;
const SINK_MAX_DIM: usize = 16 * 32;

/// `sink_scores`' keys per warp (1 to 32): one for a single row (decode: a warp's keys are
/// scored one after another, and at a short context the few real keys would fall to a few
/// warps), four for a prompt's rows (each block stages its row's queries once for 32 keys).
fn sink_keys_per_warp(rows: usize) -> u64 {
    if rows == 1 { 1 } else { 4 }
}

/// `dsa_scores`' limits: entries per block, threads per block (at least one per head),
/// and the shared memory of one query's padded heads, weights and per-head terms and of
/// the block's entry rows.
const DSA_ENTRIES: u64 = 16;
const DSA_THREADS: usize = 256;
const DSA_SMEM: usize = 48 * 1024;
/// `dsa_topk`'s threads: one per bin of its radix digit (`DSA_BINS`).
const DSA_BINS: u32 = 256;

/// `mla_attend`'s limits and split (kernels/sparse.cu): key length (its queries in shared
/// memory, checked against the kernel's shared memory too) and value length (MLA_VCH
/// channels of 256 threads), heads per block (`MLA_HG`), tokens per tile (`MLA_TT`) and
/// the blocks that share a (query, head group)'s tokens (at most the kernel's MLA_CHUNKS).
const MLA_QMAX: usize = 1024;
const MLA_VMAX: usize = 4 * 256;
const MLA_HG: usize = 8;
const MLA_TT: usize = 32;
const MLA_CHUNKS: usize = 16;

/// A float matrix stack as the float kernels take it: pointer, type, rows, cols, count.
fn float_mat(w: &CudaWeight) -> Result<(&Arc<DevMem>, GgmlType, usize, usize, usize)> {
    match w {
        CudaWeight::Float {
            mem,
            ty,
            rows,
            cols,
            n,
            ..
        } => Ok((mem, *ty, *rows, *cols, *n)),
        _ => Err(bad("a float matrix was expected")),
    }
}

/// One launch to record.
pub(crate) struct Launch<'a> {
    pub(crate) f: Func,
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: u32,
    pub(crate) smem: u32,
    pub(crate) args: KArgs,
    pub(crate) label: &'static str,
    pub(crate) keep: Vec<&'a Arc<DevMem>>,
}

impl CudaBackend {
    pub(crate) fn launch_op(&self, l: Launch<'_>) {
        self.record(
            Op::Kernel(KernelOp {
                f: l.f,
                grid: l.grid,
                block: l.block,
                smem: l.smem,
                args: l.args,
                label: l.label,
            }),
            &l.keep,
        );
    }

    pub(crate) fn args<T: bytemuck::NoUninit>(v: T) -> KArgs {
        let mut a = KArgs::default();
        a.push(v);
        a
    }

    /// `bytes` of scratch for purpose `key` (see the module header).
    pub(crate) fn scratch_mem(&self, key: &'static str, bytes: usize) -> Result<Arc<DevMem>> {
        let st = self.lock();
        if let Some(m) = st.scratch.get(key)
            && m.bytes() >= bytes
        {
            return Ok(m.clone());
        }
        let size = bytes.max(st.scratch.get(key).map_or(0, |m| m.bytes() * 3 / 2));
        drop(st);
        let m = Arc::new(self.alloc(size, "operation scratch")?);
        let mut st = self.lock();
        st.scratch.insert(key, m.clone());
        st.graphs.clear();
        Ok(m)
    }

    /// `out = round(w · x)` for `rows` rows with a float weight (group 0 only).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn float_matmul(
        &self,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        x: &CudaBuf,
        rows: usize,
        groups: usize,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let (wm, ty, n_out, n_in, n) = float_mat(w)?;
        if groups != 1 && n != groups {
            return Err(bad(format!(
                "grouped product of {n} matrices over {groups} groups"
            )));
        }
        let xp = self.buf_of(x, rows * groups * n_in, "matmul input")?;
        let op = self.buf_of(out, rows * groups * n_out, "matmul output")?;
        let mut keep = vec![wm, &x.mem, &out.mem];
        let bp = opt_values(bias, n_out, "matmul: bias", &mut keep)?;
        // Many tokens in f32 arithmetic: cuBLAS, on an f32 copy of the weight.
        if rows >= SGEMM_MIN_ROWS && p != Prec::Bf16 && bias.is_none() {
            let wf = self.f32_weight(wm, ty, n * n_out * n_in)?;
            let g = Sgemm {
                trans_a: true,
                m: n_out as i32,
                n: rows as i32,
                k: n_in as i32,
                a: wf.as_ref().map_or(wm.ptr(), |f| f.ptr()),
                lda: n_in as i32,
                stride_a: if groups == 1 {
                    0
                } else {
                    (n_out * n_in) as i64
                },
                b: xp,
                ldb: (groups * n_in) as i32,
                stride_b: n_in as i64,
                c: op,
                ldc: (groups * n_out) as i32,
                stride_c: n_out as i64,
                batch: groups as i32,
            };
            keep.extend(wf.as_ref());
            self.record(Op::Sgemm(g), &keep);
            return Ok(());
        }
        if groups == 1 {
            let seg = FloatSeg {
                pad: 0,
                w: wm.ptr(),
                x: xp,
                out: op,
                bias: bp,
                ty: ty as i32,
                n_out: n_out as i32,
                n_in: n_in as i32,
                n_tok: rows as i32,
                rb: rb(p),
                first: 0,
                lanes: float_lanes(n_in, ty.type_size()),
            };
            self.record(Op::FloatGemv(seg), &keep);
            return Ok(());
        }
        let prm = FloatGemv {
            w: wm.ptr(),
            w_gstride: (n_out * n_in) as i64,
            x: xp,
            x_tstride: (groups * n_in) as i64,
            x_gstride: n_in as i64,
            out: op,
            o_tstride: (groups * n_out) as i64,
            o_gstride: n_out as i64,
            bias: bp,
            ty: ty as i32,
            n_out: n_out as i32,
            n_in: n_in as i32,
            n_tok: rows as i32,
            rb: rb(p),
            lanes: float_lanes(n_in, ty.type_size()),
        };
        self.launch_op(Launch {
            f: self.k.gemv_float,
            grid: (float_blocks(n_out, prm.lanes), groups as u32, 1),
            block: FG_THREADS,
            smem: 0,
            args: Self::args(prm),
            label: "gemv_float_grouped",
            keep,
        });
        Ok(())
    }

    /// `w` (`n` values of float type `ty`) converted to f32 in scratch, or `None` when it
    /// is f32 already.
    fn f32_weight(&self, w: &Arc<DevMem>, ty: GgmlType, n: usize) -> Result<Option<Arc<DevMem>>> {
        if ty == GgmlType::F32 {
            return Ok(None);
        }
        let f = self.scratch_mem("sgemm_w", n * 4)?;
        let mut a = KArgs::default();
        a.push(w.ptr()).push(ty as i32).push(f.ptr()).push(n as i64);
        self.elementwise(self.k.to_f32, n as u64, a, "to_f32", vec![w, &f]);
        Ok(Some(f))
    }

    fn elementwise(
        &self,
        f: Func,
        n: u64,
        args: KArgs,
        label: &'static str,
        keep: Vec<&Arc<DevMem>>,
    ) {
        self.launch_op(Launch {
            f,
            grid: (blocks(n, 256).min(self.gpu.n_sm * 16), 1, 1),
            block: 256,
            smem: 0,
            args,
            label,
            keep,
        });
    }

    pub(crate) fn fill_op(&self, buf: &CudaBuf, off: usize, len: usize, v: f32) -> Result<()> {
        let p = self.buf_of(buf, off + len, "fill")? + 4 * off as u64;
        let mut a = KArgs::default();
        a.push(p).push(len as i64).push(v);
        self.elementwise(self.k.fill_f32, len as u64, a, "fill", vec![&buf.mem]);
        Ok(())
    }

    pub(crate) fn swiglu_ref_op(
        &self,
        g: &CudaBuf,
        u: &CudaBuf,
        len: usize,
        limit: Option<f32>,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let mut a = KArgs::default();
        a.push(self.buf_of(g, len, "swiglu")?)
            .push(self.buf_of(u, len, "swiglu")?)
            .push(self.buf_of(out, len, "swiglu")?)
            .push(len as i64)
            .push(limit.unwrap_or(f32::INFINITY))
            .push(rb(p));
        self.elementwise(
            self.k.swiglu_ref,
            len as u64,
            a,
            "swiglu",
            vec![&g.mem, &u.mem, &out.mem],
        );
        Ok(())
    }

    pub(crate) fn add_round_op(&self, x: &CudaBuf, y: &CudaBuf, len: usize) -> Result<()> {
        let mut a = KArgs::default();
        a.push(self.buf_of(x, len, "add")?)
            .push(self.buf_of(y, len, "add")?)
            .push(len as i64)
            .push(1i32);
        self.elementwise(self.k.add_round, len as u64, a, "add", vec![&x.mem, &y.mem]);
        Ok(())
    }

    pub(crate) fn scale_sigmoid_op(
        &self,
        x: &CudaBuf,
        gate: &CudaBuf,
        rows: usize,
        cols: usize,
        gate_cols: usize,
        p: Prec,
    ) -> Result<()> {
        if gate_cols != 1 && gate_cols != cols {
            return Err(bad("scale_sigmoid: gate width"));
        }
        let mut a = KArgs::default();
        a.push(self.buf_of(x, rows * cols, "scale_sigmoid")?)
            .push(self.buf_of(gate, rows * gate_cols, "scale_sigmoid")?)
            .push(rows as i64)
            .push(cols as i32)
            .push(gate_cols as i32)
            .push(rb(p));
        self.elementwise(
            self.k.scale_sigmoid,
            (rows * cols) as u64,
            a,
            "scale_sigmoid",
            vec![&x.mem, &gate.mem],
        );
        Ok(())
    }

    pub(crate) fn embed_op(
        &self,
        step: &CudaStep,
        table: &CudaWeight,
        streams: usize,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let (mem, planes, ty, cols) = match table {
            CudaWeight::Matrix { mem, m, .. } => (mem, m.planes, m.ty, m.cols as usize),
            CudaWeight::Float { mem, ty, cols, .. } => (mem, [mem.ptr(), 0, 0, 0], *ty, *cols),
            _ => return Err(bad("embed: the table is not a matrix")),
        };
        let o = self.buf_of(out, step.n_tok * streams * cols, "embed")?;
        let mut a = KArgs::default();
        a.push(planes)
            .push(ty as i32)
            .push(cols as i32)
            .push(self.step_ptr())
            .push(streams as i32)
            .push(rb(p))
            .push(o);
        self.launch_op(Launch {
            f: self.k.embed_streams,
            grid: (step.n_tok as u32, 1, 1),
            block: 256,
            smem: 0,
            args: a,
            label: "embed",
            keep: vec![mem, &out.mem],
        });
        Ok(())
    }

    /// The references' RMSNorm: GLM-5.3's two roundings, or with `cast_once`
    /// DeepSeek-V4's one (see `rms_norm_ref` in kernels/norm.cu).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rms_norm_ref_op(
        &self,
        x: &CudaBuf,
        w: Option<&CudaWeight>,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        cast_once: bool,
        out: &CudaBuf,
    ) -> Result<()> {
        let mut keep = vec![&x.mem, &out.mem];
        let w = opt_values(w, cols, "rms_norm: weight", &mut keep)?;
        let a = NormRefArgs {
            x: self.buf_of(x, rows * cols, "rms_norm")?,
            w,
            out: self.buf_of(out, rows * cols, "rms_norm")?,
            cols: cols as i32,
            eps,
            rb: rb(p),
            cast_once: cast_once as i32,
        };
        self.record(
            Op::NormRef {
                a,
                rows: rows as u32,
            },
            &keep,
        );
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layer_norm_op(
        &self,
        x: &CudaBuf,
        w: &CudaWeight,
        b: &CudaWeight,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let (wm, wl) = w.values().map_err(weight_err)?;
        let (bm, bl) = b.values().map_err(weight_err)?;
        if wl != cols || bl != cols {
            return Err(bad("layer_norm: weight lengths"));
        }
        let a = LayerNormArgs {
            x: self.buf_of(x, rows * cols, "layer_norm")?,
            w: wm.ptr(),
            b: bm.ptr(),
            out: self.buf_of(out, rows * cols, "layer_norm")?,
            cols: cols as i32,
            eps,
            rb: rb(p),
            pad: 0,
        };
        self.record(
            Op::LayerNorm {
                a,
                rows: rows as u32,
            },
            &[&x.mem, wm, bm, &out.mem],
        );
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_route_op(
        &self,
        logits: &CudaBuf,
        rows: usize,
        bias: Option<&CudaWeight>,
        hash: Option<&CudaWeight>,
        r: &Routing,
        p: Prec,
        ids: &CudaBuf,
        weights: &CudaBuf,
    ) -> Result<()> {
        if r.n_expert > 1024 || r.n_used > 32 || r.n_group > 64 {
            return Err(bad(
                "moe_route: at most 1024 experts, 32 per token, 64 groups",
            ));
        }
        let mut keep = vec![&logits.mem, &ids.mem, &weights.mem];
        let bp = opt_values(bias, r.n_expert, "moe_route: bias", &mut keep)?;
        let (hp, vocab) = match hash {
            Some(h) => {
                let (m, len) = h.ints().map_err(weight_err)?;
                keep.push(m);
                (m.ptr(), (len / r.n_used.max(1)) as i32)
            }
            None => (0, 0),
        };
        let prm = RouteParams {
            logits: self.buf_of(logits, rows * r.n_expert, "moe_route")?,
            bias: bp,
            hash: hp,
            step: self.step_ptr(),
            ids: self.buf_of(ids, rows * r.n_used, "moe_route ids")?,
            weights: self.buf_of(weights, rows * r.n_used, "moe_route weights")?,
            rows: rows as i32,
            n_expert: r.n_expert as i32,
            k: r.n_used as i32,
            scoring: match r.scoring {
                Scoring::Sigmoid => 0,
                Scoring::Softmax => 1,
                Scoring::SqrtSoftplus => 2,
            },
            n_group: r.n_group as i32,
            topk_group: r.topk_group as i32,
            norm: r.norm as i32,
            rb: rb(p),
            vocab,
            scale: r.scale,
        };
        if rows == 1 {
            let counter = self.scratch_mem("route_counter", 4)?;
            keep.push(&counter);
            self.record(
                Op::MoeRoute {
                    p: prm,
                    counter: counter.ptr(),
                },
                &keep,
            );
            return Ok(());
        }
        self.launch_op(Launch {
            f: self.k.moe_route,
            grid: (rows as u32, 1, 1),
            block: 256,
            smem: 0,
            args: Self::args(prm),
            label: "moe_route",
            keep,
        });
        Ok(())
    }

    /// Blocks along the rows of an expert launch `f` over `pairs` (token, expert) pairs:
    /// the block slots the device holds resident shared among the pairs (a block
    /// quantizes its input once, so more rows per block is less repeated work), at least
    /// one and at most one per 8 rows.
    fn expert_grid_x(&self, f: Func, smem: u32, rows: usize, pairs: usize) -> u32 {
        let slots = self.gpu.n_sm * self.gpu.occupancy(f, 256, smem).max(1);
        (slots / pairs.max(1) as u32).clamp(1, blocks(rows as u64, 8))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_experts_op(
        &self,
        x: &CudaBuf,
        rows: usize,
        ids: &CudaBuf,
        weights: &CudaBuf,
        k: usize,
        ex: &Experts<'_, CudaWeight>,
        limit: Option<f32>,
        wp: Prec,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let lim = limit.unwrap_or(f32::INFINITY);
        let (ff, d) = match (ex.gate, ex.down) {
            (CudaWeight::Matrix { m, .. }, CudaWeight::Matrix { m: md, .. }) => {
                (m.rows as usize, md.rows as usize)
            }
            (CudaWeight::Float { rows, cols, .. }, CudaWeight::Float { .. }) => (*rows, *cols),
            _ => {
                return Err(bad(
                    "moe_experts: gate and down must both be quantized or float",
                ));
            }
        };
        let pairs = rows * k;
        let h = self.scratch_mem("moe_h", pairs * ff * 4)?;
        let y = self.scratch_mem("moe_y", pairs * d * 4)?;
        let xp = self.buf_of(x, rows * d, "moe_experts")?;
        let idp = self.buf_of(ids, pairs, "moe_experts ids")?;
        match (ex.gate, ex.up, ex.down) {
            (
                CudaWeight::Matrix {
                    mem: gm,
                    m: g,
                    estride: gs,
                    n: n_expert,
                },
                CudaWeight::Matrix {
                    mem: um,
                    m: u,
                    estride: us,
                    ..
                },
                CudaWeight::Matrix {
                    mem: dm,
                    m: dmat,
                    estride: ds,
                    ..
                },
            ) => {
                let n_expert = *n_expert as usize;
                if rows >= MMA_MIN_ROWS && n_expert <= MM_MAX_E && d % 32 == 0 && ff % 32 == 0 {
                    let sorted =
                        self.scratch_mem("moe_sorted", (2 * (n_expert + 1) + pairs) * 4)?;
                    let s = MoeSorted {
                        offs: sorted.ptr(),
                        tiles: sorted.ptr() + 4 * (n_expert as u64 + 1),
                        perm: sorted.ptr() + 8 * (n_expert as u64 + 1),
                    };
                    let mut a = KArgs::default();
                    a.push(idp).push(pairs as i32).push(n_expert as i32).push(s);
                    self.launch_op(Launch {
                        f: self.k.moe_sort,
                        grid: (1, 1, 1),
                        block: 1024,
                        smem: 0,
                        args: a,
                        label: "experts_sort",
                        keep: vec![&ids.mem, &sorted],
                    });
                    // The tokens in bf16 once (the products' input precision) rather
                    // than by every block that reads them.
                    let xb = self.scratch_mem("moe_x_bf16", rows * d * 2)?;
                    let mut a = KArgs::default();
                    a.push(xp).push(xb.ptr()).push((rows * d) as i64);
                    self.elementwise(
                        self.k.f32_to_bf16,
                        (rows * d) as u64,
                        a,
                        "experts_x_bf16",
                        vec![&x.mem, &xb],
                    );
                    let tiles = (pairs.div_ceil(MM_TM) + n_expert) as u32;
                    let mm = |w: &MatRef,
                              ws: &[u64; 4],
                              w2: &MatRef,
                              ws2: &[u64; 4],
                              x,
                              out,
                              n_in,
                              n_out| MoeMma {
                        w: w.planes,
                        w2: w2.planes,
                        estride: ws.map(|v| v as i64),
                        estride2: ws2.map(|v| v as i64),
                        ty: w.ty as i32,
                        ty2: w2.ty as i32,
                        x,
                        s,
                        out,
                        k: k as i32,
                        n_expert: n_expert as i32,
                        n_in: n_in as i32,
                        rows: n_out as i32,
                        rb: rb(p),
                        lim,
                    };
                    // The typed kernel when gate and up share a type that has one.
                    let gate_up_ty = if g.ty == u.ty { g.ty as u32 } else { u32::MAX };
                    self.launch_op(Launch {
                        f: self.k.moe_mma_for::<false>(gate_up_ty),
                        grid: (ff.div_ceil(MM_TN_GATE_UP) as u32, tiles, 1),
                        block: 128,
                        smem: 0,
                        args: Self::args(mm(g, gs, u, us, xb.ptr(), h.ptr(), d, ff)),
                        label: "experts_gate_up_mma",
                        keep: vec![gm, um, &xb, &sorted, &h],
                    });
                    self.launch_op(Launch {
                        f: self.k.moe_mma_for::<true>(dmat.ty as u32),
                        grid: (d.div_ceil(MM_TN_DOWN) as u32, tiles, 1),
                        block: 256,
                        smem: 0,
                        args: Self::args(mm(dmat, ds, dmat, ds, h.ptr(), y.ptr(), ff, d)),
                        label: "experts_down_mma",
                        keep: vec![dm, &sorted, &h, &y],
                    });
                    return self.moe_reduce(&y, ids, weights, rows, k, d, wp, p, out);
                }
                let gu = ExpertGemv {
                    pad: 0,
                    w: g.planes,
                    w2: u.planes,
                    estride: gs.map(|v| v as i64),
                    estride2: us.map(|v| v as i64),
                    ty: g.ty as i32,
                    ty2: u.ty as i32,
                    x: xp,
                    x_tstride: d as i32,
                    ids: idp,
                    k: k as i32,
                    n_in: d as i32,
                    rows: ff as i32,
                    need: act_need(g.ty) | act_need(u.ty),
                    rb: rb(p),
                    lim,
                    out: h.ptr(),
                };
                let typed = self.gemv_typed.load(Ordering::Relaxed);
                let [f_gate_up, ..] = self.k.experts_for(g.ty as u32, typed && g.ty == u.ty);
                let [_, f_down, f_down_sum] = self.k.experts_for(dmat.ty as u32, typed);
                let smem = gemv_smem_bytes(d, gu.need) as u32;
                self.launch_op(Launch {
                    f: f_gate_up,
                    grid: (
                        self.expert_grid_x(f_gate_up, smem, ff, pairs),
                        pairs as u32,
                        1,
                    ),
                    block: 256,
                    smem,
                    args: Self::args(gu),
                    label: "experts_gate_up",
                    keep: vec![gm, um, &x.mem, &ids.mem, &h],
                });
                let dn = ExpertGemv {
                    pad: 0,
                    w: dmat.planes,
                    w2: dmat.planes,
                    estride: ds.map(|v| v as i64),
                    estride2: ds.map(|v| v as i64),
                    ty: dmat.ty as i32,
                    ty2: dmat.ty as i32,
                    x: h.ptr(),
                    x_tstride: ff as i32,
                    ids: idp,
                    k: k as i32,
                    n_in: ff as i32,
                    rows: d as i32,
                    need: act_need(dmat.ty),
                    rb: rb(p),
                    lim,
                    out: y.ptr(),
                };
                let smem = gemv_smem_bytes(ff, dn.need) as u32;
                if rows == 1 {
                    // Down products, weighted sum (and the add after it) in one launch.
                    let grid_x = self.expert_grid_x(f_down_sum, smem, d, pairs);
                    let counters = self.scratch_mem("experts_counters", grid_x as usize * 4)?;
                    let tail = ReduceTail {
                        w: self.buf_of(weights, pairs, "moe_experts weights")?,
                        out: self.buf_of(out, d, "moe_experts out")?,
                        add: 0,
                        counters: counters.ptr(),
                        rb: rb(p),
                        wrb: rb(wp),
                    };
                    self.record(
                        Op::ExpertsDown {
                            e: dn,
                            tail,
                            grid_x,
                            smem,
                        },
                        &[dm, &ids.mem, &h, &y, &weights.mem, &out.mem, &counters],
                    );
                    return Ok(());
                }
                self.launch_op(Launch {
                    f: f_down,
                    grid: (self.expert_grid_x(f_down, smem, d, pairs), pairs as u32, 1),
                    block: 256,
                    smem,
                    args: Self::args(dn),
                    label: "experts_down",
                    keep: vec![dm, &ids.mem, &h, &y],
                });
            }
            (CudaWeight::Float { .. }, CudaWeight::Float { .. }, CudaWeight::Float { .. }) => {
                let (gm, gty, _, _, _) = float_mat(ex.gate)?;
                let (um, uty, _, _, _) = float_mat(ex.up)?;
                let (dm, dty, _, _, _) = float_mat(ex.down)?;
                if gty != uty {
                    return Err(bad("moe_experts: gate and up of different types"));
                }
                let gu = FloatExperts {
                    pad: 0,
                    w: gm.ptr(),
                    w2: um.ptr(),
                    w_gstride: (ff * d) as i64,
                    x: xp,
                    x_tstride: d as i64,
                    ids: idp,
                    out: h.ptr(),
                    ty: gty as i32,
                    k: k as i32,
                    n_in: d as i32,
                    rows: ff as i32,
                    rb: rb(p),
                    pair: 1,
                    lim,
                };
                self.launch_op(Launch {
                    f: self.k.gemv_float_experts,
                    grid: (blocks(ff as u64, 8), pairs as u32, 1),
                    block: 256,
                    smem: 0,
                    args: Self::args(gu),
                    label: "experts_gate_up",
                    keep: vec![gm, um, &x.mem, &ids.mem, &h],
                });
                let dn = FloatExperts {
                    pad: 0,
                    w: dm.ptr(),
                    w2: dm.ptr(),
                    w_gstride: (d * ff) as i64,
                    x: h.ptr(),
                    x_tstride: ff as i64,
                    ids: idp,
                    out: y.ptr(),
                    ty: dty as i32,
                    k: k as i32,
                    n_in: ff as i32,
                    rows: d as i32,
                    rb: rb(p),
                    pair: 0,
                    lim,
                };
                self.launch_op(Launch {
                    f: self.k.gemv_float_experts,
                    grid: (blocks(d as u64, 8), pairs as u32, 1),
                    block: 256,
                    smem: 0,
                    args: Self::args(dn),
                    label: "experts_down",
                    keep: vec![dm, &ids.mem, &h, &y],
                });
            }
            _ => return Err(bad("moe_experts: mixed quantized and float experts")),
        }
        self.moe_reduce(&y, ids, weights, rows, k, d, wp, p, out)
    }

    /// `out[t] = Σ_j w[t, j]·y[t, j]` over the token's experts in expert-id order, each
    /// weighted output rounded by `wp`.
    #[allow(clippy::too_many_arguments)]
    fn moe_reduce(
        &self,
        y: &Arc<DevMem>,
        ids: &CudaBuf,
        weights: &CudaBuf,
        rows: usize,
        k: usize,
        d: usize,
        wp: Prec,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let pairs = rows * k;
        let idp = self.buf_of(ids, pairs, "moe_experts ids")?;
        let mut a = KArgs::default();
        a.push(y.ptr())
            .push(idp)
            .push(self.buf_of(weights, pairs, "moe_experts weights")?)
            .push(self.buf_of(out, rows * d, "moe_experts out")?)
            .push(rows as i32)
            .push(k as i32)
            .push(d as i32)
            .push(rb(p))
            .push(rb(wp));
        self.launch_op(Launch {
            f: self.k.moe_reduce,
            grid: (blocks((rows * d) as u64, 256), 1, 1),
            block: 256,
            smem: 0,
            args: a,
            label: "experts_sum",
            keep: vec![y, &ids.mem, &weights.mem, &out.mem],
        });
        Ok(())
    }

    /// `m = fn · (x / rms(x))` per token into scratch `key` (`[rows, m_rows]`): `hc_rms`,
    /// then `hc_mixes` with its columns split over enough blocks for two per SM (the
    /// splits' double sums are added in a fixed order: the result depends on the shape,
    /// never on timing).
    fn hc_mixes(
        &self,
        x: &CudaBuf,
        rows: usize,
        fn_: &CudaWeight,
        s: &HcShape,
        key: &'static str,
    ) -> Result<(Arc<DevMem>, usize)> {
        let nd = s.n * s.d;
        let (fm, len) = fn_.values().map_err(weight_err)?;
        if len % nd != 0 {
            return Err(bad("hc: fn is not [·, N·D]"));
        }
        let n_mix = len / nd;
        let m = self.scratch_mem(key, rows * n_mix * 4)?;
        let r = self.scratch_mem("hc_rms", rows * 4)?;
        let xp = self.buf_of(x, rows * nd, "hc")?;
        let mut a = KArgs::default();
        a.push(xp).push(r.ptr()).push(nd as i32).push(s.norm_eps);
        self.launch_op(Launch {
            f: self.k.hc_rms,
            grid: (rows as u32, 1, 1),
            block: 256,
            smem: 0,
            args: a,
            label: "hc_rms",
            keep: vec![&x.mem, &r],
        });
        let tiles = (rows.div_ceil(HC_MIX_TOKENS), n_mix.div_ceil(HC_MIX_ROWS));
        let n_steps = nd.div_ceil(HC_MIX_COLS);
        let want = (2 * self.gpu.n_sm as usize).div_ceil(tiles.0 * tiles.1);
        let steps = n_steps.div_ceil(want.clamp(1, n_steps));
        let splits = n_steps.div_ceil(steps);
        let part = self.scratch_mem("hc_mix_part", splits * rows * n_mix * 8)?;
        let count = self.scratch_mem("hc_mix_count", tiles.0 * tiles.1 * 4)?;
        let mut a = KArgs::default();
        a.push(xp)
            .push(r.ptr())
            .push(fm.ptr())
            .push(m.ptr())
            .push(part.ptr())
            .push(count.ptr())
            .push(rows as i32)
            .push(nd as i32)
            .push(n_mix as i32)
            .push(steps as i32);
        self.launch_op(Launch {
            f: self.k.hc_mixes,
            grid: (tiles.0 as u32, tiles.1 as u32, splits as u32),
            block: 256,
            smem: 0,
            args: a,
            label: "hc_mixes",
            keep: vec![&x.mem, &r, fm, &m, &part, &count],
        });
        Ok((m, n_mix))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn hc_pre_op(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &HcWeights<'_, CudaWeight>,
        s: &HcShape,
        p: Prec,
        out: &CudaBuf,
        mix: &CudaBuf,
    ) -> Result<()> {
        if s.n > 8 {
            return Err(bad("hc_pre: at most 8 streams"));
        }
        let (bm, _) = w.base.values().map_err(weight_err)?;
        let (sm, _) = w.scale.values().map_err(weight_err)?;
        let nd = s.n * s.d;
        let n_mix = (2 + s.n) * s.n;
        if rows == 1 {
            let (fm, len) = w.fn_.values().map_err(weight_err)?;
            if len != n_mix * nd {
                return Err(bad("hc_pre: fn is not [(2 + N)·N, N·D]"));
            }
            let m = self.scratch_mem("hc_m", n_mix * 4)?;
            // Arrivals and a generation in one word: `hc_post_pre`'s grid barrier
            // (kernels/common.cuh `grid_sync`), `hc_pre_one`'s arrivals.
            let counter = self.scratch_mem("hc_counter", 4)?;
            let partials =
                self.scratch_mem("hc_partials", s.d.div_ceil(HC_COLS) * (n_mix + 1) * 8)?;
            let args = HcPreArgs {
                fn_: fm.ptr(),
                m: m.ptr(),
                partials: partials.ptr(),
                counter: counter.ptr(),
                base: bm.ptr(),
                scale: sm.ptr(),
                out: self.buf_of(out, s.d, "hc_pre")?,
                mix: self.buf_of(mix, s.mix_len(), "hc_pre mix")?,
                n: s.n as i32,
                d: s.d as i32,
                iters: s.iters as i32,
                rb: rb(p),
                eps: s.eps,
                norm_eps: s.norm_eps,
            };
            let xp = self.buf_of(x, nd, "hc_pre")?;
            self.record(
                Op::HcPre { x: xp, args },
                &[
                    &x.mem, fm, &m, &counter, &partials, bm, sm, &out.mem, &mix.mem,
                ],
            );
            return Ok(());
        }
        let (m, got) = self.hc_mixes(x, rows, w.fn_, s, "hc_m")?;
        if got != n_mix {
            return Err(bad("hc_pre: fn rows"));
        }
        let mut a = KArgs::default();
        a.push(m.ptr())
            .push(self.buf_of(x, rows * s.n * s.d, "hc_pre")?)
            .push(bm.ptr())
            .push(sm.ptr())
            .push(self.buf_of(out, rows * s.d, "hc_pre")?)
            .push(self.buf_of(mix, rows * s.mix_len(), "hc_pre mix")?)
            .push(s.n as i32)
            .push(s.d as i32)
            .push(s.iters as i32)
            .push(s.eps)
            .push(rb(p));
        self.launch_op(Launch {
            f: self.k.hc_pre_finish,
            grid: (rows as u32, 1, 1),
            block: 256,
            smem: 0,
            args: a,
            label: "hc_pre",
            keep: vec![&m, &x.mem, bm, sm, &out.mem, &mix.mem],
        });
        Ok(())
    }

    pub(crate) fn hc_post_op(
        &self,
        x: &CudaBuf,
        y: &CudaBuf,
        mix: &CudaBuf,
        rows: usize,
        s: &HcShape,
        p: Prec,
    ) -> Result<()> {
        if rows == 1 {
            let args = HcPostArgs {
                pad: 0,
                x: self.buf_of(x, s.n * s.d, "hc_post")?,
                y: self.buf_of(y, s.d, "hc_post")?,
                mix: self.buf_of(mix, s.mix_len(), "hc_post")?,
                n: s.n as i32,
                d: s.d as i32,
                rb: rb(p),
            };
            self.record(Op::HcPost(args), &[&x.mem, &y.mem, &mix.mem]);
            return Ok(());
        }
        let mut a = KArgs::default();
        a.push(self.buf_of(x, rows * s.n * s.d, "hc_post")?)
            .push(self.buf_of(y, rows * s.d, "hc_post")?)
            .push(self.buf_of(mix, rows * s.mix_len(), "hc_post")?)
            .push(rows as i32)
            .push(s.n as i32)
            .push(s.d as i32)
            .push(rb(p));
        self.launch_op(Launch {
            f: self.k.hc_post,
            grid: (blocks((rows * s.d) as u64, 256), 1, 1),
            block: 256,
            smem: 0,
            args: a,
            label: "hc_post",
            keep: vec![&x.mem, &y.mem, &mix.mem],
        });
        Ok(())
    }

    pub(crate) fn hc_head_op(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: Option<&HcWeights<'_, CudaWeight>>,
        s: &HcShape,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let mut keep = vec![&x.mem, &out.mem];
        let learned = match w {
            Some(w) => {
                let (m, _) = self.hc_mixes(x, rows, w.fn_, s, "hc_head_m")?;
                let (bm, _) = w.base.values().map_err(weight_err)?;
                let (sm, _) = w.scale.values().map_err(weight_err)?;
                Some((m, bm, sm))
            }
            None => None,
        };
        let (mp, bp, sp) = learned
            .as_ref()
            .map_or((0, 0, 0), |(m, b, s)| (m.ptr(), b.ptr(), s.ptr()));
        if let Some((m, b, sc)) = &learned {
            keep.extend([m, *b, *sc]);
        }
        let mut a = KArgs::default();
        a.push(self.buf_of(x, rows * s.n * s.d, "hc_head")?)
            .push(mp)
            .push(bp)
            .push(sp)
            .push(self.buf_of(out, rows * s.d, "hc_head")?)
            .push(rows as i32)
            .push(s.n as i32)
            .push(s.d as i32)
            .push(s.eps)
            .push(rb(p));
        self.launch_op(Launch {
            f: self.k.hc_head,
            grid: (blocks((rows * s.d) as u64, 256), 1, 1),
            block: 256,
            smem: 0,
            args: a,
            label: "hc_head",
            keep,
        });
        Ok(())
    }

    /// The recurrence for key heads of `dk`: the forward's and the journal replay's.
    fn delta_fns(&self, dk: usize) -> Result<(Func, Func)> {
        let k = &self.k;
        // The smallest compiled size that holds dk (the kernels pad the rest).
        match dk {
            0 => Err(bad("delta_net: key heads of 0")),
            1..=16 => Ok((k.delta_recurrent_16, k.delta_replay_16)),
            17..=32 => Ok((k.delta_recurrent_32, k.delta_replay_32)),
            33..=64 => Ok((k.delta_recurrent_64, k.delta_replay_64)),
            65..=128 => Ok((k.delta_recurrent_128, k.delta_replay_128)),
            _ => Err(EngineError::Unsupported {
                backend: "cuda",
                what: format!("delta-rule key heads of {dk} (at most 128 are compiled)"),
            }),
        }
    }

    fn delta_common(sh: &DeltaShape, p: Prec) -> DeltaParams {
        DeltaParams {
            hk: sh.k_heads as i32,
            hv: sh.v_heads as i32,
            dk: sh.k_dim as i32,
            dv: sh.v_dim as i32,
            kc: sh.kernel as i32,
            gc: sh.gate_channels as i32,
            gate: matches!(sh.gate, Gate::Softplus) as i32,
            lb: match sh.gate {
                Gate::LowerBound(lb) => lb,
                Gate::Softplus => 0.0,
            },
            rb: rb(p),
            ..DeltaParams::default()
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn delta_net_op(
        &self,
        rows: Range<usize>,
        x: &DeltaIn<'_, CudaBackend>,
        w: &DeltaWeights<'_, CudaWeight>,
        state: &mut DeltaState<'_, CudaBackend>,
        journal: Option<&mut DeltaJournal<CudaBackend>>,
        sh: &DeltaShape,
        _form: DeltaForm,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let n = rows.len();
        if n == 0 {
            return Ok(());
        }
        if sh.kernel > 9 || sh.v_dim > 256 || sh.k_dim > 256 {
            return Err(bad("delta_net: conv kernel ≤ 9, heads ≤ 256"));
        }
        let (recurrent, _) = self.delta_fns(sh.k_dim)?;
        let (qk, vl, gl) = (sh.qk_len(), sh.v_len(), sh.g_len());
        let c = 2 * qk + vl;
        let end = rows.end;
        let mixed = self.scratch_mem("delta_mixed", n * c * 4)?;
        let kq = self.scratch_mem("delta_q", n * qk * 4)?;
        let kk = self.scratch_mem("delta_k", n * qk * 4)?;
        let kv = self.scratch_mem("delta_v", n * vl * 4)?;
        let kg = self.scratch_mem("delta_g", n * gl * 4)?;
        let kb = self.scratch_mem("delta_b", n * sh.v_heads * 4)?;
        let (cq, _) = w.conv[0].values().map_err(weight_err)?;
        let (ck, _) = w.conv[1].values().map_err(weight_err)?;
        let (cv, _) = w.conv[2].values().map_err(weight_err)?;
        let (dt, _) = w.dt_bias.values().map_err(weight_err)?;
        let (dc, _) = w.decay.values().map_err(weight_err)?;
        let mut prm = DeltaParams {
            q: self.buf_of(x.q, end * qk, "delta_net q")?,
            k: self.buf_of(x.k, end * qk, "delta_net k")?,
            v: self.buf_of(x.v, end * vl, "delta_net v")?,
            g0: self.buf_of(x.g, end * gl, "delta_net g")?,
            b: self.buf_of(x.beta, end * sh.v_heads, "delta_net beta")?,
            conv_w: [cq.ptr(), ck.ptr(), cv.ptr()],
            dt_bias: dt.ptr(),
            decay: dc.ptr(),
            conv_state: self.buf_of(state.conv, sh.conv_len(), "delta_net conv state")?,
            mixed: mixed.ptr(),
            kq: kq.ptr(),
            kk: kk.ptr(),
            kv: kv.ptr(),
            kg: kg.ptr(),
            kb: kb.ptr(),
            step: self.step_ptr(),
            out: self.buf_of(out, end * vl, "delta_net out")?,
            s: self.buf_of(state.s, sh.state_len(), "delta_net state")?,
            row0: rows.start as i32,
            n: n as i32,
            ..Self::delta_common(sh, p)
        };
        let mut keep: Vec<&Arc<DevMem>> = vec![
            &x.q.mem,
            &x.k.mem,
            &x.v.mem,
            &x.g.mem,
            &x.beta.mem,
            cq,
            ck,
            cv,
            dt,
            dc,
            &state.conv.mem,
            &state.s.mem,
            &mixed,
            &kq,
            &kk,
            &kv,
            &kg,
            &kb,
            &out.mem,
        ];
        if let Some(j) = journal.as_deref() {
            prm.jpre = self.buf_of(&j.pre, j.cap * c, "journal")?;
            prm.jk = self.buf_of(&j.k, j.cap * qk, "journal")?;
            prm.jv = self.buf_of(&j.v, j.cap * vl, "journal")?;
            prm.jg = self.buf_of(&j.g, j.cap * gl, "journal")?;
            prm.jb = self.buf_of(&j.beta, j.cap * sh.v_heads, "journal")?;
            prm.cap = j.cap as i32;
            keep.extend([&j.pre.mem, &j.k.mem, &j.v.mem, &j.g.mem, &j.beta.mem]);
        }
        let threads = (sh
            .k_dim
            .max(sh.v_dim)
            .max(sh.gate_channels)
            .next_multiple_of(32)) as u32;
        // One token with a value head per key head: the whole step in one launch, the
        // head's state in shared memory.
        if n == 1
            && sh.k_heads == sh.v_heads
            && sh.gate_channels <= sh.k_dim
            && sh.kernel <= DELTA_STEP_KC
            && 4 * sh.k_dim * sh.v_dim <= self.k.delta_step_smem
        {
            self.record(
                Op::DeltaStep {
                    p: prm,
                    block: threads,
                },
                &keep,
            );
            return Ok(());
        }
        let launches = [
            (
                self.k.delta_conv,
                (n as u32, blocks(c as u64, 256), 1),
                256,
                "delta_conv",
            ),
            (
                self.k.delta_inputs,
                (n as u32, sh.v_heads as u32, 1),
                threads,
                "delta_inputs",
            ),
            (
                self.k.delta_conv_state,
                (blocks(c as u64, 256), 1, 1),
                256,
                "delta_conv_state",
            ),
            (
                recurrent,
                (sh.v_heads as u32, rec_blocks(sh.v_dim), 1),
                rec_threads(sh.v_dim),
                "delta_recurrent",
            ),
        ];
        for (f, grid, block, label) in launches {
            self.launch_op(Launch {
                f,
                grid,
                block,
                smem: 0,
                args: Self::args(prm),
                label,
                keep: keep.clone(),
            });
        }
        Ok(())
    }

    /// The journal replays of several layers (journals of one capacity): their conv
    /// states and recurrences, up to [`REPLAY_LAYERS`] layers a launch (the fold of
    /// GLM-5.3's 34 KDA layers was 68 launches in sequence, each too small to fill the
    /// device). Every layer is checked before the first launch.
    pub(crate) fn delta_replay_op(
        &self,
        layers: &mut [DeltaReplay<'_, CudaBackend>],
        range: Range<usize>,
        sh: &DeltaShape,
    ) -> Result<()> {
        let n = range.len();
        let Some(first) = layers.first() else {
            return Ok(());
        };
        if n == 0 {
            return Ok(());
        }
        let cap = first.journal.cap;
        if n > cap {
            return Err(bad(format!(
                "delta_replay of {n} tokens from a journal of {cap}"
            )));
        }
        if layers.iter().any(|l| l.journal.cap != cap) {
            return Err(bad("delta_replay: journals of different capacities"));
        }
        let (dk, k) = (sh.k_dim, &self.k);
        let (_, recurrent) = self.delta_fns(dk)?;
        let (qk, vl, gl) = (sh.qk_len(), sh.v_len(), sh.g_len());
        let c = 2 * qk + vl;
        let mut launches = Vec::with_capacity(layers.len().div_ceil(REPLAY_LAYERS));
        for group in layers.chunks(REPLAY_LAYERS) {
            let mut prm = ReplayParams {
                n: n as i32,
                hk: sh.k_heads as i32,
                hv: sh.v_heads as i32,
                dk: dk as i32,
                dv: sh.v_dim as i32,
                kc: sh.kernel as i32,
                gc: sh.gate_channels as i32,
                cap: cap as i32,
                pos: range.start as i32,
                ..ReplayParams::default()
            };
            let mut keep = Vec::with_capacity(7 * group.len());
            for (slot, l) in prm.layer.iter_mut().zip(group) {
                let (j, st) = (l.journal, &l.state);
                *slot = ReplayLayer {
                    conv_state: self.buf_of(st.conv, sh.conv_len(), "delta_replay")?,
                    pre: self.buf_of(&j.pre, cap * c, "journal")?,
                    k: self.buf_of(&j.k, cap * qk, "journal")?,
                    v: self.buf_of(&j.v, cap * vl, "journal")?,
                    g: self.buf_of(&j.g, cap * gl, "journal")?,
                    beta: self.buf_of(&j.beta, cap * sh.v_heads, "journal")?,
                    s: self.buf_of(st.s, sh.state_len(), "delta_replay")?,
                };
                keep.extend([
                    &j.pre.mem,
                    &j.k.mem,
                    &j.v.mem,
                    &j.g.mem,
                    &j.beta.mem,
                    &st.conv.mem,
                    &st.s.mem,
                ]);
            }
            launches.push((prm, group.len() as u32, keep));
        }
        for (prm, z, keep) in launches {
            self.launch_op(Launch {
                f: k.delta_replay_conv,
                grid: (blocks(c as u64, 256), z, 1),
                block: 256,
                smem: 0,
                args: Self::args(prm),
                label: "delta_replay_conv",
                keep: keep.clone(),
            });
            self.launch_op(Launch {
                f: recurrent,
                grid: (sh.v_heads as u32, rec_blocks(sh.v_dim), z),
                block: rec_threads(sh.v_dim),
                smem: 0,
                args: Self::args(prm),
                label: "delta_replay",
                keep,
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_norm_op(
        &self,
        o: &CudaBuf,
        z: &CudaBuf,
        w: &CudaWeight,
        rows: usize,
        sh: &DeltaShape,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let (wm, len) = w.values().map_err(weight_err)?;
        if len != sh.v_dim {
            return Err(bad("gated_norm: weight length"));
        }
        let n = rows * sh.v_len();
        self.record(
            Op::GatedNorm(GatedNormArgs {
                o: self.buf_of(o, n, "gated_norm")?,
                z: self.buf_of(z, n, "gated_norm")?,
                w: wm.ptr(),
                out: self.buf_of(out, n, "gated_norm")?,
                heads: (rows * sh.v_heads) as i64,
                dv: sh.v_dim as i32,
                eps: sh.eps,
                silu: (sh.out_gate == OutGate::Silu) as i32,
                rb: rb(p),
            }),
            &[&o.mem, &z.mem, wm, &out.mem],
        );
        Ok(())
    }

    pub(crate) fn store_rows_op(
        &self,
        src: &CudaBuf,
        rows: usize,
        row_len: usize,
        dst: &CudaBuf,
        cap: usize,
    ) -> Result<()> {
        if rows > cap {
            return Err(bad("store_rows: more rows than slots"));
        }
        let a = StoreRowsArgs {
            step: self.step_ptr(),
            src: self.buf_of(src, rows * row_len, "store_rows")?,
            dst: self.buf_of(dst, cap * row_len, "store_rows")?,
            rows: rows as i32,
            row_len: row_len as i32,
            cap: cap as i32,
            pad: 0,
        };
        let grid = blocks((rows * row_len) as u64, 256).min(self.gpu.n_sm * 16);
        self.record(Op::StoreRows { a, grid }, &[&src.mem, &dst.mem]);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn compress_op(
        &self,
        step: &CudaStep,
        rows: [&CudaBuf; 2],
        ring: [&CudaBuf; 2],
        cap: usize,
        ape: &CudaWeight,
        norm: Option<&CudaWeight>,
        rope: Option<&Rope>,
        sh: &CompressShape,
        p: Prec,
        entries: &CudaBuf,
    ) -> Result<()> {
        let rl = sh.row_len();
        if sh.rate > 256 || (sh.overlap && sh.rate > 128) {
            return Err(bad("compress: windows of at most 256 slots"));
        }
        if step.n_tok > cap {
            return Err(bad("compress: more rows than ring slots"));
        }
        let ([src_kv, src_gate], [kv, gate]) = (rows, ring);
        let (am, al) = ape.values().map_err(weight_err)?;
        if al != sh.rate * rl {
            return Err(bad("compress: ape shape"));
        }
        let mut keep = vec![
            &src_kv.mem,
            &src_gate.mem,
            &kv.mem,
            &gate.mem,
            am,
            &entries.mem,
        ];
        let np = opt_values(norm, sh.dim, "compress: norm", &mut keep)?;
        let inv = rope.map(|r| self.rope_table(r)).transpose()?;
        if let Some(m) = &inv {
            keep.push(m);
        }
        let prm = CompressParams {
            step: self.step_ptr(),
            src_kv: self.buf_of(src_kv, step.n_tok * rl, "compress kv rows")?,
            src_gate: self.buf_of(src_gate, step.n_tok * rl, "compress gate rows")?,
            kv: self.buf_of(kv, cap * rl, "compress kv")?,
            gate: self.buf_of(gate, cap * rl, "compress gate")?,
            ape: am.ptr(),
            norm: np,
            entries: entries.ptr(),
            inv_freq: inv.as_ref().map_or(0, |m| m.ptr()),
            cap: cap as i32,
            m: sh.rate as i32,
            c: sh.dim as i32,
            overlap: sh.overlap as i32,
            rope_dims: rope.map_or(0, |r| r.n_dims as i32),
            rb: rb(p),
            eps: sh.norm_eps,
            mscale: rope.and_then(|r| r.yarn).map_or(1.0, |y| y.mscale),
            ln: LayerNormArgs::default(),
        };
        self.record(
            Op::Compress {
                p: prm,
                // A block per window that may close, and enough for the stores (1024
                // values per block).
                blocks: (step.n_tok / sh.rate + 2).max((step.n_tok * rl).div_ceil(1024)) as u32,
                // A thread per entry value (a window's values each take its slots one
                // after another: with 128 threads, DeepSeek-V4's 512 took four in a row
                // per thread).
                block: (sh.dim as u32).next_multiple_of(32).clamp(128, 1024),
            },
            &keep,
        );
        Ok(())
    }

    /// transformers' rope of `n_head` heads of `head_dim` values of the step's rows (the
    /// frequency table uploaded once per rope).
    pub(crate) fn rope_torch_op(
        &self,
        rope: &Rope,
        n_head: usize,
        head_dim: usize,
        n_tok: usize,
        p: Prec,
        x: &CudaBuf,
    ) -> Result<()> {
        if rope.n_dims > head_dim || !rope.n_dims.is_multiple_of(2) {
            return Err(bad(format!(
                "rope: {} rotated dimensions of heads of {head_dim}",
                rope.n_dims
            )));
        }
        let inv = self.rope_table(rope)?;
        let a = RopeTorchArgs {
            x: self.buf_of(x, n_tok * n_head * head_dim, "rope")?,
            step: self.step_ptr(),
            inv_freq: inv.ptr(),
            n_head: n_head as i32,
            head_dim: head_dim as i32,
            n_dims: rope.n_dims as i32,
            neox: rope.neox as i32,
            trailing: rope.trailing as i32,
            sign: if rope.inverse { -1.0 } else { 1.0 },
            mscale: rope.yarn.map_or(1.0, |y| y.mscale),
            rb: rb(p),
        };
        self.record(
            Op::RopeTorch {
                a,
                n_tok: n_tok as u32,
            },
            &[&x.mem, &inv],
        );
        Ok(())
    }

    /// DeepSeek-V4's attention (kernels/sparse.cu): `sink_scores` writes every (row, head,
    /// key) score to scratch, reading each key once per 16 heads; `sink_mix` takes each
    /// head's softmax and weighted sum of the keys.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sink_attention_op(
        &self,
        step: &CudaStep,
        q: &CudaBuf,
        kv: &CudaBuf,
        window: &CudaBuf,
        cap: usize,
        entries: Option<(&CudaBuf, Option<&CudaBuf>)>,
        sinks: &CudaWeight,
        rows: usize,
        sh: &SinkAttnShape,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let (h, hd) = (sh.heads, sh.head_dim);
        if cap + 1 < sh.window && step.pos0 > 0 {
            return Err(bad(format!(
                "sink_attention: a ring of {cap} rows cannot hold a window of {}",
                sh.window
            )));
        }
        let (sm, sl) = sinks.values().map_err(weight_err)?;
        if sl != h {
            return Err(bad("sink_attention: one sink per head"));
        }
        let mut keep = vec![&q.mem, &kv.mem, &window.mem, sm, &out.mem];
        let (ep, selp, n_ent) = match entries {
            Some((e, sel)) if sh.rate > 0 => {
                keep.push(&e.mem);
                let n = match sel {
                    Some(ids) => {
                        keep.push(&ids.mem);
                        sh.per_query
                    }
                    None => e.len / hd,
                };
                let selp = sel
                    .map(|ids| self.buf_of(ids, rows * sh.per_query, "sink_attention ids"))
                    .transpose()?
                    .unwrap_or(0);
                (e.ptr(), selp, n)
            }
            _ => (0, 0, 0),
        };
        if hd > SINK_MAX_DIM {
            return Err(bad(format!(
                "sink_attention: head dim {hd} exceeds the kernel's {SINK_MAX_DIM}"
            )));
        }
        let smem = (SINK_HG * hd + 32) * 4;
        let kpw = sink_keys_per_warp(rows);
        let n_stride = sh.window + n_ent;
        let scores = self.scratch_mem("sink_scores", rows * h * n_stride * 4)?;
        keep.push(&scores);
        let prm = SinkParams {
            step: self.step_ptr(),
            q: self.buf_of(q, rows * h * hd, "sink_attention q")?,
            kv: self.buf_of(kv, rows * hd, "sink_attention kv")?,
            window: self.buf_of(window, cap * hd, "sink_attention window")?,
            entries: ep,
            sel: selp,
            sinks: sm.ptr(),
            out: self.buf_of(out, rows * h * hd, "sink_attention out")?,
            scores: scores.ptr(),
            cap: cap as i32,
            heads: h as i32,
            hd: hd as i32,
            window_len: sh.window as i32,
            rate: if ep == 0 { 0 } else { sh.rate as i32 },
            per_q: sh.per_query as i32,
            rb: rb(p),
            n_stride: n_stride as i32,
            scale: sh.scale,
            kpw: kpw as i32,
        };
        self.launch_op(Launch {
            f: self.k.sink_scores,
            grid: (
                rows as u32,
                blocks(n_stride as u64, SINK_WARPS * kpw),
                h.div_ceil(SINK_HG) as u32,
            ),
            block: 256,
            smem: smem as u32,
            args: Self::args(prm),
            label: "sink_scores",
            keep: keep.clone(),
        });
        self.record(
            Op::SinkMix {
                p: prm,
                rows: rows as u32,
            },
            &keep,
        );
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dsa_select_op(
        &self,
        q: &CudaBuf,
        w: &CudaBuf,
        entries: &CudaBuf,
        rows: usize,
        sh: &SelectShape,
        ids: &CudaBuf,
    ) -> Result<()> {
        if sh.top_k == 0 {
            return Ok(()); // no ids to write (`dsa_topk` searches for a k-th key, k ≥ 1)
        }
        let smem = ((sh.heads * (sh.dim + 4) + sh.heads + DSA_ENTRIES as usize * sh.heads)
            .next_multiple_of(4)
            + DSA_ENTRIES as usize * sh.dim)
            * 4;
        if sh.heads > DSA_THREADS || !sh.dim.is_multiple_of(4) || smem > DSA_SMEM {
            return Err(bad(format!(
                "dsa_select: {} heads of dim {} exceed the kernel's limits (at most {DSA_THREADS} heads, dim a multiple of 4, {DSA_SMEM} bytes of queries, head weights, the terms of {DSA_ENTRIES} entries and their rows)",
                sh.heads, sh.dim
            )));
        }
        let max_entries = entries.len / sh.dim;
        let scores = self.scratch_mem("dsa_scores", rows * max_entries * 4)?;
        let prm = SelectParams {
            step: self.step_ptr(),
            q: self.buf_of(q, rows * sh.heads * sh.dim, "dsa_select q")?,
            w: self.buf_of(w, rows * sh.heads, "dsa_select w")?,
            entries: entries.ptr(),
            scores: scores.ptr(),
            ids: self.buf_of(ids, rows * sh.top_k, "dsa_select ids")?,
            rows: rows as i32,
            heads: sh.heads as i32,
            dim: sh.dim as i32,
            rate: sh.rate as i32,
            top_k: sh.top_k as i32,
            max_entries: max_entries as i32,
            scale: sh.scale,
            wscale: sh.weights_scale,
        };
        let keep = vec![&q.mem, &w.mem, &entries.mem, &scores, &ids.mem];
        self.launch_op(Launch {
            f: self.k.dsa_scores,
            grid: (rows as u32, blocks(max_entries as u64, DSA_ENTRIES), 1),
            block: DSA_THREADS as u32,
            smem: smem as u32,
            args: Self::args(prm),
            label: "dsa_scores",
            keep: keep.clone(),
        });
        self.launch_op(Launch {
            f: self.k.dsa_topk,
            grid: (rows as u32, 1, 1),
            block: DSA_BINS,
            smem: 0,
            args: Self::args(prm),
            label: "dsa_topk",
            keep,
        });
        Ok(())
    }

    /// Multi-head latent attention. F32 and ggml arithmetic absorb `k_b` into the query
    /// and `v_b` into the output (q̃_h = k_b[h] q_h, attention over the latents, then
    /// v_b[h] ctx_h), except in many-query steps whose expanded keys and values fit
    /// `MLA_EXPAND_BYTES`: those expand the latents into f32 per-head keys and values
    /// (`mla_expand_f32`), half the products per (query, key); the bf16 reference's
    /// arithmetic expands every cached latent into rounded per-head keys and values
    /// first (`mla_expand`), as the CPU backend does.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mla_op(
        &self,
        q: &CudaBuf,
        latent: &CudaBuf,
        k_b: &CudaWeight,
        v_b: &CudaWeight,
        sel: Option<&CudaBuf>,
        rows: usize,
        sh: &MlaShape,
        p: Prec,
        pos0: usize,
        out: &CudaBuf,
    ) -> Result<()> {
        let (ha, rkv, dn, dv) = (sh.heads, sh.rank, sh.qk_dim, sh.v_dim);
        if rkv.max(dn) > MLA_QMAX || rkv.max(dv) > MLA_VMAX {
            return Err(bad(format!(
                "mla_attention: rank {rkv}, key {dn} and value {dv}: keys of at most {MLA_QMAX} and values of at most {MLA_VMAX} values"
            )));
        }
        let ps = sh.select;
        let cap = latent.len / rkv;
        let per_q = ps.map_or(0, |s| s.per_query);
        // Dynamic shared memory: the head group's queries, the staged rows (two tiles),
        // the kept pools.
        let smem_of = |kdim: usize, stage: bool| {
            (MLA_HG * kdim + if stage { 2 * MLA_TT * kdim } else { 0 } + per_q) * 4
        };
        let limit = self.k.mla_attend_smem;
        if smem_of(rkv.max(dn), false) > limit {
            return Err(bad(format!(
                "mla_attention: {MLA_HG} heads' queries of {} values and {per_q} pool ids exceed the kernel's {limit} bytes of shared memory",
                rkv.max(dn)
            )));
        }
        let mut keep = vec![&latent.mem];
        let sp = match sel {
            Some(s) => {
                keep.push(&s.mem);
                s.ptr()
            }
            None => 0,
        };
        let common = MlaParams {
            step: self.step_ptr(),
            q: 0,
            keys: 0,
            vals: 0,
            sel: sp,
            out: 0,
            part_o: 0,
            part_m: 0,
            part_l: 0,
            counters: 0,
            k_ts: 0,
            v_ts: 0,
            k_hs: 0,
            v_hs: 0,
            kdim: 0,
            vdim: 0,
            rows: rows as i32,
            heads: ha as i32,
            pool: ps.map_or(1, |s| s.pool as i32),
            per_q: per_q as i32,
            tail: ps.is_some_and(|s| s.tail) as i32,
            rb: 0,
            scale: sh.scale,
            stage: 0,
        };
        // Each query's tokens split into chunks for about two blocks per SM in all (at most
        // MLA_CHUNKS: 16 at decode), with scratch for the chunks' partial results and the
        // groups' arrival counters (a few MB whatever the rows); one chunk needs none.
        let groups = ha.div_ceil(MLA_HG);
        let chunks = (2 * self.gpu.n_sm as usize)
            .div_ceil(rows * groups)
            .clamp(1, MLA_CHUNKS);
        let attend = |mut prm: MlaParams, keep: Vec<&Arc<DevMem>>| -> Result<()> {
            let smem = smem_of(prm.kdim as usize, prm.stage != 0);
            let slots = rows * ha * chunks;
            let parts = if chunks > 1 {
                Some([
                    self.scratch_mem("mla_part_o", slots * prm.vdim as usize * 4)?,
                    self.scratch_mem("mla_part_m", slots * 4)?,
                    self.scratch_mem("mla_part_l", slots * 8)?,
                    self.scratch_mem("mla_counters", rows * groups * 4)?,
                ])
            } else {
                None
            };
            if let Some([o, m, l, c]) = &parts {
                (prm.part_o, prm.part_m, prm.part_l, prm.counters) =
                    (o.ptr(), m.ptr(), l.ptr(), c.ptr());
            }
            let keep = keep.into_iter().chain(parts.iter().flatten()).collect();
            self.launch_op(Launch {
                f: self.k.mla_attend,
                grid: (chunks as u32, groups as u32, rows as u32),
                block: 256,
                smem: smem as u32,
                args: Self::args(prm),
                label: "mla_attend",
                keep,
            });
            Ok(())
        };
        if p == Prec::Bf16 {
            let (kbm, kty, ..) = float_mat(k_b)?;
            let (vbm, vty, ..) = float_mat(v_b)?;
            if kty != vty {
                return Err(bad("mla_attention: k_b and v_b of different types"));
            }
            let kexp = self.scratch_mem("mla_kexp", cap * ha * dn * 4)?;
            let vexp = self.scratch_mem("mla_vexp", cap * ha * dv * 4)?;
            let mut a = KArgs::default();
            a.push(self.step_ptr())
                .push(latent.ptr())
                .push(kbm.ptr())
                .push(vbm.ptr())
                .push(kty as i32)
                .push(kexp.ptr())
                .push(vexp.ptr())
                .push(ha as i32)
                .push(rkv as i32)
                .push(dn as i32)
                .push(dv as i32);
            self.launch_op(Launch {
                f: self.k.mla_expand,
                grid: (cap as u32, ha as u32, 1),
                block: 128,
                smem: 0,
                args: a,
                label: "mla_expand",
                keep: vec![&latent.mem, kbm, vbm, &kexp, &vexp],
            });
            keep.extend([&q.mem, &kexp, &vexp, &out.mem]);
            return attend(
                MlaParams {
                    q: self.buf_of(q, rows * ha * dn, "mla_attention q")?,
                    keys: kexp.ptr(),
                    vals: vexp.ptr(),
                    out: self.buf_of(out, rows * ha * dv, "mla_attention out")?,
                    k_ts: (ha * dn) as i64,
                    v_ts: (ha * dv) as i64,
                    k_hs: dn as i32,
                    v_hs: dv as i32,
                    kdim: dn as i32,
                    vdim: dv as i32,
                    rb: 1,
                    ..common
                },
                keep,
            );
        }
        // Many queries go through f32 GEMMs over every key they could see, a selection
        // masking the softmax: while the context is at most MLA_DENSE_SELECTED times the
        // selected tokens, that costs less than `mla_attend` reading each query's
        // selected keys once per group of MLA_HG heads.
        let t_all = pos0 + rows;
        let dense = rows >= SGEMM_MIN_ROWS
            && match (sel, ps) {
                (Some(_), Some(s)) => {
                    t_all <= MLA_DENSE_SELECTED * s.per_query * s.pool
                        && mla_mask_bytes(t_all, s.pool) <= MLA_SOFTMAX_SMEM
                }
                (Some(_), None) => false,
                (None, _) => true,
            };
        let sel = sel.zip(ps);
        // Per-head keys and values expanded from the latents once per call: the
        // attention GEMMs then run over dn + dv values per (query, key, head) instead
        // of 2·rkv, as the reference computes.
        let expand = t_all * ha * (dn + dv) * 4 <= MLA_EXPAND_BYTES
            && matches!(k_b, CudaWeight::Float { .. })
            && matches!(v_b, CudaWeight::Float { .. });
        if dense && expand {
            let kv = self.mla_expand_f32(latent, k_b, v_b, t_all, sh)?;
            let out_p = self.buf_of(out, rows * ha * dv, "mla_attention out")?;
            let qp = self.buf_of(q, rows * ha * dn, "mla_attention q")?;
            let io = MlaIo::Expanded {
                q: (qp, &q.mem),
                keys: &kv.0,
                vals: &kv.1,
                out: (out_p, &out.mem),
            };
            return self.mla_dense_gemm(io, latent, rows, pos0, sh, sel);
        }
        let qt = self.scratch_mem("mla_qt", rows * ha * rkv * 4)?;
        let ctx = self.scratch_mem("mla_ctx", rows * ha * rkv * 4)?;
        let qt_buf = CudaBuf {
            mem: qt.clone(),
            len: rows * ha * rkv,
        };
        let ctx_buf = CudaBuf {
            mem: ctx.clone(),
            len: rows * ha * rkv,
        };
        self.head_matmul(k_b, q, rows, ha, Prec::F32, &qt_buf)?;
        if dense {
            self.mla_dense_gemm(
                MlaIo::Latent { qt: &qt, ctx: &ctx },
                latent,
                rows,
                pos0,
                sh,
                sel,
            )?;
            return self.head_matmul(v_b, &ctx_buf, rows, ha, p, out);
        }
        keep.extend([&qt, &ctx]);
        attend(
            MlaParams {
                q: qt.ptr(),
                keys: latent.ptr(),
                vals: latent.ptr(),
                out: ctx.ptr(),
                k_ts: rkv as i64,
                v_ts: rkv as i64,
                kdim: rkv as i32,
                vdim: rkv as i32,
                // 16-byte rows that fit: copied into shared memory a tile at a time.
                stage: (rkv.is_multiple_of(4) && smem_of(rkv, true) <= limit) as i32,
                ..common
            },
            keep,
        )?;
        self.head_matmul(v_b, &ctx_buf, rows, ha, p, out)
    }

    /// The per-head keys `[t_all, Ha, dn]` and values `[t_all, Ha, dv]` of the first
    /// `t_all` cached latents, f32: `k[t, h] = k_b[h]ᵀ L[t]`, `v[t, h] = v_b[h] L[t]`
    /// (two batched GEMMs on f32 copies of the weights).
    fn mla_expand_f32(
        &self,
        latent: &CudaBuf,
        k_b: &CudaWeight,
        v_b: &CudaWeight,
        t_all: usize,
        sh: &MlaShape,
    ) -> Result<(Arc<DevMem>, Arc<DevMem>)> {
        let (ha, rkv, dn, dv) = (sh.heads, sh.rank, sh.qk_dim, sh.v_dim);
        if latent.len < t_all * rkv {
            return Err(bad(
                "mla_attention: the latent cache is shorter than the context",
            ));
        }
        let keys = self.scratch_mem("mla_keys", t_all * ha * dn * 4)?;
        let vals = self.scratch_mem("mla_vals", t_all * ha * dv * 4)?;
        // (weight, its [Ha, rows, cols] shape as (out rows, in cols), transposed?, out)
        for (w, d, kb, out) in [(k_b, dn, true, &keys), (v_b, dv, false, &vals)] {
            let (wm, ty, n_out, n_in, n) = float_mat(w)?;
            let (want_out, want_in) = if kb { (rkv, dn) } else { (dv, rkv) };
            if (n_out, n_in, n) != (want_out, want_in, ha) {
                return Err(bad(format!(
                    "mla_attention: a {n}×{n_out}×{n_in} projection for {ha} heads of {d} \
                     over rank {rkv}"
                )));
            }
            let wf = self.f32_weight(wm, ty, ha * n_out * n_in)?;
            let mut keep = vec![wm, &latent.mem, out];
            keep.extend(wf.as_ref());
            // Column-major per head: out_hᵀ [d, t_all] = W_h' [d, rkv] · Lᵀ [rkv, t_all],
            // W_h' being k_b[h]ᵀ (stored [rkv, dn]: no transpose) or v_b[h] (stored
            // [dv, rkv]: transposed).
            self.record(
                Op::Sgemm(Sgemm {
                    trans_a: !kb,
                    m: d as i32,
                    n: t_all as i32,
                    k: rkv as i32,
                    a: wf.as_ref().map_or(wm.ptr(), |f| f.ptr()),
                    lda: if kb { dn } else { rkv } as i32,
                    stride_a: (n_out * n_in) as i64,
                    b: latent.ptr(),
                    ldb: rkv as i32,
                    stride_b: 0,
                    c: out.ptr(),
                    ldc: (ha * d) as i32,
                    stride_c: d as i64,
                    batch: ha as i32,
                }),
                &keep,
            );
        }
        Ok((keys, vals))
    }

    /// MLA attention of many queries as f32 GEMMs: per chunk of queries the scores over
    /// the keys they could see, the causal softmax (`mla_softmax`, masked to the selected
    /// pools and the tail with a selection), then the probability-weighted sum — over
    /// the latents (`q̃ · Lᵀ`, `P · L` into `ctx [rows, Ha, rkv]`) or over expanded
    /// per-head keys and values (`q_h · K_hᵀ`, `P_h · V_h` into `out [rows, Ha, dv]`).
    /// Chunks are at most `MLA_GEMM_QUERIES` queries and a score block under 1 GiB.
    fn mla_dense_gemm(
        &self,
        io: MlaIo<'_>,
        latent: &CudaBuf,
        rows: usize,
        pos0: usize,
        sh: &MlaShape,
        sel: Option<(&CudaBuf, PoolSelect)>,
    ) -> Result<()> {
        let (ha, rkv) = (sh.heads, sh.rank);
        let t_all = pos0 + rows;
        if latent.len < t_all * rkv {
            return Err(bad(
                "mla_attention: the latent cache is shorter than the context",
            ));
        }
        let qc = ((1usize << 30) / (ha * t_all * 4)).clamp(1, rows.min(MLA_GEMM_QUERIES));
        let scores = self.scratch_mem("mla_gemm_scores", qc * ha * t_all * 4)?;
        // The selection's ids, checked once before any chunk is recorded.
        let ids = sel
            .map(|(ids, ps)| {
                let ip = self.buf_of(ids, rows * ps.per_query, "mla_attention ids")?;
                Ok::<_, EngineError>((ip, ps, &ids.mem))
            })
            .transpose()?;
        for q0 in (0..rows).step_by(qc) {
            let nq = qc.min(rows - q0);
            let tk = pos0 + q0 + nq;
            let (score, mix, keep) = io.chunk(latent, &scores, sh, q0, nq, tk);
            self.record(Op::Sgemm(score), &keep);
            let mut a = KArgs::default();
            a.push(scores.ptr())
                .push(ha as i32)
                .push(tk as i32)
                .push((pos0 + q0) as i32)
                .push(sh.scale);
            let mut soft_keep = vec![&scores];
            let smem = match ids {
                Some((ip, ps, mem)) => {
                    soft_keep.push(mem);
                    a.push(ip + (q0 * ps.per_query * 4) as u64)
                        .push(ps.per_query as i32)
                        .push(ps.pool as i32)
                        .push(ps.tail as i32);
                    mla_mask_bytes(tk, ps.pool)
                }
                None => {
                    a.push(0u64).push(0i32).push(1i32).push(0i32);
                    0
                }
            };
            self.launch_op(Launch {
                f: self.k.mla_softmax,
                grid: ((nq * ha) as u32, 1, 1),
                block: 256,
                smem: smem as u32,
                args: a,
                label: "mla_softmax",
                keep: soft_keep,
            });
            self.record(Op::Sgemm(mix), &keep);
        }
        Ok(())
    }

    /// `out[t, h] = w[h] · x[t, h]` for a stack of `heads` matrices, float or quantized
    /// (the expert GEMV with slot h using matrix h).
    /// Each output rounded by `p`; MLA's per-head `k_b`/`v_b`, DeepSeek-V4's grouped
    /// output projection, and one quantized matrix (a stack of one) in bf16 arithmetic.
    pub(crate) fn head_matmul(
        &self,
        w: &CudaWeight,
        x: &CudaBuf,
        rows: usize,
        heads: usize,
        p: Prec,
        out: &CudaBuf,
    ) -> Result<()> {
        let CudaWeight::Matrix { mem, m, estride, n } = w else {
            return self.float_matmul(w, None, x, rows, heads, p, out);
        };
        if *n as usize != heads {
            return Err(bad(format!("a stack of {n} matrices over {heads} heads")));
        }
        let (n_out, n_in) = (m.rows as usize, m.cols as usize);
        let prm = ExpertGemv {
            pad: 0,
            w: m.planes,
            w2: m.planes,
            estride: estride.map(|v| v as i64),
            estride2: estride.map(|v| v as i64),
            ty: m.ty as i32,
            ty2: m.ty as i32,
            x: self.buf_of(x, rows * heads * n_in, "per-head product")?,
            x_tstride: n_in as i32,
            ids: 0,
            k: heads as i32,
            n_in: n_in as i32,
            rows: n_out as i32,
            need: act_need(m.ty),
            rb: rb(p),
            lim: f32::INFINITY,
            out: self.buf_of(out, rows * heads * n_out, "per-head product")?,
        };
        // The experts' down kernel of the type (typed: more blocks per SM) over the block
        // slots the device holds, as the routed experts share them.
        let typed = self.gemv_typed.load(Ordering::Relaxed);
        let [_, f, _] = self.k.experts_for(m.ty as u32, typed);
        let smem = gemv_smem_bytes(n_in, prm.need) as u32;
        self.launch_op(Launch {
            f,
            grid: (
                self.expert_grid_x(f, smem, n_out, rows * heads),
                (rows * heads) as u32,
                1,
            ),
            block: 256,
            smem,
            args: Self::args(prm),
            label: "gemv_heads",
            keep: vec![mem, &x.mem, &out.mem],
        });
        Ok(())
    }
}
