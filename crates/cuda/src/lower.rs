//! Lowering a step's recorded [`Op`]s to kernel launches, fusing neighbours.
//!
//! One-row operations (decode, and the logits rows of any step) are fused where the
//! pattern is unambiguous:
//!
//! - `rms_norm(x → h)` followed by matrix products reading `h`: the norm runs inside
//!   the GEMV's prologue (each block normalizes and quantizes the input itself; block 0
//!   also writes `h`);
//! - consecutive products reading the same input: one GEMV launch with up to three
//!   segments (q, k, v);
//! - `gate = Wg·h; up = Wu·h; act = swiglu(gate, up)`: one pair segment;
//! - `o = W·a; x += o`: the residual add in the GEMV epilogue;
//! - `rope(q); rope(k); attention(q, k, v)` for one token: one launch doing RoPE, the KV
//!   store, the split-K attention and its merge (`attn_decode_fused`), or, with
//!   [`Ctx::fused_attention`] off, one kernel rotating q and k and storing k and v, then
//!   the split-K attention and the merge as two more launches.
//!
//! Row kernels of any step are paired where the second only continues the first's rows:
//! a per-head norm and the rope of those heads (`rms_norm_rope`), a rope and the store
//! of its rows into a ring (`rope_torch_store`), two compressions (`compress_windows`
//! over two compressors), DeepSeek-V4's attention sums and the inverse rope of their
//! trailing columns (`sink_mix`).
//!
//! A fusion only applies when the outputs alias none of the inputs, so the fused kernels
//! compute exactly what the op-by-op sequence would. Everything else lowers one op to
//! one kernel (multi-row products to a dequantize + cuBLAS GEMM, see [`Cmd::Gemm`]).

use crate::driver::{Args, DPtr, Func, Gpu};
use crate::error::{CudaError, Result};
use crate::kernels::{GEMV_TYPES, Kernels};
use crate::layout::{act_need, gemv_smem_bytes};
use crate::ops::{
    CompressParams, DeltaParams, FG_THREADS, FloatSeg, HC_COLS, HcPostArgs, MatRef, Op, RopeArgs,
    RopeTorchArgs,
};
use crate::ops::{ExpertGemv, ReduceTail};

/// A kernel launch.
pub struct Launch {
    pub f: Func,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
    pub args: Args,
    /// What it does, for profiles.
    pub label: &'static str,
    /// Weight bytes it reads (GEMV), for profiles.
    pub bytes: u64,
}

impl Launch {
    /// Enqueues it on `gpu`'s stream (`pdl`: see [`Gpu::launch`]); a failure names the
    /// kernel and its shape.
    pub fn run(&self, gpu: &Gpu, pdl: bool) -> Result<()> {
        gpu.launch(self.f, self.grid, self.block, self.smem, &self.args, pdl)
            .map_err(|e| match e {
                CudaError::Driver { call, detail } => CudaError::Driver {
                    call,
                    detail: format!(
                        "{detail} (kernel {}: grid {:?}, {} threads, {} bytes of dynamic shared memory; {})",
                        self.label,
                        self.grid,
                        self.block,
                        self.smem,
                        self.f.resources()
                    ),
                },
                e => e,
            })
    }
}

/// One enqueued unit of work.
pub enum Cmd {
    Launch(Launch),
    /// `out = x · wᵀ` for `rows` rows: the backend dequantizes `w` to bf16, converts `x`
    /// and calls cuBLAS.
    Gemm {
        w: MatRef,
        x: DPtr,
        rows: u32,
        out: DPtr,
    },
    /// An f32 cuBLAS product as recorded.
    Sgemm(crate::gemm::Sgemm),
}

/// Scratch memory of the decode attention (fixed for the backend's lifetime, so captured
/// graphs stay valid).
#[derive(Clone, Copy)]
pub struct AttnScratch {
    pub pm: DPtr,
    pub pl: DPtr,
    pub po: DPtr,
    /// Per-KV-head completion counters of the fused decode attention (u32, zero between
    /// launches: the last block of each head resets its counter).
    pub cnt: DPtr,
    /// Capacity of `pm`/`pl` (heads × splits) and of `po` (heads × splits × head_dim),
    /// and counters in `cnt`.
    pub cap_ms: usize,
    pub cap_o: usize,
    pub cap_cnt: usize,
}

/// What lowering needs to know about the device.
pub struct Ctx<'a> {
    pub k: &'a Kernels,
    /// Streaming multiprocessors.
    pub n_sm: u32,
    /// GEMV blocks that fit on one multiprocessor (kernel, threads, shared bytes).
    pub gemv_occupancy: &'a dyn Fn(Func, u32, u32) -> u32,
    /// Rows each GEMV warp prefetches into L2 ahead of the one it computes (plain GEMV).
    pub gemv_prefetch: u32,
    /// One-token `rope, rope, attention` as one launch (`attn_decode_fused`) rather than
    /// three (correct, measured slower; off by default).
    pub fused_attention: bool,
    /// Fusions across operations: an mHC write-back and the next pre (`hc_post_pre`),
    /// the router and the routing (`router_route`), the experts' sum and the add after
    /// it, a delta step with its gate products and its gated norm, and the row kernels'
    /// pairs (a norm and its rope, a norm and its store, a rope and its store, a
    /// LayerNorm and its compression, two compressions, the attention sums and their
    /// rope). Off: one launch per op, for bisecting.
    pub fuse_decode: bool,
    /// Whether single-type launches of rows up to [`TYPED_GEMV_MAX_INPUTS`] inputs run on
    /// the typed GEMV kernels (`Kernels::gemv_typed`); off: the generic kernel for all.
    pub gemv_typed: bool,
    pub step: DPtr,
    pub n_tok: usize,
    pub attn: AttnScratch,
}

#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy, Default)]
struct Planes([DPtr; 4]);

#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy, Default)]
struct Seg {
    w: Planes,
    w2: Planes,
    bias: DPtr,
    out: DPtr,
    out2: DPtr,
    out3: DPtr,
    acc: DPtr,
    ty: i32,
    ty2: i32,
    rows: i32,
    row0: i32,
    /// Pair epilogue: the reference's clamped SwiGLU (`silu_ref` 1) or ggml's.
    lim: f32,
    silu_ref: i32,
}

#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy, Default)]
struct GemvParams {
    seg: [Seg; 3],
    x: DPtr,
    norm_w: DPtr,
    h_out: DPtr,
    n_in: i32,
    total_rows: i32,
    nseg: i32,
    need: i32,
    eps: f32,
    prefetch: i32,
}

/// Threads of a GEMV block (kernels/gemv.cu GEMV_WARPS × 32).
pub const GEMV_THREADS: u32 = 256;
const GEMV_WARPS: u32 = GEMV_THREADS / 32;

/// Splits of the decode attention for a cache of `n_ctx` positions: about two blocks
/// per multiprocessor, at least 8 positions per split (a split's warps walk their
/// positions one after another, so short caches gain from many short splits).
pub fn decode_splits(n_ctx: u32, n_head_kv: u32, n_sm: u32) -> u32 {
    let by_sm = (2 * n_sm).div_ceil(n_head_kv.max(1));
    n_ctx.div_ceil(8).min(by_sm).clamp(1, 64)
}

fn grid_1d(n: u64, n_sm: u32) -> (u32, u32, u32) {
    (n.div_ceil(256).clamp(1, n_sm as u64 * 8) as u32, 1, 1)
}

/// Lowers `ops` to commands.
pub fn lower(ops: &[Op], cx: &Ctx) -> Result<Vec<Cmd>> {
    Ok(lower_traced(ops, cx)?.0)
}

/// Lowers `ops` to commands, with the index of the first op each command computes.
///
/// An `hc_post_pre` launch leaves post and comb (the Sinkhorn) to an `hc_sinkhorn`
/// launch, placed after a later command of the sublayer: that kernel starts once the one
/// before it has passed its wait, when `hc_post_pre` has finished, runs beside it and
/// lets the next command start at once (see kernels/mhc.cu). It goes after the
/// sublayer's first GEMV long enough to hide it, which leaves it a block slot
/// (`place_sinkhorn`), else after the command that follows `hc_post_pre`, always before
/// the next write-back that reads it. Without a command after `hc_post_pre`, it follows
/// directly and waits for `hc_post_pre` before it reads.
pub fn lower_traced(ops: &[Op], cx: &Ctx) -> Result<(Vec<Cmd>, Vec<usize>)> {
    let mut cmds = Vec::with_capacity(ops.len());
    let mut origin = Vec::with_capacity(ops.len());
    // An `hc_sinkhorn` launch not yet placed: its `hc_post_pre` is command `at`.
    let mut sinkhorn: Option<(usize, crate::ops::HcPreArgs, usize)> = None;
    let mut i = 0;
    while i < ops.len() {
        let before = cmds.len();
        let used = lower_at(ops, i, cx, &mut cmds)?;
        origin.resize(origin.len() + cmds.len() - before, i);
        // This op began the next sublayer: its `hc_post_pre` (with this op's pre, or the
        // next op's) is command `next`.
        let pre = match (&ops[i], ops.get(i + 1)) {
            (Op::HcPre { args, .. }, _) | (_, Some(Op::HcPre { args, .. })) => Some(*args),
            _ => None,
        };
        let mut next = match (cmds.get(before), pre) {
            (Some(Cmd::Launch(l)), Some(args)) if l.f == cx.k.hc_post_pre => Some((before, args)),
            _ => None,
        };
        if let Some(p) = sinkhorn.take() {
            // The first new command that reads post and comb (a write-back: the next
            // `hc_post_pre`, or the last layer's plain `hc_post`) ends the search.
            let reader = (before..cmds.len()).find(|&c| {
                matches!(&cmds[c], Cmd::Launch(l) if l.f == cx.k.hc_post_pre || l.f == cx.k.hc_post)
            });
            let end = reader.unwrap_or(cmds.len());
            if place_sinkhorn(&mut cmds, &mut origin, p, end, reader.is_some(), cx) {
                if let Some((n, _)) = &mut next {
                    *n += 1;
                }
            } else {
                sinkhorn = Some(p);
            }
        }
        if let Some((n, args)) = next {
            sinkhorn = Some((n, args, i));
        }
        i += used;
    }
    if let Some(p) = sinkhorn {
        let end = cmds.len();
        place_sinkhorn(&mut cmds, &mut origin, p, end, true, cx);
    }
    Ok((cmds, origin))
}

/// Places the `hc_sinkhorn` of op `op` (its `hc_post_pre` is command `at`) among
/// commands `at + 1 .. end`: after the first GEMV of at least SINKHORN_BESIDE_BYTES
/// (given a free block slot if its grid fills them all), else, when `settle` (the
/// sublayer has ended), after command `at + 1`, or right after `hc_post_pre`, waiting for
/// it, when no command is between. Returns whether it was placed (always when `settle`).
fn place_sinkhorn(
    cmds: &mut Vec<Cmd>,
    origin: &mut Vec<usize>,
    (at, args, op): (usize, crate::ops::HcPreArgs, usize),
    end: usize,
    settle: bool,
    cx: &Ctx,
) -> bool {
    let long = (at + 1..end).find(|&c| {
        matches!(&cmds[c], Cmd::Launch(l) if is_gemv(l, cx) && l.bytes >= SINKHORN_BESIDE_BYTES)
    });
    let (c, wait_first) = match long {
        Some(c) => (c + 1, false),
        None if !settle => return false,
        None if end > at + 1 => (at + 2, false),
        None => (at + 1, true),
    };
    if let Cmd::Launch(l) = &mut cmds[c - 1]
        && fills_slots(l, cx)
    {
        l.grid.0 -= 1;
    }
    cmds.insert(c, Cmd::Launch(sinkhorn_launch(args, wait_first, cx)));
    origin.insert(c, op);
    true
}

/// The weight bytes of a GEMV that `hc_sinkhorn` runs beside: 16 MB take about as long
/// as its iterations (4 µs at the copy bandwidth, 6–8 in a replay).
const SINKHORN_BESIDE_BYTES: u64 = 16 << 20;

fn is_gemv(l: &Launch, cx: &Ctx) -> bool {
    l.f == cx.k.gemv || cx.k.gemv_typed.iter().flatten().any(|&f| f == l.f)
}

/// Whether `l` is a GEMV whose grid fills every block slot of the GPU (one block fewer
/// leaves a slot for the one-block `hc_sinkhorn` beside it; a GEMV's warps stride over
/// its rows, so any grid computes them all).
fn fills_slots(l: &Launch, cx: &Ctx) -> bool {
    is_gemv(l, cx)
        && l.grid.0 > 1
        && l.grid.0 >= cx.n_sm * (cx.gemv_occupancy)(l.f, l.block, l.smem)
}

/// `hc_sinkhorn`: post and comb from the mixes `hc_post_pre` left in `args.m`
/// (`wait_first`: right after it, so it waits for it before reading).
fn sinkhorn_launch(args: crate::ops::HcPreArgs, wait_first: bool, cx: &Ctx) -> Launch {
    let mut a = Args::new();
    a.push(args).push(wait_first as i32);
    Launch {
        f: cx.k.hc_sinkhorn,
        grid: (1, 1, 1),
        block: HC_SINKHORN_THREADS,
        smem: 0,
        args: a,
        label: "hc_sinkhorn",
        bytes: 0,
    }
}

/// Threads of `hc_sinkhorn` (kernels/mhc.cu `HC_SINKHORN_THREADS`: one comb element
/// each, at most 8 × 8).
const HC_SINKHORN_THREADS: u32 = 64;

/// Lowers the ops from `ops[i]` on that make one pattern (a fusion, or `ops[i]` alone)
/// into `cmds`; returns how many it consumed.
fn lower_at(ops: &[Op], i: usize, cx: &Ctx, cmds: &mut Vec<Cmd>) -> Result<usize> {
    // Fused patterns first.
    if let Op::RmsNorm {
        x,
        w,
        n,
        rows: 1,
        eps,
        out,
    } = ops[i]
        && let Some((used, cmd)) = gemv_group(
            ops,
            i + 1,
            Input {
                x,
                norm: Some((w, eps, out)),
                n,
            },
            cx,
        )
    {
        cmds.push(cmd);
        return Ok(1 + used);
    }
    if let Op::Matmul { x, rows: 1, w, .. } = ops[i]
        && let Some((used, cmd)) = gemv_group(
            ops,
            i,
            Input {
                x,
                norm: None,
                n: w.cols,
            },
            cx,
        )
    {
        cmds.push(cmd);
        return Ok(used);
    }
    // The fused launch meets in a grid barrier: at most one block per SM keeps every
    // block resident. A pre without a write-back before it (the first sublayer's) runs
    // in the same launch with no write-back (`y` null): its mixes summed as every later
    // sublayer's, its Sinkhorn beside a later kernel.
    let pair = match (ops[i], ops.get(i + 1)) {
        (Op::HcPost(post), Some(&Op::HcPre { x, args })) if x == post.x => Some((post, args, 2)),
        (Op::HcPre { x, args }, _) => {
            let post = HcPostArgs {
                x,
                n: args.n,
                d: args.d,
                rb: args.rb,
                ..HcPostArgs::default()
            };
            Some((post, args, 1))
        }
        _ => None,
    };
    if let Some((post, args, used)) = pair
        && cx.fuse_decode
        && (post.d as usize).div_ceil(HC_COLS) <= cx.n_sm as usize
    {
        let mut a = Args::new();
        a.push(post).push(args);
        cmds.push(Cmd::Launch(Launch {
            f: cx.k.hc_post_pre,
            grid: ((post.d as usize).div_ceil(HC_COLS) as u32, 1, 1),
            block: HC_COLS as u32,
            smem: 0,
            args: a,
            label: "hc_post_pre",
            bytes: 0,
        }));
        return Ok(used);
    }
    if let (Op::FloatGemv(seg), Some(&Op::MoeRoute { p, counter })) = (ops[i], ops.get(i + 1))
        && p.logits == seg.out
        && seg.n_tok == 1
        && cx.fuse_decode
    {
        let mut a = Args::new();
        a.push(seg)
            .push(p)
            .push(counter)
            .push(router_beside(ops, i, &seg, &p, cmds, cx) as i32);
        cmds.push(Cmd::Launch(Launch {
            f: cx.k.router_route,
            grid: (seg.blocks(), 1, 1),
            block: FG_THREADS,
            smem: 0,
            args: a,
            label: "router_route",
            bytes: 0,
        }));
        return Ok(2);
    }
    if let Op::ExpertsDown {
        e,
        tail,
        grid_x,
        smem,
    } = ops[i]
    {
        // An add of the sum right after it becomes the tail's addend.
        let (add, used) = match ops.get(i + 1) {
            Some(&Op::Add { x, y, len })
                if cx.fuse_decode && x == tail.out && len == e.rows as u32 && y != tail.out =>
            {
                (y, 2)
            }
            _ => (0, 1),
        };
        cmds.push(experts_down(
            e,
            ReduceTail { add, ..tail },
            grid_x,
            smem,
            cx,
        ));
        return Ok(used);
    }
    if let Op::DeltaStep { p, block } = ops[i] {
        let (used, cmd) = delta_step_launch(ops, i, i, p, block, [None; 2], cx);
        cmds.push(cmd);
        return Ok(used);
    }
    // A norm whose rows are the heads the next rope rotates: one launch, a block per row.
    if let (Op::NormRef { a, rows }, Some(&Op::RopeTorch { a: r, n_tok })) =
        (ops[i], ops.get(i + 1))
        && cx.fuse_decode
        && r.x == a.out
        && a.cols == r.head_dim
        && rows == n_tok * r.n_head as u32
    {
        let mut args = Args::with(a);
        args.push(r);
        cmds.push(launch_256(
            cx.k.rms_norm_rope,
            rows,
            args,
            "rms_norm + rope",
        ));
        return Ok(2);
    }
    // A LayerNorm of the one row a compressor takes next (GLM-5.3's indexer keys). At
    // most 256 values: each thread then sums one value in both launches (the same f64
    // terms in the same warps); not in place (block 0 writes the output that other
    // blocks would still read).
    if let (Op::LayerNorm { a, rows: 1 }, Some(&Op::Compress { p, blocks, block })) =
        (ops[i], ops.get(i + 1))
        && cx.fuse_decode
        && p.src_kv == a.out
        && p.overlap == 0
        && a.cols == p.c
        && a.cols <= 256
        && a.x != a.out
    {
        let p = CompressParams { ln: a, ..p };
        cmds.push(compress([p, CompressParams::default()], blocks, block, cx));
        return Ok(2);
    }
    // Two compressors (DeepSeek-V4's CSA layers: the attention's and the indexer's).
    if let (
        Op::Compress { p, blocks, block },
        Some(&Op::Compress {
            p: p2,
            blocks: b2,
            block: k2,
        }),
    ) = (ops[i], ops.get(i + 1))
        && cx.fuse_decode
        && apart(&p, &p2)
    {
        cmds.push(compress([p, p2], blocks.max(b2), block.max(k2), cx));
        return Ok(2);
    }
    // A norm, then its rows into a ring (GLM-5.3's latent row into its cache).
    if let (
        Op::RmsNorm {
            x,
            w,
            n,
            rows,
            eps,
            out,
        },
        Some(&Op::StoreRows { a: st, .. }),
    ) = (ops[i], ops.get(i + 1))
        && cx.fuse_decode
        && st.src == out
        && st.rows as u32 == rows
        && st.row_len as u32 == n
    {
        let mut args = Args::new();
        args.push(x)
            .push(w)
            .push(out)
            .push(n as i32)
            .push(eps)
            .push(st);
        cmds.push(launch_256(
            cx.k.rms_norm_store,
            rows,
            args,
            "rms_norm + store_rows",
        ));
        return Ok(2);
    }
    // A rope, then its rotated rows into a ring (DeepSeek-V4's keys into the window).
    if let (Op::RopeTorch { a: r, n_tok }, Some(&Op::StoreRows { a: st, .. })) =
        (ops[i], ops.get(i + 1))
        && cx.fuse_decode
        && st.src == r.x
        && st.rows as u32 == n_tok
        && st.row_len == r.n_head * r.head_dim
    {
        let mut args = Args::with(r);
        args.push(st);
        cmds.push(launch_256(
            cx.k.rope_torch_store,
            n_tok,
            args,
            "rope + store_rows",
        ));
        return Ok(2);
    }
    // Attention sums whose heads' rotated columns a warp holds, and their inverse rope.
    if let (Op::SinkMix { p, rows }, Some(&Op::RopeTorch { a: r, n_tok })) =
        (ops[i], ops.get(i + 1))
        && cx.fuse_decode
        && r.x == p.out
        && (r.n_head, r.head_dim) == (p.heads, p.hd)
        && rows == n_tok
        && sink_mix_holds(&r)
    {
        cmds.push(sink_mix(p, rows, r, cx));
        return Ok(2);
    }
    if let Some((n, gates)) = step_gates(ops, i, cx)
        && let Op::DeltaStep { p, block } = ops[i + n]
    {
        let (used, cmd) = delta_step_launch(ops, i, i + n, p, block, gates, cx);
        cmds.push(cmd);
        return Ok(n + used);
    }
    if let Op::FloatGemv(_) = ops[i] {
        let (used, cmd) = float_group(ops, i, cx);
        cmds.push(cmd);
        return Ok(used);
    }
    if cx.n_tok == 1
        && let Some(used) = decode_attention(ops, i, cx, cmds)?
    {
        return Ok(used);
    }
    single(&ops[i], cx, cmds)?;
    Ok(1)
}

/// Whether `router_route` of the router product `seg` (op `i`) and the routing `p` may run
/// beside the command before it (kernels/moe.cu `beside`): that command is a GEMV (it
/// lets the next kernel start once its own wait has passed, so every earlier kernel has
/// finished) ending with op `i − 1`, a product, and none of the products and norms that
/// GEMV may hold (the run of them before op `i`) touches the router's input or anything
/// the routing writes.
fn router_beside(
    ops: &[Op],
    i: usize,
    seg: &FloatSeg,
    p: &crate::ops::RouteParams,
    cmds: &[Cmd],
    cx: &Ctx,
) -> bool {
    if !matches!(i.checked_sub(1).map(|j| &ops[j]), Some(Op::Matmul { .. })) {
        return false;
    }
    let Some(Cmd::Launch(prev)) = cmds.last() else {
        return false;
    };
    let routed = [seg.x, seg.out, p.ids, p.weights];
    let apart = ops[..i]
        .iter()
        .rev()
        .map_while(|op| match *op {
            Op::Matmul { x, out, .. } | Op::RmsNorm { x, out, .. } => Some([x, out]),
            _ => None,
        })
        .all(|bufs| bufs.iter().all(|b| !routed.contains(b)));
    is_gemv(prev, cx) && apart
}

/// Whether two compressors share no buffer that either writes (rings and entries; their
/// buffers are whole allocations, so equal starts are the only overlap).
fn apart(a: &CompressParams, b: &CompressParams) -> bool {
    let writes = |c: &CompressParams| [c.kv, c.gate, c.entries, c.ln.out];
    let touches = |c: &CompressParams| {
        [
            c.src_kv, c.src_gate, c.kv, c.gate, c.entries, c.ln.x, c.ln.out,
        ]
    };
    let clash = |w: &CompressParams, t: &CompressParams| {
        writes(w).iter().any(|&x| x != 0 && touches(t).contains(&x))
    };
    !clash(a, b) && !clash(b, a)
}

/// `compress_windows` of one compressor (`ps[1]` all zero) or two (grid.y 2), `blocks`
/// blocks of `block` threads each; shared memory for the larger entry (and the
/// normalised row of a LayerNorm in the launch).
fn compress(ps: [CompressParams; 2], blocks: u32, block: u32, cx: &Ctx) -> Cmd {
    let two = ps[1] != CompressParams::default();
    let mut args = Args::new();
    args.push(ps[0]).push(ps[1]);
    Cmd::Launch(Launch {
        f: cx.k.compress_windows,
        grid: (blocks, 1 + two as u32, 1),
        block,
        smem: ps
            .iter()
            .map(|p| 4 * p.c as u32 * (1 + (p.ln.w != 0) as u32))
            .max()
            .unwrap_or(0),
        args,
        label: "compress",
        bytes: 0,
    })
}

/// A launch of 256-thread blocks on a one-dimensional grid.
fn launch_256(f: Func, grid: u32, args: Args, label: &'static str) -> Cmd {
    Cmd::Launch(Launch {
        f,
        grid: (grid, 1, 1),
        block: 256,
        smem: 0,
        args,
        label,
        bytes: 0,
    })
}

/// Columns of a head each warp of `sink_mix` sums (kernels/sparse.cu: lane and lane + 32
/// of a 64-column block), and heads per block (a warp each: `SINK_MIX_HEADS`; 256 threads,
/// one per key of a listed chunk, `SINK_MIX_KC`).
const SINK_MIX_COLS: i32 = 64;
const SINK_MIX_HEADS: u32 = 8;

/// Whether the rotated columns of a rope's heads lie in one warp's columns of `sink_mix`.
fn sink_mix_holds(r: &RopeTorchArgs) -> bool {
    let start = if r.trailing != 0 {
        r.head_dim - r.n_dims
    } else {
        0
    };
    r.n_dims > 0 && start / SINK_MIX_COLS == (start + r.n_dims - 1) / SINK_MIX_COLS
}

/// `sink_mix` of `rows` queries, with the rope `r` of its output when `r.x` is set (zero:
/// none).
fn sink_mix(p: crate::ops::SinkParams, rows: u32, r: RopeTorchArgs, cx: &Ctx) -> Cmd {
    let mut args = Args::new();
    args.push(p).push(r);
    Cmd::Launch(Launch {
        f: cx.k.sink_mix,
        grid: (
            rows,
            (p.hd as u32).div_ceil(SINK_MIX_COLS as u32),
            (p.heads as u32).div_ceil(SINK_MIX_HEADS),
        ),
        block: 32 * SINK_MIX_HEADS,
        smem: 0,
        args,
        label: "sink_mix",
        bytes: 0,
    })
}

/// `gemv_float_multi`'s parameters (kernels/float_gemv.cu).
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Clone, Copy)]
struct FloatMulti {
    s: [FloatSeg; FLOAT_SEGS],
    n: i32,
    /// Padding, zero (see [`crate::ops`]).
    pad: i32,
}

/// Segments of one `gemv_float_multi` launch.
const FLOAT_SEGS: usize = 6;

fn overlaps(a: &std::ops::Range<DPtr>, b: &std::ops::Range<DPtr>) -> bool {
    a.start < b.end && b.start < a.end
}

/// The float products from `ops[i]` on that can share one launch: consecutive, at most
/// [`FLOAT_SEGS`], none reading or overwriting an earlier one's output.
fn float_group(ops: &[Op], i: usize, cx: &Ctx) -> (usize, Cmd) {
    let mut p = FloatMulti {
        pad: 0,
        s: [FloatSeg::default(); FLOAT_SEGS],
        n: 0,
    };
    let mut blocks = 0u32;
    let mut used = 0;
    while used < FLOAT_SEGS {
        let Some(Op::FloatGemv(seg)) = ops.get(i + used) else {
            break;
        };
        let clash = p.s[..used].iter().any(|e| {
            overlaps(&e.writes(), &seg.reads())
                || overlaps(&e.writes(), &seg.writes())
                || overlaps(&e.reads(), &seg.writes())
        });
        if clash {
            break;
        }
        p.s[used] = FloatSeg {
            first: blocks as i32,
            ..*seg
        };
        blocks += seg.blocks();
        used += 1;
    }
    p.n = used as i32;
    let bytes = p.s[..used].iter().map(FloatSeg::weight_bytes).sum();
    let mut a = Args::new();
    a.push(p);
    (
        used,
        Cmd::Launch(Launch {
            f: cx.k.gemv_float_multi,
            grid: (blocks, 1, 1),
            block: FG_THREADS,
            smem: 0,
            args: a,
            label: "gemv_float",
            bytes,
        }),
    )
}

/// Whether the launch before the delta step at `ops[i]` cannot write its state (so that
/// the step may load it before waiting for that launch): the ops before it that share
/// one launch are norms and products whose outputs are not the state. Anything else —
/// another step, a copy, a kernel the lowering cannot see into, the start of the
/// recording — may be writing it.
fn state_untouched_before(ops: &[Op], i: usize, p: &DeltaParams) -> bool {
    let state = [p.s, p.conv_state];
    let mut seen = false;
    for op in ops[..i].iter().rev() {
        let out = match *op {
            Op::FloatGemv(seg) => seg.out,
            Op::Matmul { out, .. } | Op::RmsNorm { out, .. } => out,
            _ => break,
        };
        if state.contains(&out) {
            return false;
        }
        seen = true;
    }
    seen
}

/// The gated output norm right after the delta step at `ops[i]` that runs in the step's
/// launch, each block normalising its own head (in place too: a block reads only its
/// head's o and z), unless the norm's output is one of the step's inputs, which other
/// blocks still read.
fn norm_in_step(
    ops: &[Op],
    i: usize,
    p: &DeltaParams,
    cx: &Ctx,
) -> Option<crate::ops::GatedNormArgs> {
    match ops.get(i + 1) {
        Some(&Op::GatedNorm(g))
            if cx.fuse_decode
                && p.row0 == 0
                && g.o == p.out
                && g.heads == p.hv as i64
                && g.dv == p.dv
                && g.rb == p.rb
                && ![p.q, p.k, p.v, p.g0, p.b, p.conv_state, p.s].contains(&g.out) =>
        {
            Some(g)
        }
        _ => None,
    }
}

/// Threads per block `delta_step` allows (kernels/delta.cu `DELTA_STEP_THREADS`).
const DELTA_STEP_THREADS: u32 = 512;

/// The one or two float products from `ops[i]` on that the delta step right after them
/// forms in its launch, each block its head's rows (kernels/delta.cu): products of one
/// token whose outputs are the step's gate input `g0` and its fused norm's gate `z`,
/// whole heads of rows, at most 32 threads per row and [`DELTA_STEP_THREADS`] per block,
/// reading nothing the step writes. `[g0's, z's]` product.
fn step_gates(ops: &[Op], i: usize, cx: &Ctx) -> Option<(usize, [Option<FloatSeg>; 2])> {
    let n = ops[i..]
        .iter()
        .take(2)
        .take_while(|op| matches!(op, Op::FloatGemv(_)))
        .count();
    let Some(&Op::DeltaStep { p, block }) = ops.get(i + n) else {
        return None;
    };
    if n == 0 || !cx.fuse_decode || p.row0 != 0 {
        return None;
    }
    let norm = norm_in_step(ops, i + n, &p, cx);
    let z = norm.map(|g| g.z);
    // The one-token buffers the step reads and writes beside its gates.
    let (hk_dk, hv_dv) = ((p.hk * p.dk) as u64, (p.hv * p.dv) as u64);
    let f32s = |ptr: DPtr, n: u64| ptr..ptr + 4 * n;
    let reads = [
        f32s(p.q, hk_dk),
        f32s(p.k, hk_dk),
        f32s(p.v, hv_dv),
        f32s(p.b, p.hv as u64),
    ];
    let (conv, gates) = (
        (p.kc as u64).saturating_sub(1) * (2 * hk_dk + hv_dv),
        (p.hv * p.gc) as u64,
    );
    let cap = p.cap as u64;
    // What the launch writes: the step's outputs and state, the journal, and the gate
    // products' own rows (each block its head's, while other blocks read theirs).
    let writes = [
        f32s(p.out, hv_dv),
        f32s(norm.map_or(0, |g| g.out), hv_dv),
        f32s(p.conv_state, conv),
        f32s(p.s, hv_dv * p.dk as u64),
        f32s(p.g0, gates),
        f32s(z.unwrap_or(0), hv_dv),
        f32s(p.jpre, cap * (2 * hk_dk + hv_dv)),
        f32s(p.jk, cap * hk_dk),
        f32s(p.jv, cap * hv_dv),
        f32s(p.jg, cap * gates),
        f32s(p.jb, cap * p.hv as u64),
    ];
    let mut gates = [None; 2];
    for op in &ops[i..i + n] {
        let Op::FloatGemv(seg) = *op else {
            return None;
        };
        let (slot, rows) = if seg.out == p.g0 {
            (0, p.gc)
        } else if Some(seg.out) == z {
            (1, p.dv)
        } else {
            return None;
        };
        let threads = rows as u32 * seg.lanes as u32;
        if gates[slot].is_some()
            || seg.n_tok != 1
            || seg.n_out != p.hv * rows
            || seg.lanes > 32
            || threads.max(block) > DELTA_STEP_THREADS
            || writes.iter().any(|w| overlaps(w, &seg.reads()))
            || reads.iter().any(|r| overlaps(r, &seg.writes()))
        {
            return None;
        }
        gates[slot] = Some(seg);
    }
    Some((n, gates))
}

/// The launch of the delta step at `ops[i]`, its first op `ops[first]`: with its fused
/// norm ([`norm_in_step`]) and the products that form its gates (`gates`, from
/// [`step_gates`]); it loads the state early when the launch before it cannot write it.
/// Also the ops it takes from `ops[i]` on (the step, and its norm when fused).
fn delta_step_launch(
    ops: &[Op],
    first: usize,
    i: usize,
    p: DeltaParams,
    block: u32,
    gates: [Option<FloatSeg>; 2],
    cx: &Ctx,
) -> (usize, Cmd) {
    let mut p = DeltaParams {
        early: state_untouched_before(ops, first, &p) as i32,
        ..p
    };
    let norm = norm_in_step(ops, i, &p, cx);
    if let Some(g) = norm {
        p = DeltaParams {
            gz: g.z,
            gw: g.w,
            gout: g.out,
            geps: g.eps,
            gsilu: g.silu,
            ..p
        };
    }
    let [g0, gz] = gates;
    p.g0_prod = g0.unwrap_or_default();
    p.gz_prod = gz.unwrap_or_default();
    let threads = |seg: &FloatSeg, rows: i32| (rows * seg.lanes) as u32;
    let block = block
        .max(threads(&p.g0_prod, p.gc))
        .max(threads(&p.gz_prod, p.dv));
    let bytes = [g0, gz].iter().flatten().map(FloatSeg::weight_bytes).sum();
    let launch = Cmd::Launch(Launch {
        f: cx.k.delta_step,
        grid: (p.hv as u32, 1, 1),
        block: block.next_multiple_of(32),
        smem: 4 * (p.dk * p.dv) as u32,
        args: Args::with(p),
        label: "delta_step",
        bytes,
    });
    (1 + norm.is_some() as usize, launch)
}

/// One token's experts down products with their weighted sum (`gemv_experts_down_sum`).
fn experts_down(e: ExpertGemv, tail: ReduceTail, grid_x: u32, smem: u32, cx: &Ctx) -> Cmd {
    let mut a = Args::new();
    a.push(e).push(tail);
    Cmd::Launch(Launch {
        f: cx.k.experts_for(e.ty as u32, cx.gemv_typed)[2],
        grid: (grid_x, e.k as u32, 1),
        block: GEMV_THREADS,
        smem,
        args: a,
        label: "experts_down_sum",
        bytes: 0,
    })
}

/// The input of a GEMV group: `x`, optionally RMS-normalized by (weight, eps) into `h`.
struct Input {
    x: DPtr,
    norm: Option<(DPtr, f32, DPtr)>,
    n: u32,
}

impl Input {
    /// The buffer the products read (h when normalized).
    fn read_buf(&self) -> DPtr {
        self.norm.map_or(self.x, |(_, _, h)| h)
    }

    fn reads(&self, p: DPtr) -> bool {
        p == self.x || self.norm.is_some_and(|(_, _, h)| h == p)
    }
}

/// Collects up to three one-row products of `inp` starting at `ops[start]`; returns the
/// ops consumed and the launch, or `None` when no product follows.
fn gemv_group(ops: &[Op], start: usize, inp: Input, cx: &Ctx) -> Option<(usize, Cmd)> {
    let src = inp.read_buf();
    let mut segs: Vec<Seg> = Vec::new();
    let mut seg_bytes: Vec<u64> = Vec::new();
    let row_bytes = |m: &MatRef| {
        (m.cols as usize / m.ty.block_size() * m.ty.type_size()) as u64 * m.rows as u64
    };
    let mut j = start;
    let mut row0 = 0i32;
    let mut need = 0;
    while j < ops.len() && segs.len() < 3 {
        let Op::Matmul {
            w,
            bias,
            x,
            rows: 1,
            out,
        } = ops[j]
        else {
            break;
        };
        if x != src || w.cols != inp.n || inp.reads(out) {
            break;
        }
        let mut s = Seg {
            w: Planes(w.planes),
            ty: w.ty as i32,
            rows: w.rows as i32,
            row0,
            out,
            ..Seg::default()
        };
        need |= act_need(w.ty);
        // gate/up/swiglu
        if bias.is_none()
            && let Some(&Op::Matmul {
                w: w2,
                bias: None,
                x: x2,
                rows: 1,
                out: out2,
            }) = ops.get(j + 1)
            && let Some(&Op::Swiglu {
                gate,
                up,
                len,
                out: act,
                lim,
                reference,
            }) = ops.get(j + 2)
            && x2 == src
            && w2.cols == inp.n
            && w2.rows == w.rows
            && gate == out
            && up == out2
            && len == w.rows
            && ![out2, act].iter().any(|&p| inp.reads(p))
            && out != out2
            && act != out
            && act != out2
        {
            s.w2 = Planes(w2.planes);
            s.ty2 = w2.ty as i32;
            s.out2 = out2;
            s.out3 = act;
            s.lim = lim;
            s.silu_ref = reference as i32;
            need |= act_need(w2.ty);
            seg_bytes.push(row_bytes(&w) + row_bytes(&w2));
            segs.push(s);
            row0 += w.rows as i32;
            j += 3;
            continue;
        }
        s.bias = bias.unwrap_or(0);
        if let Some(&Op::Add { x: res, y, len }) = ops.get(j + 1)
            && y == out
            && len == w.rows
            && !inp.reads(res)
            && res != out
        {
            s.acc = res;
            seg_bytes.push(row_bytes(&w));
            segs.push(s);
            row0 += w.rows as i32;
            j += 2;
            continue;
        }
        seg_bytes.push(row_bytes(&w));
        segs.push(s);
        row0 += w.rows as i32;
        j += 1;
    }
    if segs.is_empty() {
        return None;
    }
    // Outputs of one segment must not be inputs of another (they are all read-only here
    // except through `acc`, which must not be another segment's output).
    let outs: Vec<DPtr> = segs
        .iter()
        .flat_map(|s| [s.out, s.out2, s.out3, s.acc])
        .filter(|&p| p != 0)
        .collect();
    for (a, pa) in outs.iter().enumerate() {
        if outs[a + 1..].contains(pa) {
            return None;
        }
    }
    let mut p = GemvParams {
        x: inp.x,
        n_in: inp.n as i32,
        total_rows: row0,
        nseg: segs.len() as i32,
        need,
        prefetch: cx.gemv_prefetch as i32,
        ..GemvParams::default()
    };
    if let Some((w, eps, h)) = inp.norm {
        p.norm_w = w;
        p.eps = eps;
        p.h_out = h;
    }
    for (k, s) in segs.into_iter().enumerate() {
        p.seg[k] = s;
    }
    let label = match (
        p.seg[0].out3 != 0,
        inp.norm.is_some(),
        p.seg[0].acc != 0,
        p.nseg,
    ) {
        (true, true, _, _) => "gemv norm + gate/up + swiglu",
        (true, false, _, _) => "gemv gate/up + swiglu",
        (false, true, _, n) if n > 1 => "gemv norm + q/k/v",
        (false, true, _, _) => "gemv norm + 1 matrix",
        (false, false, true, _) => "gemv + residual",
        _ => "gemv",
    };
    let bytes = seg_bytes.iter().sum();
    let f = typed_gemv(&p, cx).unwrap_or(cx.k.gemv);
    let smem = gemv_smem_bytes(inp.n as usize, need) as u32;
    let occ = (cx.gemv_occupancy)(f, GEMV_THREADS, smem);
    let grid = (row0 as u32).div_ceil(GEMV_WARPS).min(cx.n_sm * occ).max(1);
    let mut args = Args::new();
    args.push(p);
    Some((
        j - start,
        Cmd::Launch(Launch {
            f,
            grid: (grid, 1, 1),
            block: GEMV_THREADS,
            smem,
            args,
            label,
            bytes,
        }),
    ))
}

/// Longest rows (inputs) the typed GEMV kernels serve: their load groups of 2 steps were
/// measured slower than the generic kernel's groups of 4 on rows of 14336 inputs and
/// faster on rows of 4096 (docs/benchmarks.md).
pub const TYPED_GEMV_MAX_INPUTS: i32 = 8192;

/// Most weights (rows × inputs) of a launch of plain segments on the typed GEMV kernels:
/// on larger ones the generic kernel's groups of 4 steps were measured faster (H200,
/// eager profile of glm53-flash:q2: KDA q/k/v, 24576 × 4096 Q8_0, 41.7 µs typed against
/// 36.9 generic; the output head 196 against 162), on smaller ones the typed (MLA q_a
/// with its norm 15.8 against 16.7; the shared expert's down product equal).
pub const TYPED_GEMV_MAX_WEIGHTS: i64 = 64 << 20;

/// The typed GEMV for a launch whose segments are all of one weight type and either all
/// gate/up pairs (of that type) or none, with rows of at most [`TYPED_GEMV_MAX_INPUTS`]
/// and, for plain segments, at most [`TYPED_GEMV_MAX_WEIGHTS`] weights.
fn typed_gemv(p: &GemvParams, cx: &Ctx) -> Option<Func> {
    if !cx.gemv_typed || p.n_in > TYPED_GEMV_MAX_INPUTS {
        return None;
    }
    let segs = &p.seg[..p.nseg as usize];
    let ty = segs[0].ty;
    let pair = segs[0].out3 != 0;
    if !pair && p.total_rows as i64 * p.n_in as i64 > TYPED_GEMV_MAX_WEIGHTS {
        return None;
    }
    let uniform = segs
        .iter()
        .all(|s| s.ty == ty && (s.out3 != 0) == pair && (!pair || s.ty2 == ty));
    if !uniform {
        return None;
    }
    let t = GEMV_TYPES
        .iter()
        .position(|&(g, _)| g as u32 == ty as u32)?;
    Some(cx.k.gemv_typed[t][pair as usize])
}

/// The attention kernel for `head_dim`: `[for 64, for 128]`.
fn by_head_dim(head_dim: u32, kernels: [Func; 2]) -> Result<Func> {
    match head_dim {
        64 => Ok(kernels[0]),
        128 => Ok(kernels[1]),
        d => Err(CudaError::Unsupported(format!(
            "head size {d} (the CUDA attention supports 64 and 128)"
        ))),
    }
}

/// Split-K attention of one query row over the cache, then the merge of the splits.
#[allow(clippy::too_many_arguments)]
fn decode_attention_kernels(
    cx: &Ctx,
    cmds: &mut Vec<Cmd>,
    q: DPtr,
    kc: DPtr,
    vc: DPtr,
    out: DPtr,
    n_ctx: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
) -> Result<()> {
    let s = check_decode_attention(cx, n_ctx, n_head, n_head_kv, head_dim)?;
    let group = n_head / n_head_kv;
    let scale = 1.0f32 / (head_dim as f32).sqrt();
    let mut a = Args::new();
    a.push(q)
        .push(kc)
        .push(vc)
        .push(cx.attn.pm)
        .push(cx.attn.pl)
        .push(cx.attn.po)
        .push(cx.step);
    a.push(group as i32)
        .push((n_head_kv * head_dim) as i32)
        .push(scale);
    cmds.push(Cmd::Launch(Launch {
        f: by_head_dim(
            head_dim,
            [cx.k.attn_decode_split_64, cx.k.attn_decode_split_128],
        )?,
        grid: (n_head_kv, s, 1),
        block: 128,
        smem: 0,
        args: a,
        label: "attention split",
        bytes: 0,
    }));
    let mut r = Args::new();
    r.push(cx.attn.pm)
        .push(cx.attn.pl)
        .push(cx.attn.po)
        .push(out)
        .push(head_dim as i32)
        .push(s as i32);
    cmds.push(Cmd::Launch(Launch {
        f: cx.k.attn_decode_reduce,
        grid: (n_head, 1, 1),
        block: head_dim,
        smem: 0,
        args: r,
        label: "attention merge",
        bytes: 0,
    }));
    Ok(())
}

/// `rope(q); rope(k); attention(q, k, v)` for one token.
fn decode_attention(ops: &[Op], i: usize, cx: &Ctx, cmds: &mut Vec<Cmd>) -> Result<Option<usize>> {
    let (
        Some(&Op::Rope {
            x: q,
            n_head: nq,
            head_dim: hq,
            rope: rq,
        }),
        Some(&Op::Rope {
            x: k,
            n_head: nk,
            head_dim: hk,
            rope: rk,
        }),
        Some(&Op::Attention {
            k_cache,
            v_cache,
            n_ctx,
            n_head,
            n_head_kv,
            head_dim,
            q: aq,
            k: ak,
            v,
            out,
        }),
    ) = (ops.get(i), ops.get(i + 1), ops.get(i + 2))
    else {
        return Ok(None);
    };
    if !(aq == q
        && ak == k
        && nq == n_head
        && nk == n_head_kv
        && hq == head_dim
        && hk == head_dim
        && rq == rk)
        || [q, k, v].contains(&out)
    {
        return Ok(None);
    }
    if cx.fused_attention {
        decode_attention_fused(
            cx, cmds, q, k, v, k_cache, v_cache, out, n_ctx, n_head, n_head_kv, head_dim, &rq,
        )?;
        return Ok(Some(3));
    }
    let mut a = Args::new();
    a.push(q)
        .push(k)
        .push(v)
        .push(k_cache)
        .push(v_cache)
        .push(cx.step);
    a.push(n_head as i32)
        .push(n_head_kv as i32)
        .push(head_dim as i32);
    push_rope(&mut a, &rq);
    let items = n_head * (rq.n_dims / 2) + n_head_kv * (rq.n_dims / 2) + n_head_kv * head_dim;
    cmds.push(Cmd::Launch(Launch {
        f: cx.k.rope_qk_store,
        grid: (items.div_ceil(128), 1, 1),
        block: 128,
        smem: 0,
        args: a,
        label: "rope q,k + kv store",
        bytes: 0,
    }));
    decode_attention_kernels(
        cx, cmds, q, k_cache, v_cache, out, n_ctx, n_head, n_head_kv, head_dim,
    )?;
    Ok(Some(3))
}

/// RoPE, KV store, split-K attention and merge of one token in one launch.
#[allow(clippy::too_many_arguments)]
fn decode_attention_fused(
    cx: &Ctx,
    cmds: &mut Vec<Cmd>,
    q: DPtr,
    k: DPtr,
    v: DPtr,
    kc: DPtr,
    vc: DPtr,
    out: DPtr,
    n_ctx: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    rope: &RopeArgs,
) -> Result<()> {
    let s = check_decode_attention(cx, n_ctx, n_head, n_head_kv, head_dim)?;
    if n_head_kv as usize > cx.attn.cap_cnt {
        return Err(CudaError::Unsupported(format!(
            "{n_head_kv} KV heads exceed the attention counters"
        )));
    }
    let f = by_head_dim(
        head_dim,
        [cx.k.attn_decode_fused_64, cx.k.attn_decode_fused_128],
    )?;
    let scale = 1.0f32 / (head_dim as f32).sqrt();
    let mut a = Args::new();
    a.push(q)
        .push(k)
        .push(v)
        .push(kc)
        .push(vc)
        .push(cx.attn.pm)
        .push(cx.attn.pl)
        .push(cx.attn.po)
        .push(out)
        .push(cx.attn.cnt)
        .push(cx.step);
    a.push((n_head / n_head_kv) as i32)
        .push((n_head_kv * head_dim) as i32)
        .push(scale);
    push_rope(&mut a, rope);
    cmds.push(Cmd::Launch(Launch {
        f,
        grid: (n_head_kv, s, 1),
        block: 128,
        smem: 0,
        args: a,
        label: "rope + kv store + attention",
        bytes: 0,
    }));
    Ok(())
}

/// The splits of a decode attention, after checking the scratch and the group size.
fn check_decode_attention(
    cx: &Ctx,
    n_ctx: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
) -> Result<u32> {
    let s = decode_splits(n_ctx, n_head_kv, cx.n_sm);
    if (n_head * s) as usize > cx.attn.cap_ms || (n_head * s * head_dim) as usize > cx.attn.cap_o {
        return Err(CudaError::Unsupported(format!(
            "attention of {n_head} heads × {s} splits exceeds the scratch"
        )));
    }
    let group = n_head / n_head_kv;
    if group > 8 {
        return Err(CudaError::Unsupported(format!(
            "{group} query heads per KV head (the CUDA decode attention supports 8)"
        )));
    }
    Ok(s)
}

fn push_rope(a: &mut Args, r: &RopeArgs) {
    a.push(r.n_dims as i32)
        .push(r.neox as i32)
        .push(r.theta_scale);
}

/// One op, unfused.
fn single(op: &Op, cx: &Ctx, cmds: &mut Vec<Cmd>) -> Result<()> {
    let n_tok = cx.n_tok as u32;
    match *op {
        Op::Embed { table, out } => {
            let mut a = Args::new();
            a.push(Planes(table.planes))
                .push(table.ty as i32)
                .push(table.cols as i32)
                .push(cx.step)
                .push(out);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.embed_rows,
                grid: (n_tok, 1, 1),
                block: 128,
                smem: 0,
                args: a,
                label: "embed",
                bytes: 0,
            }));
        }
        Op::RmsNorm {
            x,
            w,
            n,
            rows,
            eps,
            out,
        } => {
            let mut a = Args::new();
            a.push(x).push(w).push(out).push(n as i32).push(eps);
            cmds.push(launch_256(cx.k.rms_norm_rows, rows, a, "rms_norm"));
        }
        Op::Matmul {
            w,
            bias,
            x,
            rows,
            out,
        } => {
            if rows == 1 {
                // Reached only when the group builder declined (aliasing): a one-segment GEMV.
                let inp = Input {
                    x,
                    norm: None,
                    n: w.cols,
                };
                let one = [Op::Matmul {
                    w,
                    bias,
                    x,
                    rows,
                    out,
                }];
                match gemv_group(&one, 0, inp, cx) {
                    Some((_, cmd)) => cmds.push(cmd),
                    None => {
                        return Err(CudaError::Unsupported(
                            "a product whose output is its input".into(),
                        ));
                    }
                }
            } else {
                cmds.push(Cmd::Gemm { w, x, rows, out });
                if let Some(b) = bias {
                    let n = rows as u64 * w.rows as u64;
                    let mut a = Args::new();
                    a.push(out).push(b).push(w.rows as i32).push(n as i64);
                    cmds.push(Cmd::Launch(Launch {
                        f: cx.k.add_bias_rows,
                        grid: grid_1d(n, cx.n_sm),
                        block: 256,
                        smem: 0,
                        args: a,
                        label: "bias",
                        bytes: 0,
                    }));
                }
            }
        }
        Op::Rope {
            x,
            n_head,
            head_dim,
            rope,
        } => {
            let mut a = Args::new();
            a.push(x)
                .push(cx.step)
                .push(n_head as i32)
                .push(head_dim as i32);
            push_rope(&mut a, &rope);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.rope_rows,
                grid: (n_tok, 1, 1),
                block: 128,
                smem: 0,
                args: a,
                label: "rope",
                bytes: 0,
            }));
        }
        Op::Attention {
            k_cache,
            v_cache,
            n_ctx,
            n_head,
            n_head_kv,
            head_dim,
            q,
            k,
            v,
            out,
        } => {
            let kv_dim = n_head_kv * head_dim;
            let mut a = Args::new();
            a.push(k)
                .push(v)
                .push(k_cache)
                .push(v_cache)
                .push(cx.step)
                .push(kv_dim as i32);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.kv_store,
                grid: (n_tok, 1, 1),
                block: 256,
                smem: 0,
                args: a,
                label: "kv store",
                bytes: 0,
            }));
            if n_tok == 1 {
                decode_attention_kernels(
                    cx, cmds, q, k_cache, v_cache, out, n_ctx, n_head, n_head_kv, head_dim,
                )?;
            } else {
                let f = by_head_dim(head_dim, [cx.k.attn_prefill_64, cx.k.attn_prefill_128])?;
                let scale = 1.0f32 / (head_dim as f32).sqrt();
                let mut a = Args::new();
                a.push(q)
                    .push(k_cache)
                    .push(v_cache)
                    .push(out)
                    .push(cx.step)
                    .push(n_head as i32);
                a.push((n_head / n_head_kv) as i32)
                    .push(kv_dim as i32)
                    .push(scale);
                cmds.push(Cmd::Launch(Launch {
                    f,
                    grid: (n_tok.div_ceil(64), n_head, 1),
                    block: 128,
                    smem: 0,
                    args: a,
                    label: "attention prefill",
                    bytes: 0,
                }));
            }
        }
        Op::Swiglu {
            gate,
            up,
            len,
            out,
            lim,
            reference,
        } => {
            let mut a = Args::new();
            a.push(gate).push(up).push(out).push(len as i64);
            if reference {
                a.push(lim).push(0i32);
            }
            cmds.push(Cmd::Launch(Launch {
                f: if reference {
                    cx.k.swiglu_ref
                } else {
                    cx.k.swiglu
                },
                grid: grid_1d(len as u64, cx.n_sm),
                block: 256,
                smem: 0,
                args: a,
                label: "swiglu",
                bytes: 0,
            }));
        }
        Op::Add { x, y, len } => {
            let mut a = Args::new();
            a.push(x).push(y).push(len as i64);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.add_inplace,
                grid: grid_1d(len as u64, cx.n_sm),
                block: 256,
                smem: 0,
                args: a,
                label: "add",
                bytes: 0,
            }));
        }
        Op::Copy { src, dst, len } => {
            let mut a = Args::new();
            a.push(src).push(dst).push(len as i64);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.copy_f32,
                grid: grid_1d(len as u64, cx.n_sm),
                block: 256,
                smem: 0,
                args: a,
                label: "copy",
                bytes: 0,
            }));
        }
        Op::FloatGemv(_) => cmds.push(float_group(std::slice::from_ref(op), 0, cx).1),
        Op::Sgemm(g) => cmds.push(Cmd::Sgemm(g)),
        // (`lower_at` lowers delta steps itself; alone, one waits before loading its state.)
        Op::DeltaStep { p, block } => {
            cmds.push(delta_step_launch(std::slice::from_ref(op), 0, 0, p, block, [None; 2], cx).1)
        }
        Op::SinkMix { p, rows } => cmds.push(sink_mix(p, rows, RopeTorchArgs::default(), cx)),
        Op::Compress { p, blocks, block } => {
            cmds.push(compress([p, CompressParams::default()], blocks, block, cx))
        }
        Op::LayerNorm { a, rows } => cmds.push(launch_256(
            cx.k.layer_norm_ref,
            rows,
            Args::with(a),
            "layer_norm",
        )),
        Op::NormRef { a, rows } => cmds.push(launch_256(
            cx.k.rms_norm_ref,
            rows,
            Args::with(a),
            "rms_norm",
        )),
        Op::RopeTorch { a, n_tok } => {
            cmds.push(launch_256(cx.k.rope_torch, n_tok, Args::with(a), "rope"))
        }
        Op::StoreRows { a, grid } => cmds.push(launch_256(
            cx.k.store_rows,
            grid,
            Args::with(a),
            "store_rows",
        )),
        Op::GatedNorm(g) => {
            let mut a = Args::new();
            a.push(g.o)
                .push(g.z)
                .push(g.w)
                .push(g.out)
                .push(g.heads)
                .push(g.dv)
                .push(g.eps)
                .push(g.silu)
                .push(g.rb);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.gated_norm,
                // One warp per head.
                grid: ((g.heads as u64).div_ceil(8) as u32, 1, 1),
                block: 256,
                smem: 0,
                args: a,
                label: "gated_norm",
                bytes: 0,
            }));
        }
        Op::ExpertsDown {
            e,
            tail,
            grid_x,
            smem,
        } => cmds.push(experts_down(e, tail, grid_x, smem, cx)),
        Op::MoeRoute { p, .. } => {
            let mut a = Args::new();
            a.push(p);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.moe_route,
                grid: (p.rows as u32, 1, 1),
                block: 256,
                smem: 0,
                args: a,
                label: "moe_route",
                bytes: 0,
            }));
        }
        Op::HcPost(p) => {
            let mut a = Args::new();
            a.push(p.x)
                .push(p.y)
                .push(p.mix)
                .push(1i32)
                .push(p.n)
                .push(p.d)
                .push(p.rb);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.hc_post,
                grid: grid_1d(p.d as u64, cx.n_sm),
                block: 256,
                smem: 0,
                args: a,
                label: "hc_post",
                bytes: 0,
            }));
        }
        Op::HcPre { x, args } => {
            let mut a = Args::new();
            a.push(x).push(args);
            cmds.push(Cmd::Launch(Launch {
                f: cx.k.hc_pre_one,
                grid: (((2 + args.n) * args.n) as u32, 1, 1),
                block: 256,
                smem: 0,
                args: a,
                label: "hc_pre",
                bytes: 0,
            }));
        }
        Op::Kernel(k) => cmds.push(Cmd::Launch(Launch {
            f: k.f,
            grid: k.grid,
            block: k.block,
            smem: k.smem,
            args: k.args.to_args(),
            label: k.label,
            bytes: 0,
        })),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{
        GatedNormArgs, HcPostArgs, HcPreArgs, LayerNormArgs, NormRefArgs, RopeTorchArgs,
        float_lanes,
    };
    use ds4_gguf::GgmlType;

    fn mat(id: u64, ty: GgmlType, rows: u32, cols: u32) -> MatRef {
        MatRef {
            planes: [id << 20, 0, 0, 0],
            ty,
            rows,
            cols,
        }
    }

    /// The ops the llama family records for one step of `n` tokens (families/llama.rs).
    fn llama_step(n: u32, layers: u32) -> Vec<Op> {
        let (e, f, q, kv, v) = (512u32, 1536u32, 512u32, 128u32, 2048u32);
        let [x, h, qb, kb, vb, attn, o, gate, up, act, logits] =
            [1u64, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11].map(|b| b << 40);
        let rope = RopeArgs {
            n_dims: 64,
            neox: false,
            theta_scale: 0.5,
        };
        let mut ops = vec![Op::Embed {
            table: mat(1, GgmlType::Q4_K, v, e),
            out: x,
        }];
        for l in 0..layers as u64 {
            let w = |i: u64, ty, r, c| mat(100 + 10 * l + i, ty, r, c);
            ops.push(Op::RmsNorm {
                x,
                w: 7,
                n: e,
                rows: n,
                eps: 1e-5,
                out: h,
            });
            ops.push(Op::Matmul {
                w: w(0, GgmlType::Q4_K, q, e),
                bias: None,
                x: h,
                rows: n,
                out: qb,
            });
            ops.push(Op::Matmul {
                w: w(1, GgmlType::Q4_K, kv, e),
                bias: None,
                x: h,
                rows: n,
                out: kb,
            });
            ops.push(Op::Matmul {
                w: w(2, GgmlType::Q6_K, kv, e),
                bias: None,
                x: h,
                rows: n,
                out: vb,
            });
            ops.push(Op::Rope {
                x: qb,
                n_head: 8,
                head_dim: 64,
                rope,
            });
            ops.push(Op::Rope {
                x: kb,
                n_head: 2,
                head_dim: 64,
                rope,
            });
            ops.push(Op::Attention {
                k_cache: 50 << 40,
                v_cache: 51 << 40,
                n_ctx: 64,
                n_head: 8,
                n_head_kv: 2,
                head_dim: 64,
                q: qb,
                k: kb,
                v: vb,
                out: attn,
            });
            ops.push(Op::Matmul {
                w: w(3, GgmlType::Q4_K, e, q),
                bias: None,
                x: attn,
                rows: n,
                out: o,
            });
            ops.push(Op::Add {
                x,
                y: o,
                len: n * e,
            });
            ops.push(Op::RmsNorm {
                x,
                w: 8,
                n: e,
                rows: n,
                eps: 1e-5,
                out: h,
            });
            ops.push(Op::Matmul {
                w: w(4, GgmlType::Q4_K, f, e),
                bias: None,
                x: h,
                rows: n,
                out: gate,
            });
            ops.push(Op::Matmul {
                w: w(5, GgmlType::Q4_K, f, e),
                bias: None,
                x: h,
                rows: n,
                out: up,
            });
            ops.push(Op::Swiglu {
                gate,
                up,
                len: n * f,
                out: act,
                lim: f32::INFINITY,
                reference: false,
            });
            ops.push(Op::Matmul {
                w: w(6, GgmlType::Q6_K, e, f),
                bias: None,
                x: act,
                rows: n,
                out: o,
            });
            ops.push(Op::Add {
                x,
                y: o,
                len: n * e,
            });
        }
        ops.push(Op::Copy {
            src: x + 4 * (n as u64 - 1) * e as u64,
            dst: o,
            len: e,
        });
        ops.push(Op::RmsNorm {
            x: o,
            w: 9,
            n: e,
            rows: 1,
            eps: 1e-5,
            out: h,
        });
        ops.push(Op::Matmul {
            w: mat(2, GgmlType::Q6_K, v, e),
            bias: None,
            x: h,
            rows: 1,
            out: logits,
        });
        ops
    }

    fn lowered_with(ops: &[Op], n_tok: usize, k: &Kernels, fused_attention: bool) -> Vec<Cmd> {
        lowered_ctx(ops, n_tok, k, fused_attention, true)
    }

    fn lowered_ctx(
        ops: &[Op],
        n_tok: usize,
        k: &Kernels,
        fused_attention: bool,
        fuse_decode: bool,
    ) -> Vec<Cmd> {
        let occ = |_: Func, _: u32, _: u32| 2;
        let attn = AttnScratch {
            pm: 1 << 50,
            pl: 2 << 50,
            po: 3 << 50,
            cnt: 4 << 50,
            cap_ms: 1 << 16,
            cap_o: 1 << 22,
            cap_cnt: 1024,
        };
        let cx = Ctx {
            k,
            n_sm: 132,
            gemv_occupancy: &occ,
            gemv_prefetch: 2,
            fused_attention,
            fuse_decode,
            gemv_typed: true,
            step: 99 << 40,
            n_tok,
            attn,
        };
        lower(ops, &cx).unwrap()
    }

    /// The default: attention in three launches.
    fn lowered(ops: &[Op], n_tok: usize, k: &Kernels) -> Vec<Cmd> {
        lowered_with(ops, n_tok, k, false)
    }

    fn funcs(cmds: &[Cmd]) -> Vec<Func> {
        cmds.iter()
            .filter_map(|c| {
                if let Cmd::Launch(l) = c {
                    Some(l.f)
                } else {
                    None
                }
            })
            .collect()
    }

    #[test]
    fn a_decode_step_fuses_to_seven_kernels_per_layer() {
        let k = Kernels::fake();
        let cmds = lowered(&llama_step(1, 3), 1, &k);
        let f = funcs(&cmds);
        assert_eq!(f.len(), cmds.len(), "no GEMM in a decode step");
        // q/k/v mix Q4_K and Q6_K: the generic GEMV; attn_output (Q4_K), gate/up (a Q4_K
        // pair), ffn_down and the head (Q6_K): the typed kernels.
        let [q4k, q4k_pair] = k.gemv_typed[4];
        let q6k = k.gemv_typed[6][0];
        let layer = [
            k.gemv,
            k.rope_qk_store,
            k.attn_decode_split_64,
            k.attn_decode_reduce,
            q4k,
            q4k_pair,
            q6k,
        ];
        let mut want = vec![k.embed_rows];
        for _ in 0..3 {
            want.extend(layer);
        }
        want.extend([k.copy_f32, q6k]);
        assert_eq!(f, want);
    }

    #[test]
    fn plain_launches_past_the_weight_limit_take_the_generic_gemv() {
        let k = Kernels::fake();
        let q8 = GEMV_TYPES
            .iter()
            .position(|&(g, _)| g == GgmlType::Q8_0)
            .unwrap();
        let matmul = |rows: u32, out: u64| Op::Matmul {
            w: mat(out, GgmlType::Q8_0, rows, 4096),
            bias: None,
            x: 1 << 40,
            rows: 1,
            out: out << 40,
        };
        // 16384 × 4096 weights: exactly the limit, typed; one row more: generic.
        let at = (TYPED_GEMV_MAX_WEIGHTS / 4096) as u32;
        assert_eq!(
            funcs(&lowered(&[matmul(at, 2)], 1, &k)),
            [k.gemv_typed[q8][0]]
        );
        assert_eq!(funcs(&lowered(&[matmul(at + 1, 2)], 1, &k)), [k.gemv]);
    }

    #[test]
    fn fused_attention_gives_five_kernels_per_layer() {
        let k = Kernels::fake();
        let cmds = lowered_with(&llama_step(1, 3), 1, &k, true);
        let f = funcs(&cmds);
        let [q4k, q4k_pair] = k.gemv_typed[4];
        let q6k = k.gemv_typed[6][0];
        let mut want = vec![k.embed_rows];
        for _ in 0..3 {
            want.extend([k.gemv, k.attn_decode_fused_64, q4k, q4k_pair, q6k]);
        }
        want.extend([k.copy_f32, q6k]);
        assert_eq!(f, want);
    }

    #[test]
    fn a_prefill_step_runs_op_by_op_with_gemms() {
        let k = Kernels::fake();
        let cmds = lowered(&llama_step(7, 1), 7, &k);
        let gemms = cmds
            .iter()
            .filter(|c| matches!(c, Cmd::Gemm { .. }))
            .count();
        assert_eq!(gemms, 7);
        let f = funcs(&cmds);
        assert!(f.contains(&k.attn_prefill_64) && f.contains(&k.kv_store) && f.contains(&k.swiglu));
        // The single logits row still takes the fused norm + GEMV (the Q6_K head).
        assert_eq!(f[f.len() - 2..], [k.copy_f32, k.gemv_typed[6][0]]);
    }

    #[test]
    fn aliasing_outputs_are_not_fused() {
        let k = Kernels::fake();
        let x = 1u64 << 40;
        // A product overwriting the norm's input cannot run inside the norm's launch
        // (other blocks still read it).
        let ops = [
            Op::RmsNorm {
                x,
                w: 7,
                n: 256,
                rows: 1,
                eps: 1e-5,
                out: 2 << 40,
            },
            Op::Matmul {
                w: mat(1, GgmlType::Q4_0, 256, 256),
                bias: None,
                x: 2 << 40,
                rows: 1,
                out: x,
            },
        ];
        assert_eq!(
            funcs(&lowered(&ops, 1, &k)),
            [k.rms_norm_rows, k.gemv_typed[0][0]]
        );
    }

    /// A decode step's mHC write-back of one sublayer and the next one's pre, `d` columns
    /// per stream.
    fn hc_pair(d: i32) -> [Op; 2] {
        let x = 1u64 << 40;
        let post = HcPostArgs {
            x,
            y: 2 << 40,
            mix: 3 << 40,
            n: 4,
            d,
            rb: 0,
            pad: 0,
        };
        let pre = HcPreArgs {
            fn_: 4 << 40,
            m: 5 << 40,
            partials: 6 << 40,
            counter: 7 << 40,
            base: 8 << 40,
            scale: 9 << 40,
            out: 10 << 40,
            mix: 3 << 40,
            n: 4,
            d,
            iters: 20,
            rb: 0,
            eps: 1e-6,
            norm_eps: 1e-5,
        };
        [Op::HcPost(post), Op::HcPre { x, args: pre }]
    }

    #[test]
    fn hc_post_and_pre_fuse_while_every_block_fits_on_its_own_sm() {
        // `hc_post_pre` meets in a grid barrier: one block of HC_COLS columns per SM at
        // most (the test context has 132 SMs).
        let k = Kernels::fake();
        let fused = lowered(&hc_pair(4096), 1, &k);
        assert_eq!(funcs(&fused), [k.hc_post_pre, k.hc_sinkhorn]);
        let Cmd::Launch(l) = &fused[0] else {
            unreachable!()
        };
        assert_eq!(l.grid, (32, 1, 1));
        let wide = (133 * HC_COLS) as i32;
        assert_eq!(
            funcs(&lowered(&hc_pair(wide), 1, &k)),
            [k.hc_post, k.hc_pre_one]
        );
    }

    #[test]
    fn the_first_pre_runs_as_hc_post_pre_without_a_write_back() {
        // The first sublayer's pre has no write-back before it: `hc_post_pre` with a null
        // `y` (the streams as they are) and its Sinkhorn beside the next kernel, as every
        // later sublayer's; too wide for one block per SM, or unfused, `hc_pre_one`.
        let k = Kernels::fake();
        let [post, pre] = hc_pair(4096);
        let Op::HcPost(p) = post else { unreachable!() };
        let product = Op::Matmul {
            w: mat(1, GgmlType::Q8_0, 64, 4096),
            bias: None,
            x: 10 << 40,
            rows: 1,
            out: 11 << 40,
        };
        let cmds = lowered(&[pre, product, post, pre], 1, &k);
        let gemv = k.gemv_typed[GEMV_TYPES
            .iter()
            .position(|&(g, _)| g == GgmlType::Q8_0)
            .unwrap()][0];
        assert_eq!(
            funcs(&cmds),
            [
                k.hc_post_pre,
                gemv,
                k.hc_sinkhorn,
                k.hc_post_pre,
                k.hc_sinkhorn
            ]
        );
        let Op::HcPre { args, .. } = pre else {
            unreachable!()
        };
        let mut want = Args::new();
        want.push(HcPostArgs {
            x: p.x,
            n: 4,
            d: 4096,
            rb: 0,
            ..HcPostArgs::default()
        })
        .push(args);
        let Cmd::Launch(l) = &cmds[0] else {
            unreachable!()
        };
        assert_eq!((l.args.clone(), l.grid), (want, (32, 1, 1)));
        let [_, wide] = hc_pair((133 * HC_COLS) as i32);
        assert_eq!(funcs(&lowered(&[wide], 1, &k)), [k.hc_pre_one]);
        let unfused = lowered_ctx(&[pre], 1, &k, false, false);
        assert_eq!(funcs(&unfused), [k.hc_pre_one]);
    }

    #[test]
    fn a_gemv_before_the_sinkhorn_leaves_it_a_slot() {
        // The test context: 132 SMs, 2 GEMV blocks each. A product of 4096 rows (512
        // blocks of 8 rows) fills every slot: one block fewer, so that `hc_sinkhorn` finds
        // room. One of 64 rows (8 blocks) leaves room anyway; a product elsewhere keeps its
        // grid.
        let k = Kernels::fake();
        let [post, pre] = hc_pair(4096);
        let product = |rows| Op::Matmul {
            w: mat(1, GgmlType::Q8_0, rows, 4096),
            bias: None,
            x: 10 << 40,
            rows: 1,
            out: 11 << 40,
        };
        let grids = |ops: &[Op]| -> Vec<(u32, u32, u32)> {
            lowered(ops, 1, &k)
                .iter()
                .filter_map(|c| match c {
                    Cmd::Launch(l) if l.label == "gemv" => Some(l.grid),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(
            grids(&[post, pre, product(4096), product(4096)]),
            [(263, 1, 1), (264, 1, 1)]
        );
        assert_eq!(grids(&[post, pre, product(64)]), [(8, 1, 1)]);
        // The Sinkhorn goes beside the sublayer's first product of 16 MB or more (17.8),
        // before the next sublayer's `hc_post_pre`.
        let ops = [post, pre, product(64), product(4096), post, pre];
        assert_eq!(grids(&ops), [(8, 1, 1), (263, 1, 1)]);
        let gemv = k.gemv_typed[GEMV_TYPES
            .iter()
            .position(|&(g, _)| g == GgmlType::Q8_0)
            .unwrap()][0];
        assert_eq!(
            funcs(&lowered(&ops, 1, &k)),
            [
                k.hc_post_pre,
                gemv,
                gemv,
                k.hc_sinkhorn,
                k.hc_post_pre,
                k.hc_sinkhorn
            ]
        );
        // A plain write-back (the last layer's `hc_post`) reads post and comb: the
        // Sinkhorn goes before it even when a long product follows.
        let ops = [post, pre, product(64), post, product(4096)];
        assert_eq!(
            funcs(&lowered(&ops, 1, &k)),
            [k.hc_post_pre, gemv, k.hc_sinkhorn, k.hc_post, gemv]
        );
        assert_eq!(grids(&ops), [(8, 1, 1), (264, 1, 1)]);
        // A sublayer without a command after its `hc_post_pre` keeps its Sinkhorn,
        // which then follows it directly and waits for it.
        let cmds = lowered(&[post, pre, post, pre], 1, &k);
        assert_eq!(
            funcs(&cmds),
            [k.hc_post_pre, k.hc_sinkhorn, k.hc_post_pre, k.hc_sinkhorn]
        );
        let waits: Vec<_> = cmds
            .iter()
            .filter_map(|c| match c {
                Cmd::Launch(l) if l.f == k.hc_sinkhorn => Some(l.args.clone()),
                _ => None,
            })
            .collect();
        let Op::HcPre { args, .. } = pre else {
            unreachable!()
        };
        let mut want = Args::new();
        want.push(args).push(1i32);
        assert_eq!(waits, [want.clone(), want]);
    }

    #[test]
    fn the_sinkhorn_follows_the_launch_after_hc_post_pre() {
        // `hc_sinkhorn` runs beside the sublayer's first kernel: after it in the stream,
        // with the mHC step's arguments.
        let k = Kernels::fake();
        let other = |f| {
            Op::Kernel(crate::ops::KernelOp {
                f,
                grid: (1, 1, 1),
                block: 32,
                smem: 0,
                args: crate::ops::KArgs::default(),
                label: "other",
            })
        };
        let [post, pre] = hc_pair(4096);
        let ops = [post, pre, other(k.hc_rms), other(k.hc_head), post, pre];
        let cmds = lowered(&ops, 1, &k);
        assert_eq!(
            funcs(&cmds),
            [
                k.hc_post_pre,
                k.hc_rms,
                k.hc_sinkhorn,
                k.hc_head,
                k.hc_post_pre,
                k.hc_sinkhorn
            ]
        );
        let Op::HcPre { args, .. } = pre else {
            unreachable!()
        };
        let Cmd::Launch(l) = &cmds[2] else {
            unreachable!()
        };
        assert_eq!((l.grid, l.block), ((1, 1, 1), HC_SINKHORN_THREADS));
        let mut want = Args::new();
        want.push(args).push(0i32);
        assert_eq!(l.args, want);
        // The last `hc_sinkhorn`, with no kernel after `hc_post_pre`, waits first.
        let Cmd::Launch(l) = &cmds[5] else {
            unreachable!()
        };
        let mut want = Args::new();
        want.push(args).push(1i32);
        assert_eq!(l.args, want);
    }

    /// A KDA decode step's core (reading q at `q`) and its gated output norm, the norm
    /// writing `out`.
    fn delta_pair(q: u64, out: u64) -> [Op; 2] {
        let (o, z) = (1u64 << 40, 2u64 << 40);
        let p = DeltaParams {
            q,
            out: o,
            n: 1,
            hk: 64,
            hv: 64,
            dk: 128,
            dv: 128,
            kc: 4,
            gc: 128,
            ..DeltaParams::default()
        };
        let g = GatedNormArgs {
            o,
            z,
            w: 3 << 40,
            out,
            heads: 64,
            dv: 128,
            eps: 1e-5,
            silu: 0,
            rb: 0,
        };
        [Op::DeltaStep { p, block: 128 }, Op::GatedNorm(g)]
    }

    #[test]
    fn the_gated_norm_runs_in_the_delta_step_unless_it_overwrites_an_input() {
        let k = Kernels::fake();
        let (q, out) = (5u64 << 40, 4u64 << 40);
        let fused = lowered(&delta_pair(q, out), 1, &k);
        assert_eq!(funcs(&fused), [k.delta_step]);
        let Cmd::Launch(l) = &fused[0] else {
            unreachable!()
        };
        assert_eq!((l.grid, l.block, l.smem), ((64, 1, 1), 128, 4 * 128 * 128));
        // In place over o: each block normalises the head it computed.
        assert_eq!(
            funcs(&lowered(&delta_pair(q, 1 << 40), 1, &k)),
            [k.delta_step]
        );
        // Over the step's q: other heads' blocks may still be reading it.
        assert_eq!(
            funcs(&lowered(&delta_pair(q, q), 1, &k)),
            [k.delta_step, k.gated_norm]
        );
    }

    #[test]
    fn the_delta_steps_gate_products_run_in_its_launch() {
        // KDA's f_b (→ g0) and g_b (→ the norm's z): bf16, 128 in, a head's 128 rows each.
        let k = Kernels::fake();
        let [step, norm] = delta_pair(5 << 40, 4 << 40);
        let (Op::DeltaStep { p, .. }, Op::GatedNorm(g)) = (step, norm) else {
            unreachable!()
        };
        let p = DeltaParams { g0: 6 << 40, ..p };
        let step = Op::DeltaStep { p, block: 128 };
        let gate = |x: u64, out: u64| FloatSeg {
            w: 50 << 40,
            x,
            out,
            ty: GgmlType::BF16 as i32,
            n_out: 64 * 128,
            n_in: 128,
            n_tok: 1,
            lanes: float_lanes(128, 2),
            ..FloatSeg::default()
        };
        let (f_b, g_b) = (gate(40 << 40, p.g0), gate(41 << 40, g.z));
        // First in the recording: the state loaded after the wait (see below for early).
        let want = DeltaParams {
            early: 0,
            gz: g.z,
            gw: g.w,
            gout: g.out,
            geps: g.eps,
            g0_prod: f_b,
            gz_prod: g_b,
            ..p
        };
        for ops in [
            [Op::FloatGemv(f_b), Op::FloatGemv(g_b), step, norm],
            [Op::FloatGemv(g_b), Op::FloatGemv(f_b), step, norm],
        ] {
            let cmds = lowered(&ops, 1, &k);
            let [Cmd::Launch(l)] = &cmds[..] else {
                panic!("one launch expected");
            };
            assert_eq!((l.f, l.grid, l.block), (k.delta_step, (64, 1, 1), 512));
            assert_eq!(l.args, Args::with(want));
            assert_eq!(l.bytes, 2 * 64 * 128 * 128 * 2);
        }
        // After the products of the layer's input (KDA's f_a, b, g_a): the state loaded
        // early.
        let f_a = |out: u64| {
            Op::FloatGemv(FloatSeg {
                x: 60 << 40,
                out,
                n_out: 128,
                ..f_b
            })
        };
        let ops = [
            f_a(f_b.x),
            Op::FloatGemv(f_b),
            Op::FloatGemv(g_b),
            step,
            norm,
        ];
        let cmds = lowered(&ops, 1, &k);
        let [_, Cmd::Launch(l)] = &cmds[..] else {
            panic!("two launches expected");
        };
        assert_eq!(l.args, Args::with(DeltaParams { early: 1, ..want }));
        // A product reading another's output (g0): each in its own launch before the step.
        let reads_g0 = FloatSeg { x: p.g0, ..g_b };
        let ops = [Op::FloatGemv(f_b), Op::FloatGemv(reads_g0), step, norm];
        let f = k.gemv_float_multi;
        assert_eq!(funcs(&lowered(&ops, 1, &k)), [f, f, k.delta_step]);
        // One of them alone.
        let cmds = lowered(&[Op::FloatGemv(g_b), step, norm], 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        let g0_given = DeltaParams {
            g0_prod: FloatSeg::default(),
            ..want
        };
        assert_eq!(l.args, Args::with(g0_given));
        // Not: a product reading what the step writes, one that is neither gate, rows
        // that are not whole heads, or without the norm whose gate is z.
        let reads_o = FloatSeg { x: p.out, ..f_b };
        let other = FloatSeg {
            out: 7 << 40,
            ..f_b
        };
        let short = FloatSeg {
            n_out: 64 * 127,
            ..f_b
        };
        for (ops, n) in [
            (vec![Op::FloatGemv(reads_o), step, norm], 2),
            (vec![Op::FloatGemv(other), step, norm], 2),
            (vec![Op::FloatGemv(short), step, norm], 2),
            (vec![Op::FloatGemv(f_b), Op::FloatGemv(g_b), step], 2),
        ] {
            assert_eq!(lowered(&ops, 1, &k).len(), n, "{ops:?}");
        }
    }

    #[test]
    fn a_delta_step_loads_its_state_early_only_after_projections() {
        let [step, _] = delta_pair(5 << 40, 4 << 40);
        let Op::DeltaStep { p, .. } = step else {
            unreachable!()
        };
        let (s, conv) = (30u64 << 40, 31u64 << 40);
        let p = DeltaParams {
            s,
            conv_state: conv,
            ..p
        };
        let step = Op::DeltaStep { p, block: 128 };
        let proj = |out| {
            Op::FloatGemv(FloatSeg {
                out,
                ..FloatSeg::default()
            })
        };
        // After the gate projections (KDA's decode step): early.
        let ops = [proj(40 << 40), proj(41 << 40), step];
        assert!(state_untouched_before(&ops, 2, &p));
        // First in the recording, after another step, or after a product writing the
        // state: after the wait.
        assert!(!state_untouched_before(&[step], 0, &p));
        assert!(!state_untouched_before(
            &[proj(40 << 40), step, step],
            2,
            &p
        ));
        assert!(!state_untouched_before(&[proj(s), step], 1, &p));
        assert!(!state_untouched_before(
            &[proj(40 << 40), proj(conv), step],
            2,
            &p
        ));
    }

    #[test]
    fn delta_params_match_the_kernel_layout() {
        // kernels/delta.cu: 28 pointers (conv_w three) + 17 4-byte fields, padded to 8,
        // then two FloatSeg (4 pointers + 7 4-byte fields, padded to 8).
        assert_eq!(std::mem::size_of::<FloatSeg>(), 4 * 8 + 7 * 4 + 4);
        assert_eq!(
            std::mem::size_of::<DeltaParams>(),
            28 * 8 + 17 * 4 + 4 + 2 * (4 * 8 + 7 * 4 + 4)
        );
    }

    #[test]
    fn replay_params_match_the_kernel_layout_and_fit_the_arguments() {
        // kernels/delta.cu: REPLAY_LAYERS layers of 7 pointers, then 9 4-byte fields
        // padded to 8; one launch argument, within KArgs' 72 words.
        assert_eq!(
            std::mem::size_of::<crate::ops::ReplayParams>(),
            crate::ops::REPLAY_LAYERS * 7 * 8 + 10 * 4
        );
        crate::ops::KArgs::default().push(crate::ops::ReplayParams::default());
    }

    #[test]
    fn float_rows_take_about_four_loads_per_thread() {
        // A 4096-value f32 router row: 1024 chunks of 16 bytes, a whole block per row.
        assert_eq!(float_lanes(4096, 4), 256);
        // 4096 bf16 values: 512 chunks, two rows per block; a 128-value bf16 row (GLM's
        // KDA f_b/g_b) 16 chunks on four threads; rows shorter than a chunk still four.
        assert_eq!(float_lanes(4096, 2), 128);
        assert_eq!(float_lanes(128, 2), 4);
        assert_eq!(float_lanes(3, 4), 4);
        let seg = FloatSeg {
            n_out: 288,
            lanes: float_lanes(4096, 4),
            ..FloatSeg::default()
        };
        assert_eq!(seg.blocks(), 288);
        let seg = FloatSeg {
            n_out: 8193,
            lanes: 4,
            ..FloatSeg::default()
        };
        assert_eq!(seg.blocks(), 129);
    }

    #[test]
    fn float_products_of_one_launch_count_their_weight_bytes() {
        // DeepSeek-V4's CSA indexer: q_b (f16, 8192 × 1024) and the weights' projection
        // (f32 here, 64 × 4096), different inputs and outputs: one launch.
        let k = Kernels::fake();
        let seg = |x: u64, out: u64, ty: GgmlType, n_out: i32, n_in: i32| {
            Op::FloatGemv(FloatSeg {
                x: x << 40,
                out: out << 40,
                ty: ty as i32,
                n_out,
                n_in,
                n_tok: 1,
                lanes: float_lanes(n_in as usize, ty.type_size()),
                ..FloatSeg::default()
            })
        };
        let ops = [
            seg(1, 2, GgmlType::F16, 8192, 1024),
            seg(3, 4, GgmlType::F32, 64, 4096),
        ];
        let cmds = lowered(&ops, 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        assert_eq!(l.f, k.gemv_float_multi);
        assert_eq!(l.bytes, 8192 * 1024 * 2 + 64 * 4096 * 4);
        // 8 rows of 32 threads per block, then a block per f32 row of 256 threads.
        assert_eq!(l.grid.0, 8192 / 8 + 64);
    }

    /// DeepSeek-V4's rope of `n_head` heads of 512 on `x`, the trailing `n_dims` rotated
    /// (`sign` −1: back).
    fn ds4_rope(x: u64, n_head: i32, n_dims: i32, sign: f32) -> RopeTorchArgs {
        RopeTorchArgs {
            x,
            step: 99 << 40,
            inv_freq: 3 << 40,
            n_head,
            head_dim: 512,
            n_dims,
            neox: 0,
            trailing: 1,
            sign,
            mscale: 1.0,
            rb: 0,
        }
    }

    #[test]
    fn a_norm_of_the_heads_a_rope_rotates_shares_its_launch() {
        // DeepSeek-V4's queries: 64 heads of 512 normalised per head, then rotated.
        let k = Kernels::fake();
        let norm = |out: u64, rows: u32| Op::NormRef {
            a: NormRefArgs {
                x: 1 << 40,
                w: 0,
                out: out << 40,
                cols: 512,
                eps: 1e-6,
                rb: 0,
                cast_once: 1,
            },
            rows,
        };
        let rope = |x: u64| Op::RopeTorch {
            a: ds4_rope(x << 40, 64, 64, 1.0),
            n_tok: 1,
        };
        let cmds = lowered(&[norm(2, 64), rope(2)], 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        assert_eq!((l.f, l.grid.0), (k.rms_norm_rope, 64));
        // Another buffer rotated, or rows that are not the heads: two launches.
        assert_eq!(
            funcs(&lowered(&[norm(2, 64), rope(4)], 1, &k)),
            [k.rms_norm_ref, k.rope_torch]
        );
        assert_eq!(
            funcs(&lowered(&[norm(2, 1), rope(2)], 1, &k)),
            [k.rms_norm_ref, k.rope_torch]
        );
    }

    #[test]
    fn the_router_runs_beside_a_product_it_does_not_touch() {
        // The shared expert's down product, then the router and the routing of one token.
        let k = Kernels::fake();
        let hn = 10u64 << 40;
        let seg = FloatSeg {
            w: 1 << 40,
            x: hn,
            out: 11 << 40,
            n_out: 256,
            n_in: 4096,
            n_tok: 1,
            lanes: 32,
            ..FloatSeg::default()
        };
        let p = crate::ops::RouteParams {
            logits: seg.out,
            ids: 12 << 40,
            weights: 13 << 40,
            ..Default::default()
        };
        let route = Op::MoeRoute {
            p,
            counter: 14 << 40,
        };
        let down = |x: u64, out: u64| Op::Matmul {
            w: mat(1, GgmlType::Q8_0, 4096, 2048),
            bias: None,
            x,
            rows: 1,
            out,
        };
        let beside = |ops: &[Op]| {
            let cmds = lowered(ops, 1, &k);
            let Some(Cmd::Launch(l)) = cmds.last() else {
                panic!("a launch expected")
            };
            assert_eq!(l.f, k.router_route);
            [0, 1].into_iter().find(|&b: &i32| {
                let mut want = Args::new();
                want.push(seg).push(p).push(14u64 << 40).push(b);
                l.args == want
            })
        };
        let router = Op::FloatGemv(seg);
        assert_eq!(beside(&[down(20 << 40, 21 << 40), router, route]), Some(1));
        // A product writing the router's input or reading the routing's output, or none
        // before it: the router waits first.
        assert_eq!(beside(&[down(20 << 40, hn), router, route]), Some(0));
        assert_eq!(beside(&[down(p.ids, 21 << 40), router, route]), Some(0));
        assert_eq!(beside(&[router, route]), Some(0));
        // The GEMV before holds two products of one input, the first writing the
        // router's input: waits first.
        let two = [down(20 << 40, hn), down(20 << 40, 21 << 40), router, route];
        assert_eq!(beside(&two), Some(0));
    }

    #[test]
    fn two_compressors_share_a_launch() {
        // DeepSeek-V4's CSA layer: the attention's compressor (entries of 512, 512
        // threads) and the indexer's (128), one after the other.
        let k = Kernels::fake();
        let comp = |base: u64, c: i32| CompressParams {
            step: 99 << 40,
            src_kv: base << 40,
            src_gate: (base + 1) << 40,
            kv: (base + 2) << 40,
            gate: (base + 3) << 40,
            ape: (base + 4) << 40,
            entries: (base + 5) << 40,
            cap: 8,
            m: 4,
            c,
            overlap: 1,
            ..CompressParams::default()
        };
        let op = |p, block| Op::Compress {
            p,
            blocks: 3,
            block,
        };
        let (a, b) = (comp(10, 512), comp(20, 128));
        let cmds = lowered(&[op(a, 512), op(b, 128)], 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        assert_eq!(
            (l.f, l.grid, l.block, l.smem),
            (k.compress_windows, (3, 2, 1), 512, 2048)
        );
        let mut want = Args::new();
        want.push(a).push(b);
        assert_eq!(l.args, want);
        // One alone: the second parameter all zero. One reading the other's entries: two.
        let cmds = lowered(&[op(b, 128)], 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        let mut want = Args::new();
        want.push(b).push(CompressParams::default());
        assert_eq!((l.grid, &l.args), ((3, 1, 1), &want));
        let reads = CompressParams {
            src_kv: a.entries,
            ..b
        };
        assert_eq!(lowered(&[op(a, 512), op(reads, 128)], 1, &k).len(), 2);
        // One writing what the other reads: two.
        let writes = CompressParams { kv: a.src_kv, ..b };
        assert_eq!(lowered(&[op(a, 512), op(writes, 128)], 1, &k).len(), 2);
    }

    #[test]
    fn the_layer_norm_of_a_compressors_row_shares_its_launch() {
        // GLM-5.3's indexer: k = LayerNorm(wk x) (128 values), then its compressor.
        let k = Kernels::fake();
        let ln = LayerNormArgs {
            x: 1 << 40,
            w: 2 << 40,
            b: 3 << 40,
            out: 4 << 40,
            cols: 128,
            eps: 1e-6,
            rb: 0,
            pad: 0,
        };
        let p = CompressParams {
            step: 99 << 40,
            src_kv: ln.out,
            src_gate: 5 << 40,
            kv: 6 << 40,
            gate: 7 << 40,
            ape: 8 << 40,
            entries: 9 << 40,
            cap: 32,
            m: 16,
            c: 128,
            ..CompressParams::default()
        };
        let norm = |rows| Op::LayerNorm { a: ln, rows };
        let comp = |p| Op::Compress {
            p,
            blocks: 2,
            block: 128,
        };
        let cmds = lowered(&[norm(1), comp(p)], 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        // Shared memory: the entry, then the normalised row.
        assert_eq!(
            (l.f, l.grid, l.block, l.smem),
            (k.compress_windows, (2, 1, 1), 128, 2 * 128 * 4)
        );
        let mut want = Args::new();
        want.push(CompressParams { ln, ..p })
            .push(CompressParams::default());
        assert_eq!(l.args, want);
        // Not: several rows (a prefill), a compressor of another row, overlapping windows.
        let other = CompressParams {
            src_kv: 10 << 40,
            ..p
        };
        let overlap = CompressParams { overlap: 1, ..p };
        // Nor rows of more than 256 values (a thread would sum two in one launch, one in
        // the other), nor a norm in place.
        let wide = |a: LayerNormArgs| Op::LayerNorm { a, rows: 1 };
        let long = LayerNormArgs { cols: 512, ..ln };
        let in_place = LayerNormArgs { x: ln.out, ..ln };
        let p512 = CompressParams { c: 512, ..p };
        for ops in [
            [norm(4), comp(p)],
            [norm(1), comp(other)],
            [norm(1), comp(overlap)],
            [wide(long), comp(p512)],
            [wide(in_place), comp(p)],
        ] {
            let cmds = lowered(&ops, 1, &k);
            assert_eq!(funcs(&cmds), [k.layer_norm_ref, k.compress_windows]);
        }
    }

    #[test]
    fn the_inverse_rope_of_the_attention_sums_shares_their_launch() {
        // DeepSeek-V4: 64 heads of 512, the trailing 64 columns rotated back by the query's
        // angle — one 64-column block of `sink_mix`, whose warp rotates them.
        let k = Kernels::fake();
        let p = crate::ops::SinkParams {
            step: 99 << 40,
            q: 1 << 40,
            kv: 2 << 40,
            window: 3 << 40,
            entries: 0,
            sel: 0,
            sinks: 4 << 40,
            out: 5 << 40,
            scores: 6 << 40,
            cap: 128,
            heads: 64,
            hd: 512,
            window_len: 128,
            rate: 0,
            per_q: 0,
            rb: 0,
            n_stride: 128,
            scale: 0.04,
            kpw: 1,
        };
        let rope = |x: u64, n_dims| ds4_rope(x << 40, 64, n_dims, -1.0);
        let ops = |r: RopeTorchArgs| [Op::SinkMix { p, rows: 1 }, Op::RopeTorch { a: r, n_tok: 1 }];
        let cmds = lowered(&ops(rope(5, 64)), 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        assert_eq!((l.f, l.grid), (k.sink_mix, (1, 8, 8)));
        let mut want = Args::new();
        want.push(p).push(rope(5, 64));
        assert_eq!(l.args, want);
        // Another buffer, or rotated columns across two warps' blocks: two launches, the
        // sums without a rope.
        for r in [rope(6, 64), rope(5, 128)] {
            let cmds = lowered(&ops(r), 1, &k);
            assert_eq!(funcs(&cmds), [k.sink_mix, k.rope_torch]);
            let Cmd::Launch(l) = &cmds[0] else {
                unreachable!()
            };
            let mut want = Args::new();
            want.push(p).push(RopeTorchArgs::default());
            assert_eq!(l.args, want);
        }
    }

    /// One row of 512 values from `src` into the ring `dst` of `cap` rows.
    fn store_row(src: u64, dst: u64, cap: i32) -> Op {
        Op::StoreRows {
            a: crate::ops::StoreRowsArgs {
                step: 99 << 40,
                src,
                dst,
                rows: 1,
                row_len: 512,
                cap,
                pad: 0,
            },
            grid: 2,
        }
    }

    #[test]
    fn a_rope_stores_its_rows_into_the_ring_after_it() {
        // DeepSeek-V4's key: one head of 512, then into the window's ring of 383 rows.
        let k = Kernels::fake();
        let rope = ds4_rope(1 << 40, 1, 64, 1.0);
        let store = |src: u64| store_row(src << 40, 2 << 40, 383);
        let ops = |src| [Op::RopeTorch { a: rope, n_tok: 1 }, store(src)];
        let cmds = lowered(&ops(1), 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        assert_eq!((l.f, l.grid), (k.rope_torch_store, (1, 1, 1)));
        // Other rows stored: two launches.
        assert_eq!(
            funcs(&lowered(&ops(4), 1, &k)),
            [k.rope_torch, k.store_rows]
        );
    }

    #[test]
    fn a_norm_stores_its_rows_into_the_ring_after_it() {
        // GLM-5.3's latent row: 512 values normalised, then into the cache.
        let k = Kernels::fake();
        let norm = Op::RmsNorm {
            x: 1 << 40,
            w: 2 << 40,
            n: 512,
            rows: 1,
            eps: 1e-6,
            out: 3 << 40,
        };
        let store = |src: u64| store_row(src << 40, 4 << 40, 4096);
        let cmds = lowered(&[norm, store(3)], 1, &k);
        let [Cmd::Launch(l)] = &cmds[..] else {
            panic!("one launch expected");
        };
        assert_eq!((l.f, l.grid), (k.rms_norm_store, (1, 1, 1)));
        assert_eq!(
            funcs(&lowered(&[norm, store(5)], 1, &k)),
            [k.rms_norm_rows, k.store_rows]
        );
    }

    #[test]
    fn norm_and_rope_params_match_the_kernel_layout() {
        // kernels/norm.cu: NormRef = 3 pointers + 4 4-byte fields; kernels/common.cuh:
        // RopeTorch = 3 pointers + 8 4-byte fields.
        assert_eq!(std::mem::size_of::<NormRefArgs>(), 3 * 8 + 4 * 4);
        assert_eq!(std::mem::size_of::<RopeTorchArgs>(), 3 * 8 + 8 * 4);
        // kernels/sparse.cu: SinkParams = 9 pointers + 10 4-byte fields.
        assert_eq!(
            std::mem::size_of::<crate::ops::SinkParams>(),
            9 * 8 + 10 * 4
        );
        // StoreRows = 3 pointers + 3 4-byte fields, padded to 40.
        assert_eq!(std::mem::size_of::<crate::ops::StoreRowsArgs>(), 40);
        // CompressParams = 9 pointers + 8 4-byte fields, then a LayerNorm (4 pointers + 3
        // 4-byte fields, padded to 48).
        assert_eq!(std::mem::size_of::<LayerNormArgs>(), 48);
        assert_eq!(std::mem::size_of::<CompressParams>(), 9 * 8 + 8 * 4 + 48);
    }

    #[test]
    fn float_params_match_the_kernel_layout() {
        // kernels/common.cuh: FloatSeg = 4 pointers + 7 4-byte fields, padded to 64 bytes.
        assert_eq!(std::mem::size_of::<FloatSeg>(), 64);
        assert_eq!(std::mem::size_of::<FloatMulti>(), 6 * 64 + 8);
    }

    #[test]
    fn splits_cover_short_and_long_contexts() {
        assert_eq!(decode_splits(100, 8, 132), 13);
        assert_eq!(decode_splits(20, 8, 132), 3);
        assert_eq!(decode_splits(4096, 8, 132), 33);
        assert_eq!(decode_splits(1 << 20, 1, 132), 64);
    }

    #[test]
    fn gemv_params_match_the_kernel_layout() {
        // kernels/gemv.cu: Seg = 2 x 32-byte Planes + 5 pointers + 6 4-byte fields = 128
        // bytes; GemvParams = 3 Segs + 3 pointers + 6 4-byte fields = 432 bytes.
        assert_eq!(std::mem::size_of::<Seg>(), 128);
        assert_eq!(std::mem::size_of::<GemvParams>(), 432);
    }
}
