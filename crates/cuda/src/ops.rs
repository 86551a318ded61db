//! The operations of one forward step as the backend records them.
//!
//! Backend calls do not launch kernels at once: they append an [`Op`] (device pointers
//! and shapes, plain data) to the calling thread's [`Recording`]. When the step's
//! results are needed (`read`, the next `step`, a snapshot) the recording is lowered to
//! kernels ([`crate::lower`]), which fuses neighbouring operations, and either run
//! directly (multi-token steps) or, for one-token steps, captured once as a CUDA graph
//! and replayed while the op list stays the same ([`crate::graph`]).
//!
//! Ops hold raw pointers; the recording also holds references to the memory they point
//! to (`keep`), so a buffer dropped before the flush stays alive until its kernels are
//! enqueued (device frees are stream-ordered after that).
//!
//! The kernels' parameter structs (`#[repr(C)]`, field for field the C structs) name
//! their padding `pad` and keep it zero: arguments are compared byte for byte (a captured
//! graph's ops, the lowering's tests).

use std::sync::Arc;
use std::time::Instant;

use ds4_gguf::GgmlType;

use crate::driver::{Args, DPtr, DevMem, Func};

/// A quantized matrix on the device: planes (see [`crate::layout`]), type and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatRef {
    pub planes: [DPtr; 4],
    pub ty: GgmlType,
    pub rows: u32,
    pub cols: u32,
}

/// Rotary embedding parameters as the kernels take them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeArgs {
    pub n_dims: u32,
    pub neox: bool,
    /// `freq_base^(-2/n_dims)`, computed on the host as the CPU backend does.
    pub theta_scale: f32,
}

/// One recorded operation (the `Backend` trait's operations, with device pointers).
/// `Kernel` is the large variant; a step holds a few thousand ops in one vector, so the
/// padding costs little and keeps ops `Copy` and comparable (graph keys).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    Embed {
        table: MatRef,
        out: DPtr,
    },
    RmsNorm {
        x: DPtr,
        w: DPtr,
        n: u32,
        rows: u32,
        eps: f32,
        out: DPtr,
    },
    Matmul {
        w: MatRef,
        bias: Option<DPtr>,
        x: DPtr,
        rows: u32,
        out: DPtr,
    },
    Rope {
        x: DPtr,
        n_head: u32,
        head_dim: u32,
        rope: RopeArgs,
    },
    Attention {
        k_cache: DPtr,
        v_cache: DPtr,
        n_ctx: u32,
        n_head: u32,
        n_head_kv: u32,
        head_dim: u32,
        q: DPtr,
        k: DPtr,
        v: DPtr,
        out: DPtr,
    },
    /// `silu(gate)·up`: ggml's arithmetic, or (`reference`) the PyTorch references'
    /// `silu(min(gate, lim))·clamp(up, −lim, lim)` in f32.
    Swiglu {
        gate: DPtr,
        up: DPtr,
        len: u32,
        out: DPtr,
        lim: f32,
        reference: bool,
    },
    Add {
        x: DPtr,
        y: DPtr,
        len: u32,
    },
    Copy {
        src: DPtr,
        dst: DPtr,
        len: u32,
    },
    /// `out = round(w · x + bias)` with a float weight (F32, F16, BF16): consecutive ones
    /// that do not read each other's outputs share one launch ([`crate::lower`]).
    FloatGemv(FloatSeg),
    /// mHC write-back of one token (`hc_post`).
    HcPost(HcPostArgs),
    /// mHC pre of one token: right after an [`Op::HcPost`] of the same streams both run
    /// as one launch (`hc_post_pre`); alone, as `hc_post_pre` without the write-back
    /// (`hc_pre_one` when the decode fusions are off or the streams too wide).
    HcPre {
        x: DPtr,
        args: HcPreArgs,
    },
    /// The routing of one token (`moe_route`); right after the router's
    /// [`Op::FloatGemv`] both run as one launch (`router_route`, `counter` its
    /// zeroed completion counter).
    MoeRoute {
        p: RouteParams,
        counter: DPtr,
    },
    /// One token's experts down products and their weighted sum (`gemv_experts_down_sum`
    /// over `grid_x` row blocks); an [`Op::Add`] of the sum right after it becomes its
    /// `tail.add`.
    ExpertsDown {
        e: ExpertGemv,
        tail: ReduceTail,
        grid_x: u32,
        smem: u32,
    },
    /// An f32 cuBLAS product (multi-token float products, MLA's prefill attention).
    Sgemm(crate::gemm::Sgemm),
    /// One token's delta-rule step (`delta_step`, `block` threads); an
    /// [`Op::GatedNorm`] of its output right after it runs in the same launch.
    DeltaStep {
        p: DeltaParams,
        block: u32,
    },
    GatedNorm(GatedNormArgs),
    /// The references' RMSNorm (`rms_norm_ref`) of `rows` rows; a [`Op::RopeTorch`] of its
    /// output right after it, one row per head, runs in the same launch
    /// (`rms_norm_rope`).
    NormRef {
        a: NormRefArgs,
        rows: u32,
    },
    /// The references' LayerNorm (`layer_norm_ref`) of `rows` rows; a [`Op::Compress`] of
    /// its one output row right after it runs in the same launch.
    LayerNorm {
        a: LayerNormArgs,
        rows: u32,
    },
    /// The step's rows into a compressor's rings and the entries of its windows that
    /// close (`compress_windows`, `blocks` blocks of `block` threads); a second one right
    /// after it runs in the same launch (blockIdx.y picks the compressor).
    Compress {
        p: CompressParams,
        blocks: u32,
        block: u32,
    },
    /// DeepSeek-V4's attention's weighted sums (`sink_mix`, after `sink_scores`) of
    /// `rows` queries; a [`Op::RopeTorch`] of its output right after it (the inverse rope)
    /// runs in the same launch when one warp holds a head's rotated columns.
    SinkMix {
        p: SinkParams,
        rows: u32,
    },
    /// The step's rows into a ring (`store_rows`, `grid` blocks of 256 threads); right
    /// after a [`Op::RopeTorch`] of the same rows it runs in the rope's launch.
    StoreRows {
        a: StoreRowsArgs,
        grid: u32,
    },
    /// transformers' rope in place (`rope_torch`) on `n_tok` tokens; a
    /// [`Op::StoreRows`] of its rows right after it runs in the same launch.
    RopeTorch {
        a: RopeTorchArgs,
        n_tok: u32,
    },
    /// A launch recorded as is (the MoE families' operations, `crate::moe_ops`).
    Kernel(KernelOp),
}

/// `DeltaParams` of kernels/delta.cu: a delta-rule call's inputs, state, journal and
/// shape (see `CudaBackend::delta_net_op`).
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, Default, PartialEq)]
pub struct DeltaParams {
    pub q: DPtr,
    pub k: DPtr,
    pub v: DPtr,
    pub g0: DPtr,
    pub b: DPtr,
    pub conv_w: [DPtr; 3],
    pub dt_bias: DPtr,
    pub decay: DPtr,
    pub conv_state: DPtr,
    pub mixed: DPtr,
    pub kq: DPtr,
    pub kk: DPtr,
    pub kv: DPtr,
    pub kg: DPtr,
    pub kb: DPtr,
    pub jpre: DPtr,
    pub jk: DPtr,
    pub jv: DPtr,
    pub jg: DPtr,
    pub jb: DPtr,
    pub step: DPtr,
    pub out: DPtr,
    pub s: DPtr,
    /// `delta_step`'s gated output norm (zero `gz`: none), set by the lowering.
    pub gz: DPtr,
    pub gw: DPtr,
    pub gout: DPtr,
    pub row0: i32,
    pub n: i32,
    pub hk: i32,
    pub hv: i32,
    pub dk: i32,
    pub dv: i32,
    pub kc: i32,
    pub gc: i32,
    pub gate: i32,
    pub rb: i32,
    pub cap: i32,
    pub src_cap: i32,
    pub src_pos: i32,
    pub lb: f32,
    pub geps: f32,
    pub gsilu: i32,
    /// `delta_step` loads the state before waiting for the previous kernel (set by the
    /// lowering when that kernel cannot write it).
    pub early: i32,
    /// Padding, zero (see the module docs).
    pub pad: i32,
    /// `delta_step`'s products that form `g0` and `gz` in its launch, each block its
    /// head's rows (zero `w`: given), set by the lowering.
    pub g0_prod: FloatSeg,
    pub gz_prod: FloatSeg,
}

/// Layers per journal replay launch (`REPLAY_LAYERS` of kernels/delta.cu): as many as
/// [`KArgs`] holds beside the shape.
pub const REPLAY_LAYERS: usize = 9;

/// `ReplayLayer` of kernels/delta.cu: one layer's conv state, journal and state.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplayLayer {
    pub conv_state: DPtr,
    pub pre: DPtr,
    pub k: DPtr,
    pub v: DPtr,
    pub g: DPtr,
    pub beta: DPtr,
    pub s: DPtr,
}

/// `ReplayParams` of kernels/delta.cu: the journal replays of up to [`REPLAY_LAYERS`]
/// layers of one shape (see `CudaBackend::delta_replay_op`).
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, Default, PartialEq)]
pub struct ReplayParams {
    pub layer: [ReplayLayer; REPLAY_LAYERS],
    /// Tokens replayed.
    pub n: i32,
    /// Key and value heads and their widths.
    pub hk: i32,
    pub hv: i32,
    pub dk: i32,
    pub dv: i32,
    /// Conv kernel, gate channels per value head.
    pub kc: i32,
    pub gc: i32,
    /// The journals' slots: token t of the replay is at slot (pos + t) mod cap.
    pub cap: i32,
    pub pos: i32,
    /// Padding, zero.
    pub pad: i32,
}

/// The gated output norm per head (`gated_norm` of kernels/norm.cu): `out` from `o` and
/// the gate `z`, `heads` heads of `dv` values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedNormArgs {
    pub o: DPtr,
    pub z: DPtr,
    pub w: DPtr,
    pub out: DPtr,
    pub heads: i64,
    pub dv: i32,
    pub eps: f32,
    pub silu: i32,
    pub rb: i32,
}

/// `NormRef` of kernels/norm.cu: rows of `cols` values.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq)]
pub struct NormRefArgs {
    pub x: DPtr,
    pub w: DPtr,
    pub out: DPtr,
    pub cols: i32,
    pub eps: f32,
    pub rb: i32,
    pub cast_once: i32,
}

/// `LayerNorm` of kernels/common.cuh: rows of `cols` values.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq, Default)]
pub struct LayerNormArgs {
    pub x: DPtr,
    pub w: DPtr,
    pub b: DPtr,
    pub out: DPtr,
    pub cols: i32,
    pub eps: f32,
    pub rb: i32,
    /// Padding, zero (see the module docs).
    pub pad: i32,
}

/// `StoreRows` of kernels/common.cuh.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq)]
pub struct StoreRowsArgs {
    pub step: DPtr,
    pub src: DPtr,
    pub dst: DPtr,
    pub rows: i32,
    pub row_len: i32,
    pub cap: i32,
    /// Tail padding, zero (see the module docs).
    pub pad: i32,
}

/// `CompressParams` of kernels/sparse.cu (all zero: no second compressor).
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq, Default)]
pub struct CompressParams {
    pub step: DPtr,
    pub src_kv: DPtr,
    pub src_gate: DPtr,
    pub kv: DPtr,
    pub gate: DPtr,
    pub ape: DPtr,
    pub norm: DPtr,
    pub entries: DPtr,
    pub inv_freq: DPtr,
    pub cap: i32,
    pub m: i32,
    pub c: i32,
    pub overlap: i32,
    pub rope_dims: i32,
    pub rb: i32,
    pub eps: f32,
    pub mscale: f32,
    /// The LayerNorm whose one output row is `src_kv`, formed in the launch (zero `w`:
    /// none), set by the lowering.
    pub ln: LayerNormArgs,
}

/// `SinkParams` of kernels/sparse.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq)]
pub struct SinkParams {
    pub step: DPtr,
    pub q: DPtr,
    pub kv: DPtr,
    pub window: DPtr,
    pub entries: DPtr,
    pub sel: DPtr,
    pub sinks: DPtr,
    pub out: DPtr,
    pub scores: DPtr,
    pub cap: i32,
    pub heads: i32,
    pub hd: i32,
    pub window_len: i32,
    pub rate: i32,
    pub per_q: i32,
    pub rb: i32,
    pub n_stride: i32,
    pub scale: f32,
    /// `sink_scores`' keys per warp.
    pub kpw: i32,
}

/// `RopeTorch` of kernels/common.cuh, the parameters of `rope_torch` (kernels/rope.cu);
/// all zero: no rope (`sink_mix`'s second parameter).
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq, Default)]
pub struct RopeTorchArgs {
    pub x: DPtr,
    pub step: DPtr,
    pub inv_freq: DPtr,
    pub n_head: i32,
    pub head_dim: i32,
    pub n_dims: i32,
    pub neox: i32,
    pub trailing: i32,
    pub sign: f32,
    pub mscale: f32,
    pub rb: i32,
}

/// `HcPostArgs` of kernels/mhc.cu (`y` null: no write-back, `hc_post_pre` forms the pre
/// of the streams as they are).
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HcPostArgs {
    pub x: DPtr,
    pub y: DPtr,
    pub mix: DPtr,
    pub n: i32,
    pub d: i32,
    pub rb: i32,
    /// Padding, zero (see the module docs).
    pub pad: i32,
}

/// `HcPreArgs` of kernels/mhc.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq)]
pub struct HcPreArgs {
    pub fn_: DPtr,
    pub m: DPtr,
    pub partials: DPtr,
    pub counter: DPtr,
    pub base: DPtr,
    pub scale: DPtr,
    pub out: DPtr,
    pub mix: DPtr,
    pub n: i32,
    pub d: i32,
    pub iters: i32,
    pub rb: i32,
    pub eps: f32,
    pub norm_eps: f32,
}

/// Columns per block of `hc_post_pre` (kernels/mhc.cu `HC_COLS`).
pub const HC_COLS: usize = 128;

/// Threads per block of the float products (kernels/common.cuh `FG_THREADS`).
pub const FG_THREADS: u32 = 256;

/// Threads per output row of a float product whose rows are `n_in` values of `bytes`
/// bytes: about four 16-byte loads per thread, a power of two from 4 to [`FG_THREADS`]
/// (a 4096-value f32 router row takes a whole block; a 128-value bf16 row four threads).
pub fn float_lanes(n_in: usize, bytes: usize) -> i32 {
    let chunks = (n_in * bytes).div_ceil(16);
    chunks
        .div_ceil(4)
        .next_power_of_two()
        .clamp(4, FG_THREADS as usize) as i32
}

/// Blocks of [`FG_THREADS`] threads that take `n_out` rows of `lanes` threads each.
pub fn float_blocks(n_out: usize, lanes: i32) -> u32 {
    debug_assert!(
        lanes >= 4 && lanes as u32 <= FG_THREADS && lanes.count_ones() == 1,
        "lanes from float_lanes"
    );
    (n_out as u32).div_ceil(FG_THREADS / lanes as u32)
}

/// One float product as `gemv_float_multi` (kernels/float_gemv.cu) takes it: rows of
/// `n_in` contiguous values, `n_tok` tokens, `lanes` threads per row ([`float_lanes`]);
/// `first` is filled in by the lowering.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FloatSeg {
    pub w: DPtr,
    pub x: DPtr,
    pub out: DPtr,
    pub bias: DPtr,
    pub ty: i32,
    pub n_out: i32,
    pub n_in: i32,
    pub n_tok: i32,
    pub rb: i32,
    pub first: i32,
    pub lanes: i32,
    /// Padding, zero (see the module docs).
    pub pad: i32,
}

impl FloatSeg {
    /// Blocks of [`FG_THREADS`] threads that take its rows.
    pub fn blocks(&self) -> u32 {
        float_blocks(self.n_out as usize, self.lanes)
    }

    /// The bytes of its weight (f32, or f16/bf16).
    pub fn weight_bytes(&self) -> u64 {
        let value = if self.ty == GgmlType::F32 as i32 {
            4
        } else {
            2
        };
        self.n_out as u64 * self.n_in as u64 * value
    }

    /// The bytes of `x` it reads and of `out` it writes.
    pub fn reads(&self) -> std::ops::Range<DPtr> {
        self.x..self.x + (self.n_tok as u64) * (self.n_in as u64) * 4
    }

    pub fn writes(&self) -> std::ops::Range<DPtr> {
        self.out..self.out + (self.n_tok as u64) * (self.n_out as u64) * 4
    }
}

/// A kernel launch recorded ready to enqueue: function, shape, arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelOp {
    pub f: Func,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
    pub args: KArgs,
    pub label: &'static str,
}

/// Kernel arguments of fixed capacity (so that ops stay `Copy` and comparable): each
/// argument in 8-byte slots, as [`Args`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KArgs {
    words: [u64; 72],
    offs: [u16; 16],
    n_words: u16,
    n: u8,
}

impl Default for KArgs {
    fn default() -> Self {
        KArgs {
            words: [0; 72],
            offs: [0; 16],
            n_words: 0,
            n: 0,
        }
    }
}

impl KArgs {
    /// Appends one argument (a scalar, a pointer or a `#[repr(C)]` struct).
    ///
    /// # Panics
    /// When the arguments exceed the capacity (a programming error: every kernel's
    /// parameters are fixed).
    pub fn push<T: bytemuck::NoUninit>(&mut self, v: T) -> &mut Self {
        let n = std::mem::size_of::<T>().div_ceil(8).max(1);
        let off = self.n_words as usize;
        assert!(
            off + n <= self.words.len() && (self.n as usize) < self.offs.len(),
            "kernel arguments exceed {} words",
            self.words.len()
        );
        // SAFETY: the slots hold at least size_of::<T>() bytes, u64-aligned.
        unsafe { std::ptr::write_unaligned(self.words.as_mut_ptr().add(off) as *mut T, v) };
        self.offs[self.n as usize] = off as u16;
        self.n += 1;
        self.n_words += n as u16;
        self
    }

    /// The arguments in the driver's form.
    pub fn to_args(&self) -> Args {
        Args::from_slots(
            &self.words[..self.n_words as usize],
            &self.offs[..self.n as usize],
        )
    }
}

/// The pending operations of one step of one thread.
pub struct Recording {
    /// Tokens of the step (1 for decode).
    pub n_tok: usize,
    /// The device copy of the step's inputs (`StepInfo` + token ids).
    pub step_ptr: DPtr,
    pub ops: Vec<Op>,
    /// Memory the ops point to, held until they are enqueued.
    pub keep: Vec<Arc<DevMem>>,
    /// `(first op, name)` of each labelled region ([`ds4_engine::backend::Backend::region`]).
    pub regions: Vec<(usize, &'static str)>,
    /// When the step began (its first op is recorded after it).
    pub started: Instant,
    /// Ops (from the first) already launched as segments of a captured step
    /// ([`crate::graph`]), and how many segments.
    pub launched: usize,
    pub segs: usize,
    /// The captured steps whose first `segs` segments are the ones launched (at first,
    /// every one of this step buffer), valid while the graph cache's generation is `generation`.
    pub cands: Vec<usize>,
    pub generation: u64,
    /// The op count at which the recording next checks for a segment to launch
    /// (`usize::MAX`: it does not).
    pub next_cut: usize,
    /// Whether the device time of this step is being measured (its first segment
    /// launched after the timing's start event).
    pub timed: bool,
    /// The first error of a segment's launch, reported when the step is flushed.
    pub error: Option<crate::error::CudaError>,
}

impl Recording {
    /// An empty recording of a step of `n_tok` tokens whose inputs are at `step_ptr`,
    /// following the captured steps `cands` (cache generation `generation`) from `next_cut` on.
    pub fn new(
        n_tok: usize,
        step_ptr: DPtr,
        cands: Vec<usize>,
        generation: u64,
        next_cut: usize,
    ) -> Self {
        Recording {
            n_tok,
            step_ptr,
            ops: Vec::new(),
            keep: Vec::new(),
            regions: Vec::new(),
            started: Instant::now(),
            launched: 0,
            segs: 0,
            cands,
            generation,
            next_cut,
            timed: false,
            error: None,
        }
    }

    /// The region op `i` belongs to (`""` before the first label).
    pub fn region_of(&self, i: usize) -> &'static str {
        match self.regions.partition_point(|&(first, _)| first <= i) {
            0 => "",
            k => self.regions[k - 1].1,
        }
    }

    pub fn push(&mut self, op: Op, keep: &[&Arc<DevMem>]) {
        self.ops.push(op);
        self.keep.extend(keep.iter().map(|m| (*m).clone()));
    }
}

/// The device-side step header (`StepInfo` in `kernels/common.cuh`), followed by the
/// token ids.
pub fn step_bytes(tokens: &[u32], pos0: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + 4 * tokens.len());
    b.extend_from_slice(&(pos0 as i32).to_le_bytes());
    b.extend_from_slice(&(tokens.len() as i32).to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    for t in tokens {
        b.extend_from_slice(&t.to_le_bytes());
    }
    b
}

/// `ExpertGemv` of kernels/gemv.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq)]
pub struct ExpertGemv {
    pub w: [DPtr; 4],
    pub w2: [DPtr; 4],
    pub estride: [i64; 4],
    pub estride2: [i64; 4],
    pub ty: i32,
    pub ty2: i32,
    pub x: DPtr,
    pub x_tstride: i32,
    /// Padding, zero (see the module docs).
    pub pad: i32,
    pub ids: DPtr,
    pub k: i32,
    pub n_in: i32,
    pub rows: i32,
    pub need: i32,
    pub rb: i32,
    pub lim: f32,
    pub out: DPtr,
}

/// `RouteParams` of kernels/moe.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq, Default)]
pub struct RouteParams {
    pub logits: DPtr,
    pub bias: DPtr,
    pub hash: DPtr,
    pub step: DPtr,
    pub ids: DPtr,
    pub weights: DPtr,
    pub rows: i32,
    pub n_expert: i32,
    pub k: i32,
    pub scoring: i32,
    pub n_group: i32,
    pub topk_group: i32,
    pub norm: i32,
    pub rb: i32,
    pub vocab: i32,
    pub scale: f32,
}

/// `PickParams` of kernels/pick.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq, Default)]
pub struct PickParams {
    pub logits: DPtr,
    pub step: DPtr,
    /// The thread's ring of choices in host-mapped memory.
    pub ring: DPtr,
    pub partials: DPtr,
    pub counter: DPtr,
    pub n: i32,
    pub ring_len: i32,
}

/// `ReduceTail` of kernels/gemv.cu.
#[repr(C)]
#[derive(bytemuck::Pod, bytemuck::Zeroable, Debug, Clone, Copy, PartialEq)]
pub struct ReduceTail {
    pub w: DPtr,
    pub out: DPtr,
    pub add: DPtr,
    pub counters: DPtr,
    pub rb: i32,
    /// Round each weighted expert output (bf16 routing weights).
    pub wrb: i32,
}
