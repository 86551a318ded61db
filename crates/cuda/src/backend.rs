//! [`CudaBackend`]: the engine's [`Backend`] on one CUDA device.
//!
//! Operations are recorded per calling thread ([`crate::ops`]) and enqueued when the
//! step's results are needed: `read` (the logits), the next `step`, a KV snapshot.
//! One-token steps are lowered once, captured as a short chain of CUDA graphs and
//! replayed for each following token, each graph launched as soon as its ops have been
//! recorded again ([`crate::graph`]); multi-token steps run their lowered kernels
//! directly, with cuBLAS for the matrix products. Nothing synchronizes with the host
//! inside a step; `read` waits for the copy of the requested values only.
//!
//! Every operation returns errors (a failed allocation names the memory it needed and
//! the memory free); operations or arithmetics this backend does not implement are
//! reported by [`Backend::lacks`] at load time and as [`EngineError::Unsupported`] if
//! called.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;
use std::time::Instant;

use std::ops::Range;

use ds4_engine::backend::{
    AttnShape, Backend, Buffers, CompressShape, DeltaForm, DeltaIn, DeltaJournal, DeltaReplay,
    DeltaShape, DeltaState, DeltaWeights, Experts, HcShape, HcWeights, MlaShape, Prec, Rope,
    Routing, SelectShape, SinkAttnShape,
};
use ds4_engine::{EngineError, Result as EngineResult};
use ds4_gguf::{GgufFile, TensorInfo};

use crate::driver::{Args, DPtr, DevMem, Event, Gpu};
use crate::error::{CudaError, Result};
use crate::gemm::Blas;
use crate::graph::{GraphCache, segment_ranges};
use crate::kernels::Kernels;
use crate::lower::{AttnScratch, Cmd, Ctx, Launch, lower_traced};
use crate::ops::{MatRef, Op, Recording, RopeArgs, step_bytes};
use crate::pick::CudaPick;
use crate::weights::{CudaWeight, Source, load};

/// An f32 activation buffer on the device.
pub struct CudaBuf {
    pub(crate) mem: Arc<DevMem>,
    pub(crate) len: usize,
}

impl CudaBuf {
    pub(crate) fn ptr(&self) -> DPtr {
        self.mem.ptr()
    }
}

/// One sequence's KV cache: per layer, `n_ctx × kv_dim` f16 values for K and for V.
pub struct CudaKv {
    k: Arc<DevMem>,
    v: Arc<DevMem>,
    n_ctx: usize,
    kv_dim: usize,
    n_layer: usize,
}

impl CudaKv {
    fn layer_bytes(&self) -> usize {
        self.n_ctx * self.kv_dim * 2
    }
}

/// One step's inputs: they live in the device's step buffer; this records how many.
pub struct CudaStep {
    pub(crate) n_tok: usize,
    /// Position of the step's first token.
    pub(crate) pos0: usize,
}

/// Counters of what the backend ran, for `bench`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Decode steps served by replaying a captured graph.
    pub graph_replays: u64,
    /// Graphs captured.
    pub graph_captures: u64,
    /// Steps run without a graph (prefill, or graphs disabled).
    pub eager_steps: u64,
    /// Kernel launches in the most recently used decode graph (or eager one-token step).
    pub decode_kernels: usize,
    /// Kernel launches of eager steps in total.
    pub eager_launches: u64,
    /// cuBLAS GEMMs run.
    pub gemms: u64,
    /// Device time of timed graph replays (ms) and how many were timed.
    pub graph_gpu_ms: f64,
    pub graph_timed: u64,
    /// Host time of the graph-replayed decode steps (ms, summed over `graph_replays`):
    /// from the step's start to its last op recorded (the model's code), finding and
    /// launching its graph, and reading its result back or its greedy choice (waiting for
    /// the device).
    pub host_record_ms: f64,
    pub host_launch_ms: f64,
    pub host_read_ms: f64,
}

/// One line of a kernel profile (see [`CudaBackend::set_profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileRow {
    /// The model part ([`ds4_engine::backend::Backend::region`]; `""` when unlabelled).
    pub region: &'static str,
    pub label: &'static str,
    pub launches: u64,
    /// Device time in ms, from events around each launch.
    pub ms: f64,
    /// Weight bytes read (GEMV launches).
    pub bytes: u64,
}

/// A profile's time in one model part.
#[derive(Debug, Clone, PartialEq)]
pub struct PartTime {
    /// The part ([`ProfileRow::region`]; `"(unlabelled)"` for operations outside any).
    pub region: &'static str,
    /// Device time in ms and kernel launches, summed over the part's rows.
    pub ms: f64,
    pub launches: u64,
}

/// `rows` summed per model part, the most expensive part first.
pub fn by_part(rows: &[ProfileRow]) -> Vec<PartTime> {
    let mut parts: Vec<PartTime> = Vec::new();
    for r in rows {
        let region = if r.region.is_empty() {
            "(unlabelled)"
        } else {
            r.region
        };
        match parts.iter_mut().find(|p| p.region == region) {
            Some(p) => {
                p.ms += r.ms;
                p.launches += r.launches;
            }
            None => parts.push(PartTime {
                region,
                ms: r.ms,
                launches: r.launches,
            }),
        }
    }
    parts.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    parts
}

pub(crate) struct State {
    recs: HashMap<ThreadId, Recording>,
    step_bufs: HashMap<ThreadId, DevMem>,
    pub(crate) graphs: GraphCache,
    blas: Option<Blas>,
    gemm_w: Option<DevMem>,
    gemm_x: Option<DevMem>,
    staging: Option<DevMem>,
    _attn_mem: [DevMem; 4],
    attn: AttnScratch,
    pub(crate) stats: Stats,
    /// Host copy target of `read` (page-locked).
    pinned: Option<Pinned>,
    /// Events around the last graph launch, read after the next synchronization.
    graph_events: Option<(Event, Event, bool)>,
    profile: Vec<ProfileRow>,
    profile_events: Vec<Event>,
    /// Labels of the launches that decode graphs captured from now on leave out
    /// ([`CudaBackend::set_without`]; empty in normal use).
    without: Vec<String>,
    /// Whether the last flush replayed a graph (the next `read` or pick counts as its
    /// wait).
    pub(crate) replayed: bool,
    /// Scratch memory of multi-launch operations, by purpose (`crate::moe_ops`).
    pub(crate) scratch: HashMap<&'static str, Arc<DevMem>>,
    /// RoPE inverse-frequency tables on the device, by their f32 bits.
    rope_tables: HashMap<Vec<u32>, Arc<DevMem>>,
    /// Each stepping thread's ring of greedy choices (host memory the device writes,
    /// `crate::pick`).
    pub(crate) pick_rings: HashMap<ThreadId, (Pinned, DPtr)>,
    /// Events of greedy choices, for reuse.
    pub(crate) pick_events: Vec<Event>,
}

/// Page-locked host memory.
pub(crate) struct Pinned {
    pub(crate) ptr: *mut u8,
    bytes: usize,
}

impl Pinned {
    /// `bytes` of page-locked memory (`flags`: `cuMemHostAlloc`'s, such as
    /// `CU_MEMHOSTALLOC_DEVICEMAP` for memory the device reads and writes).
    pub(crate) fn alloc(bytes: usize, flags: u32) -> Result<Pinned> {
        // SAFETY: a plain page-locked allocation, freed by `Pinned::drop`.
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes, flags) }
            .map_err(|e| CudaError::driver("cuMemHostAlloc", e))?;
        Ok(Pinned {
            ptr: ptr as *mut u8,
            bytes,
        })
    }
}

// SAFETY: plain host memory: `read`'s buffer is used under the state lock; a ring of
// greedy choices is read only after the event of the step that wrote the slot.
unsafe impl Send for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `Pinned::alloc`.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// The CUDA backend on one device.
pub struct CudaBackend {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) k: Kernels,
    state: Mutex<State>,
    synthetic: Option<u64>,
    graphs: AtomicBool,
    pdl: AtomicBool,
    fused_attention: AtomicBool,
    fuse_decode: AtomicBool,
    profile: AtomicBool,
    prefetch: AtomicU32,
    pub(crate) gemv_typed: AtomicBool,
}

pub(crate) fn engine_err(e: CudaError) -> EngineError {
    EngineError::Config(format!("CUDA backend: {e}"))
}

/// Rows a GEMV warp prefetches into L2 ahead of the one it computes.
const DEFAULT_PREFETCH: u32 = 0;

/// Heads × splits and floats of the decode-attention scratch, and its KV-head counters.
const ATTN_MS: usize = 1 << 16;
const ATTN_O: usize = 1 << 22;
const ATTN_CNT: usize = 1024;

fn env_flag(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) => !matches!(v.as_str(), "0" | "false" | "off" | "no"),
        Err(_) => default,
    }
}

impl CudaBackend {
    /// Opens device `ordinal`, compiling (or loading cached) kernels.
    ///
    /// `DS4_CUDA_GRAPHS=0` disables graph capture and `DS4_CUDA_PDL=0` programmatic
    /// dependent launch (both on by default); `DS4_CUDA_FUSED_ATTN=1` turns on the
    /// one-launch decode attention, for comparisons (docs/benchmarks.md has the
    /// measurements: the defaults are the fastest measured); `DS4_CUDA_FUSE=0` turns off
    /// the decode fusions across operations (for bisecting, see [`crate::lower::Ctx`]); `DS4_CUDA_PREFETCH=N` sets
    /// the GEMV's L2 prefetch distance in rows (default 0: only each warp's first row);
    /// `DS4_CUDA_GEMV_TYPED=0` runs every GEMV launch on the generic kernel (default:
    /// single-type launches of short rows on the typed kernels).
    pub fn new(ordinal: usize) -> Result<CudaBackend> {
        let gpu = Gpu::new(ordinal)?;
        let k = Kernels::load(&gpu)?;
        let pm = gpu.alloc(ATTN_MS * 4)?;
        let pl = gpu.alloc(ATTN_MS * 4)?;
        let po = gpu.alloc(ATTN_O * 4)?;
        // Zeroed by `alloc`; the fused attention leaves every counter at zero.
        let cnt = gpu.alloc(ATTN_CNT * 4)?;
        let attn = AttnScratch {
            pm: pm.ptr(),
            pl: pl.ptr(),
            po: po.ptr(),
            cnt: cnt.ptr(),
            cap_ms: ATTN_MS,
            cap_o: ATTN_O,
            cap_cnt: ATTN_CNT,
        };
        tracing::info!(device = %gpu.name, arch = %gpu.arch(), sms = gpu.n_sm, "CUDA backend ready");
        Ok(CudaBackend {
            k,
            state: Mutex::new(State {
                recs: HashMap::new(),
                step_bufs: HashMap::new(),
                graphs: GraphCache::default(),
                blas: None,
                gemm_w: None,
                gemm_x: None,
                staging: None,
                _attn_mem: [pm, pl, po, cnt],
                attn,
                stats: Stats::default(),
                replayed: false,
                pinned: None,
                graph_events: None,
                profile: Vec::new(),
                profile_events: Vec::new(),
                without: Vec::new(),
                scratch: HashMap::new(),
                rope_tables: HashMap::new(),
                pick_rings: HashMap::new(),
                pick_events: Vec::new(),
            }),
            gpu,
            synthetic: None,
            graphs: AtomicBool::new(env_flag("DS4_CUDA_GRAPHS", true)),
            pdl: AtomicBool::new(env_flag("DS4_CUDA_PDL", true)),
            fused_attention: AtomicBool::new(env_flag("DS4_CUDA_FUSED_ATTN", false)),
            fuse_decode: AtomicBool::new(env_flag("DS4_CUDA_FUSE", true)),
            profile: AtomicBool::new(false),
            prefetch: AtomicU32::new(
                std::env::var("DS4_CUDA_PREFETCH")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(DEFAULT_PREFETCH),
            ),
            gemv_typed: AtomicBool::new(env_flag("DS4_CUDA_GEMV_TYPED", true)),
        })
    }

    /// Like [`CudaBackend::new`], but the large tensors the model loads (those not
    /// [`crate::synth::on_host`]) are generated on the device from `seed` and the
    /// tensor's name (see [`crate::synth::generate`]) instead of read from the file: the
    /// file needs only the host-generated ones ([`crate::synth::header_file`]).
    pub fn synthetic(ordinal: usize, seed: u64) -> Result<CudaBackend> {
        Ok(CudaBackend {
            synthetic: Some(seed),
            ..CudaBackend::new(ordinal)?
        })
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The kernels (for benchmarks).
    pub fn kernels(&self) -> &Kernels {
        &self.k
    }

    /// Counters since the backend was created.
    pub fn stats(&self) -> Stats {
        self.lock().stats
    }

    /// Turns graph capture of one-token steps on or off.
    pub fn set_graphs(&self, on: bool) {
        self.graphs.store(on, Ordering::Relaxed);
        self.lock().graphs.clear();
    }

    /// Whether decode steps are captured and replayed as graphs.
    pub fn graphs(&self) -> bool {
        self.graphs.load(Ordering::Relaxed)
    }

    /// Sets how many rows ahead each GEMV warp prefetches into L2 (0: only its first).
    pub fn set_prefetch(&self, rows: u32) {
        self.prefetch.store(rows, Ordering::Relaxed);
        self.lock().graphs.clear();
    }

    /// Runs single-type GEMV launches of short rows on the typed kernels (on) or every
    /// launch on the generic kernel (off).
    pub fn set_gemv_typed(&self, on: bool) {
        self.gemv_typed.store(on, Ordering::Relaxed);
        self.lock().graphs.clear();
    }

    /// Turns the one-launch decode attention (RoPE, KV store, split-K, merge) on or off
    /// (off: three launches).
    pub fn set_fused_attention(&self, on: bool) {
        self.fused_attention.store(on, Ordering::Relaxed);
        self.lock().graphs.clear();
    }

    /// Turns programmatic dependent launch on or off.
    pub fn set_pdl(&self, on: bool) {
        self.pdl.store(on, Ordering::Relaxed);
        self.lock().graphs.clear();
    }

    /// A synthetic quantized matrix (`rows × cols` of `ty`, generated on the device from
    /// `seed` and `name`), for kernel benchmarks.
    pub fn synthetic_matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        ty: ds4_gguf::GgmlType,
        seed: u64,
    ) -> Result<CudaWeight> {
        let info = TensorInfo {
            name: name.into(),
            dims: vec![cols as u64, rows as u64],
            dtype: ty,
            offset: 0,
        };
        let mut st = self.lock();
        load(
            &self.gpu,
            &self.k,
            &mut st.staging,
            Source::Synthetic(seed),
            &info,
        )
    }

    /// Times every kernel of eager steps with events (turn graphs off to profile decode
    /// steps); [`CudaBackend::take_profile`] returns the totals per label.
    pub fn set_profile(&self, on: bool) {
        self.profile.store(on, Ordering::Relaxed);
    }

    /// Leaves the launches with these labels out of the decode graphs captured from now
    /// on, to measure what each kind of launch costs inside a replay (`gpu_check bench
    /// --without LABEL`): while any label is set, the model's results are wrong and only
    /// the time means something. Empty: every launch, as normal.
    pub fn set_without(&self, labels: &[String]) {
        if !labels.is_empty() {
            tracing::warn!(
                ?labels,
                "decode graphs leave these launches out: results are wrong, for timing only"
            );
        }
        let mut st = self.lock();
        st.without = labels.to_vec();
        st.graphs.clear();
    }

    /// The profile collected so far (and resets it).
    pub fn take_profile(&self) -> Vec<ProfileRow> {
        std::mem::take(&mut self.lock().profile)
    }

    /// Waits for all enqueued work.
    pub fn synchronize(&self) -> Result<()> {
        let tid = std::thread::current().id();
        let mut st = self.lock();
        self.flush(&mut st, tid)?;
        self.gpu.sync()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device copy of this thread's current step inputs (0 before any step).
    pub(crate) fn step_ptr(&self) -> DPtr {
        let tid = std::thread::current().id();
        self.lock().step_bufs.get(&tid).map_or(0, |m| m.ptr())
    }

    /// The inverse frequencies of `rope` on the device (uploaded once per table).
    pub(crate) fn rope_table(&self, rope: &Rope) -> EngineResult<Arc<DevMem>> {
        let v = rope.inv_freq();
        let key: Vec<u32> = v.iter().map(|x| x.to_bits()).collect();
        if let Some(m) = self.lock().rope_tables.get(&key) {
            return Ok(m.clone());
        }
        let m = Arc::new(self.alloc(v.len() * 4, "rope frequencies")?);
        self.gpu
            .htod(m.ptr(), crate::weights::as_bytes(&v))
            .map_err(engine_err)?;
        self.lock().rope_tables.insert(key, m.clone());
        Ok(m)
    }

    pub(crate) fn record(&self, op: Op, keep: &[&Arc<DevMem>]) {
        let tid = std::thread::current().id();
        let mut st = self.lock();
        let rec = st
            .recs
            .entry(tid)
            .or_insert_with(|| Recording::new(0, 0, Vec::new(), 0, usize::MAX));
        rec.push(op, keep);
        if rec.ops.len() == rec.next_cut {
            self.segment_ready(&mut st, tid);
        }
    }

    /// At a possible segment boundary of a captured step: when the ops recorded since
    /// the last launched segment are those the next segment of a candidate step was
    /// captured from, launches it and keeps the candidates that agree with it; then sets
    /// where to check next. A step whose ops leave every candidate is finished by the
    /// flush.
    fn segment_ready(&self, st: &mut State, tid: ThreadId) {
        let State {
            recs,
            graphs,
            graph_events,
            step_bufs,
            ..
        } = st;
        let rec = recs.get_mut(&tid).expect("recording");
        let n = rec.ops.len();
        // A second thread began stepping on this backend (see `step`): no more segments.
        if rec.generation != graphs.generation() || step_bufs.len() > 1 {
            rec.cands.clear();
            rec.next_cut = usize::MAX;
            return;
        }
        let s = rec.segs;
        let ops = &rec.ops[rec.launched..];
        let is = |c: usize| graphs.segment_is(c, s, ops);
        if let Some(c) = rec.cands.iter().copied().find(|&c| is(c)) {
            let cands: Vec<usize> = rec
                .cands
                .iter()
                .copied()
                .filter(|&d| d == c || is(d))
                .collect();
            let launched = (|| {
                self.gpu.bind()?;
                if s == 0 {
                    rec.timed = self.timing_begin(graph_events)?;
                }
                graphs.launch(&self.gpu, c, s)
            })();
            if let Err(e) = launched {
                rec.error.get_or_insert(e);
                rec.next_cut = usize::MAX;
                return;
            }
            rec.cands = cands;
            rec.launched = n;
            rec.segs = s + 1;
        }
        rec.next_cut = graphs
            .next_cut(&rec.cands, rec.segs, rec.launched, n)
            .unwrap_or(usize::MAX);
    }

    /// Enqueues this thread's pending ops.
    fn flush(&self, st: &mut State, tid: ThreadId) -> Result<()> {
        let Some(mut rec) = st.recs.remove(&tid) else {
            return Ok(());
        };
        if let Some(e) = rec.error.take() {
            return Err(e);
        }
        if rec.ops.is_empty() {
            return Ok(());
        }
        let flush_start = Instant::now();
        st.replayed = false;
        self.gpu.bind()?;
        let pdl = self.pdl.load(Ordering::Relaxed);
        if rec.n_tok == 1 && self.graphs.load(Ordering::Relaxed) {
            let replayed = (rec.generation == st.graphs.generation()
                && rec.launched > 0
                && rec.launched == rec.ops.len())
            .then(|| {
                rec.cands
                    .iter()
                    .copied()
                    .find(|&c| st.graphs.segments(c) == rec.segs)
            })
            .flatten();
            // Nothing launched while recording (several threads record on this backend,
            // see `step`): a captured step that matches whole runs at once.
            let whole = if rec.launched == 0 {
                st.graphs.find_whole(&rec.ops, rec.step_ptr)
            } else {
                None
            };
            if let Some(c) = whole {
                rec.timed = self.timing_begin(&mut st.graph_events)?;
                self.launch_segments(st, &mut rec, c, 0)?;
            } else if replayed.is_some() {
                self.timing_end(st, &rec)?;
            }
            if let Some(c) = replayed.or(whole) {
                st.stats.graph_replays += 1;
                st.stats.decode_kernels = st.graphs.get(c).kernels;
                st.stats.host_record_ms += ms_between(rec.started, flush_start);
                st.stats.host_launch_ms += ms_between(flush_start, Instant::now());
                st.replayed = true;
                return Ok(());
            }
            // A step not captured yet (or whose ops left the captured ones after its
            // first `rec.segs` segments): captured now, for the next time.
            let (cmds, origin) = self.lower(st, &rec, 0)?;
            if cmds
                .iter()
                .any(|c| matches!(c, Cmd::Gemm { .. } | Cmd::Sgemm(_)))
            {
                return self.run_rest_eager(st, &rec, pdl);
            }
            let segs = segment_ranges(&origin, rec.ops.len());
            let parts: Vec<&[Op]> = segs.iter().map(|(_, o)| &rec.ops[o.clone()]).collect();
            let launches: Vec<Vec<&Launch>> = segs
                .iter()
                .map(|(c, _)| {
                    cmds[c.clone()]
                        .iter()
                        .filter_map(|c| match c {
                            Cmd::Launch(l) if !st.without.iter().any(|w| w == l.label) => Some(l),
                            _ => None,
                        })
                        .collect()
                })
                .collect();
            let n = launches.iter().map(Vec::len).sum();
            let captured = {
                let gpu = self.gpu.clone();
                st.graphs.capture(&self.gpu, rec.step_ptr, &parts, n, |i| {
                    for l in &launches[i] {
                        l.run(&gpu, pdl)?;
                    }
                    Ok(())
                })
            };
            let c = match captured {
                Ok(c) => c,
                Err(e) if pdl => {
                    // Some drivers refuse programmatic edges in captured graphs.
                    tracing::warn!(
                        "graph capture with programmatic dependent launch failed ({e}); disabling it"
                    );
                    self.pdl.store(false, Ordering::Relaxed);
                    return self.run_rest_eager(st, &rec, false);
                }
                Err(e) => return Err(e),
            };
            st.stats.graph_captures += 1;
            st.stats.decode_kernels = n;
            tracing::debug!(
                kernels = n,
                segments = parts.len(),
                "captured a decode graph"
            );
            // Its segments from the first op not launched yet, when one begins there. Not
            // a replay: neither the capture nor a new graph's first launch is timed.
            rec.timed = false;
            let Some(first) = segs.iter().position(|(_, o)| o.start == rec.launched) else {
                return self.run_rest_eager(st, &rec, pdl);
            };
            return self.launch_segments(st, &mut rec, c, first);
        }
        // (Segments launched while graphs were on are not run again.)
        self.run_rest_eager(st, &rec, pdl)
        // `rec.keep` drops here, after its kernels were enqueued.
    }

    /// Launches chain `c`'s segments from `first` on, the rest of `rec`'s step (the end of
    /// its timing when `rec.timed`).
    fn launch_segments(
        &self,
        st: &mut State,
        rec: &mut Recording,
        c: usize,
        first: usize,
    ) -> Result<()> {
        for s in first..st.graphs.segments(c) {
            st.graphs.launch(&self.gpu, c, s)?;
        }
        self.timing_end(st, rec)
    }

    /// Runs the recording's ops not launched yet without a graph.
    fn run_rest_eager(&self, st: &mut State, rec: &Recording, pdl: bool) -> Result<()> {
        let (cmds, origin) = self.lower(st, rec, rec.launched)?;
        let regions: Vec<_> = origin.iter().map(|&i| rec.region_of(i)).collect();
        self.run_eager(st, cmds, &regions, pdl, rec.n_tok)
    }

    /// The commands of the recording's ops from `from` on, with the op each comes from.
    fn lower(&self, st: &State, rec: &Recording, from: usize) -> Result<(Vec<Cmd>, Vec<usize>)> {
        let occ = |f, threads: u32, smem: u32| self.gpu.occupancy(f, threads, smem);
        let cx = Ctx {
            k: &self.k,
            n_sm: self.gpu.n_sm,
            gemv_occupancy: &occ,
            gemv_prefetch: self.prefetch.load(Ordering::Relaxed),
            fused_attention: self.fused_attention.load(Ordering::Relaxed),
            fuse_decode: self.fuse_decode.load(Ordering::Relaxed),
            gemv_typed: self.gemv_typed.load(Ordering::Relaxed),
            step: rec.step_ptr,
            n_tok: rec.n_tok,
            attn: st.attn,
        };
        let (cmds, origin) = lower_traced(&rec.ops[from..], &cx)?;
        Ok((cmds, origin.into_iter().map(|i| i + from).collect()))
    }

    /// Starts timing a graph-replayed step (its start event before its first segment),
    /// unless the previous timing has not been read yet; whether it did.
    fn timing_begin(&self, events: &mut Option<(Event, Event, bool)>) -> Result<bool> {
        if events.is_none() {
            *events = Some((self.gpu.event()?, self.gpu.event()?, false));
        }
        let (a, _, pending) = events.as_mut().expect("created");
        if *pending {
            return Ok(false);
        }
        a.record()?;
        Ok(true)
    }

    /// Ends the timing of a step begun by [`Self::timing_begin`] (after its last segment).
    fn timing_end(&self, st: &mut State, rec: &Recording) -> Result<()> {
        if let Some((_, b, pending)) = st.graph_events.as_mut()
            && rec.timed
        {
            b.record()?;
            *pending = true;
        }
        Ok(())
    }

    /// Accounts the last timed graph launch once the device has run it (a step queued
    /// behind the one the host waited for stays pending).
    pub(crate) fn read_graph_timing(st: &mut State) {
        if let Some((a, b, pending)) = st.graph_events.as_mut()
            && *pending
            && b.done().unwrap_or(true)
        {
            if let Ok(ms) = a.elapsed_ms(b) {
                st.stats.graph_gpu_ms += ms as f64;
                st.stats.graph_timed += 1;
            }
            *pending = false;
        }
    }

    fn run_eager(
        &self,
        st: &mut State,
        cmds: Vec<Cmd>,
        regions: &[&'static str],
        pdl: bool,
        n_tok: usize,
    ) -> Result<()> {
        let profile = self.profile.load(Ordering::Relaxed);
        let n_launch = cmds.len();
        if profile {
            while st.profile_events.len() < 2 * n_launch {
                st.profile_events.push(self.gpu.event()?);
            }
        }
        let mut launches = 0;
        let mut timed = Vec::new();
        for (c, &region) in cmds.iter().zip(regions) {
            if profile {
                st.profile_events[2 * timed.len()].record()?;
            }
            let (label, bytes) = match c {
                Cmd::Launch(l) => {
                    l.run(&self.gpu, pdl && !profile)?;
                    launches += 1;
                    (l.label, l.bytes)
                }
                Cmd::Gemm { w, x, rows, out } => {
                    self.gemm(st, w, *x, *rows as usize, *out, pdl && !profile)?;
                    launches += 3;
                    ("quantized_gemm", 0)
                }
                Cmd::Sgemm(g) => {
                    if st.blas.is_none() {
                        st.blas = Some(Blas::new(&self.gpu)?);
                    }
                    st.blas.as_ref().expect("created").sgemm(g)?;
                    st.stats.gemms += 1;
                    launches += 1;
                    ("cublas_sgemm", 0)
                }
            };
            if profile {
                st.profile_events[2 * timed.len() + 1].record()?;
                timed.push((region, label, bytes));
            }
        }
        if profile {
            for (k, (region, label, bytes)) in timed.into_iter().enumerate() {
                let ms = st.profile_events[2 * k].elapsed_ms(&st.profile_events[2 * k + 1])? as f64;
                match st
                    .profile
                    .iter_mut()
                    .find(|r| r.label == label && r.region == region)
                {
                    Some(r) => {
                        r.launches += 1;
                        r.ms += ms;
                        r.bytes += bytes;
                    }
                    None => st.profile.push(ProfileRow {
                        region,
                        label,
                        launches: 1,
                        ms,
                        bytes,
                    }),
                }
            }
        }
        st.stats.eager_steps += 1;
        st.stats.eager_launches += launches;
        if n_tok == 1 {
            st.stats.decode_kernels = launches as usize;
        }
        Ok(())
    }

    /// `out = x · wᵀ` (rows × w.rows): dequantize w to bf16, convert x, cuBLAS.
    fn gemm(
        &self,
        st: &mut State,
        w: &MatRef,
        x: DPtr,
        rows: usize,
        out: DPtr,
        pdl: bool,
    ) -> Result<()> {
        let (n_out, n_in) = (w.rows as usize, w.cols as usize);
        if st.blas.is_none() {
            st.blas = Some(Blas::new(&self.gpu)?);
        }
        let need_w = n_out * n_in * 2;
        if st.gemm_w.as_ref().is_none_or(|m| m.bytes() < need_w) {
            st.gemm_w = None;
            st.gemm_w = Some(self.gpu.alloc(need_w)?);
        }
        let need_x = rows * n_in * 2;
        if st.gemm_x.as_ref().is_none_or(|m| m.bytes() < need_x) {
            st.gemm_x = None;
            st.gemm_x = Some(self.gpu.alloc(need_x.max(1 << 20))?);
        }
        let (wb, xb) = (
            st.gemm_w.as_ref().expect("allocated").ptr(),
            st.gemm_x.as_ref().expect("allocated").ptr(),
        );
        let chunks = (n_out * n_in / 32) as u64;
        let mut a = Args::new();
        a.push(w.planes)
            .push(w.ty as i32)
            .push(n_out as i64)
            .push(n_in as i32)
            .push(wb);
        let grid = (
            chunks.div_ceil(256).min(self.gpu.n_sm as u64 * 16) as u32,
            1,
            1,
        );
        self.gpu
            .launch(self.k.dequant_bf16, grid, 256, 0, &a, pdl)?;
        let n = (rows * n_in) as u64;
        let mut a = Args::new();
        a.push(x).push(xb).push(n as i64);
        let grid = (n.div_ceil(256).min(self.gpu.n_sm as u64 * 16) as u32, 1, 1);
        self.gpu.launch(self.k.f32_to_bf16, grid, 256, 0, &a, pdl)?;
        st.blas
            .as_ref()
            .expect("created")
            .gemm_bf16(wb, xb, out, n_out, n_in, rows)?;
        st.stats.gemms += 1;
        Ok(())
    }

    pub(crate) fn buf_of(&self, b: &CudaBuf, len: usize, what: &str) -> EngineResult<DPtr> {
        if len > b.len {
            return Err(EngineError::Backend(format!(
                "{what}: {len} values requested from a buffer of {}",
                b.len
            )));
        }
        Ok(b.ptr())
    }

    /// Device memory of `bytes`, or an out-of-memory error naming `what` and the free
    /// memory.
    pub(crate) fn alloc(&self, bytes: usize, what: &str) -> EngineResult<DevMem> {
        self.gpu
            .alloc(bytes)
            .map_err(|e| match self.gpu.mem_info() {
                Ok((free, _)) if bytes > free => EngineError::OutOfMemory {
                    what: what.to_string(),
                    needed: bytes as u64,
                    available: Some(free as u64),
                },
                _ => engine_err(e),
            })
    }

    /// Begins recording a step of `n_tok` tokens at `pos0`: `tokens` copied into this
    /// thread's step inputs, or (`None`) the one token a `greedy_pick` left there.
    pub(crate) fn begin_step(
        &self,
        tokens: Option<&[u32]>,
        n_tok: usize,
        pos0: usize,
    ) -> EngineResult<CudaStep> {
        let tid = std::thread::current().id();
        let mut st = self.lock();
        self.flush(&mut st, tid).map_err(engine_err)?;
        let ptr = match tokens {
            Some(tokens) => {
                let bytes = step_bytes(tokens, pos0);
                let need = bytes.len().next_multiple_of(4096);
                if st
                    .step_bufs
                    .get(&tid)
                    .is_none_or(|m| m.bytes() < bytes.len())
                {
                    let m = self.alloc(need, "the step inputs")?;
                    st.step_bufs.insert(tid, m);
                }
                let ptr = st.step_bufs[&tid].ptr();
                self.gpu.htod(ptr, &bytes).map_err(engine_err)?;
                ptr
            }
            None => st.step_bufs.get(&tid).map(DevMem::ptr).ok_or_else(|| {
                EngineError::Backend("a picked token's step on a thread without steps".into())
            })?,
        };
        // Segments are launched while a step is recorded only while one thread steps on
        // this backend (the server's engine thread, the CLI): another thread's step could
        // otherwise land between two segments of this one on the shared stream and reuse
        // its scratch memory. Once a second thread steps, each step runs whole at its
        // flush (one step of the first thread may still be split around the second's
        // first step).
        let cands = if n_tok == 1 && self.graphs.load(Ordering::Relaxed) && st.step_bufs.len() == 1
        {
            st.graphs.chains_of(ptr)
        } else {
            Vec::new()
        };
        let next_cut = st.graphs.next_cut(&cands, 0, 0, 0).unwrap_or(usize::MAX);
        let generation = st.graphs.generation();
        st.recs
            .insert(tid, Recording::new(n_tok, ptr, cands, generation, next_cut));
        Ok(CudaStep { n_tok, pos0 })
    }

    pub(crate) fn flush_this_thread(&self) -> EngineResult<()> {
        let tid = std::thread::current().id();
        let mut st = self.lock();
        self.flush(&mut st, tid).map_err(engine_err)
    }
}

/// The operations this backend implements (in ggml's arithmetic), by their trait names.
const IMPLEMENTED: &[&str] = &[
    "embed",
    "rms_norm",
    "matmul",
    "rope",
    "attention",
    "swiglu",
    "add",
    "copy",
    "fill",
    "read",
    "write",
    "read_ids",
    "write_ids",
    "store_rows",
];

/// The operations implemented in the references' arithmetic (`Prec::F32`/`Bf16`).
const IMPLEMENTED_REFERENCE: &[&str] = &[
    "embed",
    "rms_norm",
    "rms_norm_cast_once",
    "layer_norm",
    "matmul",
    "matmul_grouped",
    "rope",
    "swiglu",
    "add",
    "copy",
    "fill",
    "read",
    "write",
    "read_ids",
    "write_ids",
    "store_rows",
    "scale_sigmoid",
    "moe_route",
    "moe_experts",
    "hc_pre",
    "hc_post",
    "hc_head",
    "delta_net",
    "delta_replay",
    "gated_norm",
    "compress",
    "dsa_select",
    "mla_attention",
    "sink_attention",
];

fn unsupported(what: &str) -> EngineError {
    EngineError::Unsupported {
        backend: "cuda",
        what: format!("the operation `{what}`"),
    }
}

impl Buffers for CudaBackend {
    type Buf = CudaBuf;
    type Ids = CudaBuf;
}

impl Backend for CudaBackend {
    type Weight = CudaWeight;
    type Kv = CudaKv;
    type Step = CudaStep;
    type Pick = CudaPick;

    fn name(&self) -> &'static str {
        "cuda"
    }

    /// Long prompts in pieces of 4096 tokens: multi-token products convert their weights
    /// per call (bf16 for cuBLAS, the experts' tiles), so larger calls amortize it.
    fn prefill_chunk(&self) -> usize {
        4096
    }

    fn region(&self, name: &'static str) {
        let tid = std::thread::current().id();
        let mut st = self.lock();
        if let Some(rec) = st.recs.get_mut(&tid) {
            let at = rec.ops.len();
            rec.regions.push((at, name));
        }
    }

    fn memory_available(&self) -> Option<u64> {
        self.gpu.mem_info().ok().map(|(free, _)| free as u64)
    }

    fn lacks(&self, ops: &[&'static str], p: Prec) -> Vec<&'static str> {
        let have = if p == Prec::Ggml {
            IMPLEMENTED
        } else {
            IMPLEMENTED_REFERENCE
        };
        ops.iter().copied().filter(|o| !have.contains(o)).collect()
    }

    fn weight(&self, file: &Arc<GgufFile>, info: &TensorInfo) -> EngineResult<CudaWeight> {
        // A synthetic model's small and f32 tensors lie in its header file; the device
        // generates the rest.
        let src = match self.synthetic {
            Some(seed) if !crate::synth::on_host(info.dtype, info.n_elements()) => {
                Source::Synthetic(seed)
            }
            _ => Source::File(file),
        };
        let mut st = self.lock();
        load(&self.gpu, &self.k, &mut st.staging, src, info).map_err(|e| match e {
            CudaError::Unsupported(_) => EngineError::UnsupportedTensorType {
                name: info.name.clone(),
                ty: info.dtype,
            },
            e => engine_err(e),
        })
    }

    fn weight_f32(&self, name: &str, dims: &[usize], values: &[f32]) -> EngineResult<CudaWeight> {
        crate::weights::from_values(&self.gpu, dims, values)
            .map_err(|e| EngineError::Backend(format!("weight '{name}': {e}")))
    }

    fn buf(&self, len: usize) -> EngineResult<CudaBuf> {
        let mem = self.alloc(len * 4, "an activation buffer")?;
        Ok(CudaBuf {
            mem: Arc::new(mem),
            len,
        })
    }

    fn ids(&self, len: usize) -> EngineResult<CudaBuf> {
        self.buf(len)
    }

    fn kv(&self, n_layer: usize, n_ctx: usize, kv_dim: usize) -> EngineResult<CudaKv> {
        let bytes = n_layer * n_ctx * kv_dim * 2;
        let k = self.alloc(bytes, "the K cache")?;
        let v = self.alloc(bytes, "the V cache")?;
        Ok(CudaKv {
            k: Arc::new(k),
            v: Arc::new(v),
            n_ctx,
            kv_dim,
            n_layer,
        })
    }

    fn kv_snapshot(&self, kv: &CudaKv, len: usize) -> EngineResult<CudaKv> {
        self.flush_this_thread()?;
        let out = self.kv(kv.n_layer, kv.n_ctx, kv.kv_dim)?;
        let (lb, used) = (
            kv.layer_bytes() as u64,
            (len * kv.kv_dim * 2).min(kv.layer_bytes()),
        );
        for l in 0..kv.n_layer as u64 {
            self.gpu
                .dtod(out.k.ptr() + l * lb, kv.k.ptr() + l * lb, used)
                .map_err(engine_err)?;
            self.gpu
                .dtod(out.v.ptr() + l * lb, kv.v.ptr() + l * lb, used)
                .map_err(engine_err)?;
        }
        Ok(out)
    }

    fn step(&self, tokens: &[u32], pos0: usize) -> EngineResult<CudaStep> {
        self.begin_step(Some(tokens), tokens.len(), pos0)
    }

    fn step_picked(&self, last: &CudaPick, pos0: usize) -> EngineResult<CudaStep> {
        self.step_picked_op(last, pos0)
    }

    fn pick(&self, step: &CudaStep, logits: &CudaBuf, n: usize) -> EngineResult<CudaPick> {
        self.pick_op(step, logits, n)
    }

    fn take_pick(&self, pick: CudaPick) -> EngineResult<u32> {
        self.take_pick_op(pick)
    }

    fn embed(
        &self,
        step: &CudaStep,
        table: &CudaWeight,
        streams: usize,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        if streams != 1 || p != Prec::Ggml {
            return self.embed_op(step, table, streams, p, out);
        }
        let (tm, m) = table.mat().map_err(engine_err)?;
        let o = self.buf_of(out, step.n_tok * m.cols as usize, "embed")?;
        self.record(Op::Embed { table: m, out: o }, &[tm, &out.mem]);
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CudaBuf,
        w: Option<&CudaWeight>,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        // ggml's RMSNorm sums f32 squares, the references f64 ones: within an ulp of the
        // mean, so the f32 policy shares the kernel that fuses into the GEMV prologue.
        let (Some(w), Prec::Ggml | Prec::F32) = (w, p) else {
            return self.rms_norm_ref_op(x, w, rows, cols, eps, p, false, out);
        };
        let Ok((wm, n)) = w.vec() else {
            return self.rms_norm_ref_op(x, Some(w), rows, cols, eps, p, false, out);
        };
        if n != cols {
            return Err(EngineError::Backend(format!(
                "rms_norm: a weight of {n} for rows of {cols}"
            )));
        }
        let xp = self.buf_of(x, rows * n, "rms_norm")?;
        let op = self.buf_of(out, rows * n, "rms_norm")?;
        self.record(
            Op::RmsNorm {
                x: xp,
                w: wm.ptr(),
                n: n as u32,
                rows: rows as u32,
                eps,
                out: op,
            },
            &[&x.mem, wm, &out.mem],
        );
        Ok(())
    }

    fn matmul(
        &self,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        x: &CudaBuf,
        rows: usize,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        if let CudaWeight::Float { .. } = w {
            return self.float_matmul(w, bias, x, rows, 1, p, out);
        }
        if p == Prec::Bf16 && bias.is_none() {
            // One matrix as a stack of one: the per-head GEMV rounds its outputs.
            return self.head_matmul(w, x, rows, 1, p, out);
        }
        if p == Prec::Bf16 {
            return Err(unsupported(
                "products of quantized weights with a bias and bf16 rounding",
            ));
        }
        let (wm, m) = w.mat().map_err(engine_err)?;
        let xp = self.buf_of(x, rows * m.cols as usize, "matmul input")?;
        let op = self.buf_of(out, rows * m.rows as usize, "matmul output")?;
        let b = bias.map(|b| b.vec()).transpose().map_err(engine_err)?;
        let mut keep = vec![wm, &x.mem, &out.mem];
        if let Some((bm, _)) = b {
            keep.push(bm);
        }
        self.record(
            Op::Matmul {
                w: m,
                bias: b.map(|(bm, _)| bm.ptr()),
                x: xp,
                rows: rows as u32,
                out: op,
            },
            &keep,
        );
        Ok(())
    }

    fn rope(
        &self,
        step: &CudaStep,
        rope: &Rope,
        n_head: usize,
        head_dim: usize,
        p: Prec,
        x: &mut CudaBuf,
    ) -> EngineResult<()> {
        if p != Prec::Ggml {
            return self.rope_torch_op(rope, n_head, head_dim, step.n_tok, p, x);
        }
        if rope.trailing || rope.yarn.is_some() || rope.inverse {
            return Err(unsupported(
                "rope in ggml's arithmetic on trailing dimensions, with YaRN or inverted",
            ));
        }
        let xp = self.buf_of(x, step.n_tok * n_head * head_dim, "rope")?;
        // theta_scale as the CPU backend computes it.
        let theta_scale = rope.freq_base.powf(-2.0 / rope.n_dims as f32);
        let r = RopeArgs {
            n_dims: rope.n_dims as u32,
            neox: rope.neox,
            theta_scale,
        };
        self.record(
            Op::Rope {
                x: xp,
                n_head: n_head as u32,
                head_dim: head_dim as u32,
                rope: r,
            },
            &[&x.mem],
        );
        Ok(())
    }

    fn attention(
        &self,
        step: &CudaStep,
        kv: &mut CudaKv,
        layer: usize,
        shape: &AttnShape,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        let n = step.n_tok;
        if layer >= kv.n_layer {
            return Err(EngineError::Backend(format!("attention: no layer {layer}")));
        }
        let off = (layer * kv.layer_bytes()) as u64;
        let op = Op::Attention {
            k_cache: kv.k.ptr() + off,
            v_cache: kv.v.ptr() + off,
            n_ctx: kv.n_ctx as u32,
            n_head: shape.n_head as u32,
            n_head_kv: shape.n_head_kv as u32,
            head_dim: shape.head_dim as u32,
            q: self.buf_of(q, n * shape.n_head * shape.head_dim, "attention q")?,
            k: self.buf_of(k, n * kv.kv_dim, "attention k")?,
            v: self.buf_of(v, n * kv.kv_dim, "attention v")?,
            out: self.buf_of(out, n * shape.n_head * shape.head_dim, "attention out")?,
        };
        self.record(op, &[&kv.k, &kv.v, &q.mem, &k.mem, &v.mem, &out.mem]);
        Ok(())
    }

    fn swiglu(
        &self,
        gate: &CudaBuf,
        up: &CudaBuf,
        len: usize,
        limit: Option<f32>,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        if p == Prec::Bf16 {
            return self.swiglu_ref_op(gate, up, len, limit, p, out);
        }
        // ggml's SwiGLU has no clamp (the CPU backend's Ggml policy neither).
        let reference = p == Prec::F32;
        let op = Op::Swiglu {
            gate: self.buf_of(gate, len, "swiglu")?,
            up: self.buf_of(up, len, "swiglu")?,
            len: len as u32,
            out: self.buf_of(out, len, "swiglu")?,
            lim: limit.filter(|_| reference).unwrap_or(f32::INFINITY),
            reference,
        };
        self.record(op, &[&gate.mem, &up.mem, &out.mem]);
        Ok(())
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf, len: usize, p: Prec) -> EngineResult<()> {
        if p == Prec::Bf16 {
            return self.add_round_op(x, y, len);
        }
        let op = Op::Add {
            x: self.buf_of(x, len, "add")?,
            y: self.buf_of(y, len, "add")?,
            len: len as u32,
        };
        self.record(op, &[&x.mem, &y.mem]);
        Ok(())
    }

    fn copy(
        &self,
        src: &CudaBuf,
        src_off: usize,
        dst: &mut CudaBuf,
        dst_off: usize,
        len: usize,
    ) -> EngineResult<()> {
        let s = self.buf_of(src, src_off + len, "copy")? + 4 * src_off as u64;
        let d = self.buf_of(dst, dst_off + len, "copy")? + 4 * dst_off as u64;
        self.record(
            Op::Copy {
                src: s,
                dst: d,
                len: len as u32,
            },
            &[&src.mem, &dst.mem],
        );
        Ok(())
    }

    fn read(&self, buf: &CudaBuf, off: usize, len: usize, out: &mut Vec<f32>) -> EngineResult<()> {
        let p = self.buf_of(buf, off + len, "read")? + 4 * off as u64;
        let tid = std::thread::current().id();
        let mut st = self.lock();
        self.flush(&mut st, tid).map_err(engine_err)?;
        let bytes = len * 4;
        if st.pinned.as_ref().is_none_or(|h| h.bytes < bytes) {
            st.pinned = None;
            st.pinned = Some(Pinned::alloc(bytes.max(1 << 20), 0).map_err(engine_err)?);
        }
        let h = st.pinned.as_ref().expect("allocated");
        // SAFETY: the pinned buffer holds at least `bytes` bytes and nothing else uses it
        // while the state lock is held.
        let host = unsafe { std::slice::from_raw_parts_mut(h.ptr, bytes) };
        let read_start = Instant::now();
        self.gpu.dtoh(host, p).map_err(engine_err)?;
        if std::mem::take(&mut st.replayed) {
            st.stats.host_read_ms += ms_between(read_start, Instant::now());
        }
        Self::read_graph_timing(&mut st);
        // SAFETY: the pinned buffer is page-aligned and now holds `len` f32 values.
        let vals = unsafe { std::slice::from_raw_parts(host.as_ptr() as *const f32, len) };
        out.extend_from_slice(vals);
        Ok(())
    }

    fn fill(&self, buf: &mut CudaBuf, off: usize, len: usize, value: f32) -> EngineResult<()> {
        self.fill_op(buf, off, len, value)
    }

    fn write(&self, buf: &mut CudaBuf, off: usize, data: &[f32]) -> EngineResult<()> {
        let p = self.buf_of(buf, off + data.len(), "write")? + 4 * off as u64;
        self.flush_this_thread()?;
        self.gpu
            .htod(p, crate::weights::as_bytes(data))
            .map_err(engine_err)
    }

    fn read_ids(
        &self,
        ids: &CudaBuf,
        off: usize,
        len: usize,
        out: &mut Vec<i32>,
    ) -> EngineResult<()> {
        let mut v = Vec::with_capacity(len);
        self.read(ids, off, len, &mut v)?;
        out.extend(v.iter().map(|x| x.to_bits() as i32));
        Ok(())
    }

    fn write_ids(&self, ids: &mut CudaBuf, off: usize, data: &[i32]) -> EngineResult<()> {
        let bits: Vec<f32> = data.iter().map(|&x| f32::from_bits(x as u32)).collect();
        self.write(ids, off, &bits)
    }

    fn store_rows(
        &self,
        _step: &CudaStep,
        src: &CudaBuf,
        rows: usize,
        row_len: usize,
        dst: &mut CudaBuf,
        cap: usize,
    ) -> EngineResult<()> {
        self.store_rows_op(src, rows, row_len, dst, cap)
    }

    fn rms_norm_cast_once(
        &self,
        x: &CudaBuf,
        w: Option<&CudaWeight>,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        // In f32 with a weight, `w·(x·r)` is `(x·r)·w`: the norm that fuses into the
        // following GEMV's prologue.
        if p == Prec::F32 && w.is_some_and(|w| w.vec().is_ok()) {
            return self.rms_norm(x, w, rows, cols, eps, p, out);
        }
        self.rms_norm_ref_op(x, w, rows, cols, eps, p, true, out)
    }

    fn layer_norm(
        &self,
        x: &CudaBuf,
        w: &CudaWeight,
        b: &CudaWeight,
        rows: usize,
        cols: usize,
        eps: f32,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.layer_norm_op(x, w, b, rows, cols, eps, p, out)
    }

    fn matmul_grouped(
        &self,
        w: &CudaWeight,
        x: &CudaBuf,
        rows: usize,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        match w {
            CudaWeight::Float { n, .. } => self.float_matmul(w, None, x, rows, *n, p, out),
            CudaWeight::Matrix { n, .. } => self.head_matmul(w, x, rows, *n as usize, p, out),
            _ => Err(unsupported("grouped products of vectors")),
        }
    }

    fn scale_sigmoid(
        &self,
        x: &mut CudaBuf,
        gate: &CudaBuf,
        rows: usize,
        cols: usize,
        gate_cols: usize,
        p: Prec,
    ) -> EngineResult<()> {
        self.scale_sigmoid_op(x, gate, rows, cols, gate_cols, p)
    }

    fn moe_route(
        &self,
        _step: &CudaStep,
        logits: &CudaBuf,
        rows: usize,
        bias: Option<&CudaWeight>,
        hash: Option<&CudaWeight>,
        r: &Routing,
        p: Prec,
        ids: &mut CudaBuf,
        weights: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.moe_route_op(logits, rows, bias, hash, r, p, ids, weights)
    }

    fn moe_experts(
        &self,
        x: &CudaBuf,
        rows: usize,
        ids: &CudaBuf,
        weights: &CudaBuf,
        k: usize,
        experts: &Experts<'_, CudaWeight>,
        limit: Option<f32>,
        wp: Prec,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        if wp == Prec::Ggml {
            return Err(unsupported("moe_experts with ggml routing weights"));
        }
        self.moe_experts_op(x, rows, ids, weights, k, experts, limit, wp, p, out)
    }

    fn hc_pre(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: &HcWeights<'_, CudaWeight>,
        shape: &HcShape,
        p: Prec,
        out: &mut CudaBuf,
        mix: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.hc_pre_op(x, rows, w, shape, p, out, mix)
    }

    fn hc_post(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        mix: &CudaBuf,
        rows: usize,
        shape: &HcShape,
        p: Prec,
    ) -> EngineResult<()> {
        self.hc_post_op(x, y, mix, rows, shape, p)
    }

    fn hc_head(
        &self,
        x: &CudaBuf,
        rows: usize,
        w: Option<&HcWeights<'_, CudaWeight>>,
        shape: &HcShape,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.hc_head_op(x, rows, w, shape, p, out)
    }

    fn delta_net(
        &self,
        _step: &CudaStep,
        rows: Range<usize>,
        x: &DeltaIn<'_, Self>,
        w: &DeltaWeights<'_, CudaWeight>,
        state: &mut DeltaState<'_, Self>,
        journal: Option<&mut DeltaJournal<Self>>,
        shape: &DeltaShape,
        form: DeltaForm,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.delta_net_op(rows, x, w, state, journal, shape, form, p, out)
    }

    fn delta_replay(
        &self,
        layers: &mut [DeltaReplay<'_, Self>],
        range: Range<usize>,
        shape: &DeltaShape,
    ) -> EngineResult<()> {
        self.delta_replay_op(layers, range, shape)
    }

    fn gated_norm(
        &self,
        o: &CudaBuf,
        z: &CudaBuf,
        w: &CudaWeight,
        rows: usize,
        shape: &DeltaShape,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.gated_norm_op(o, z, w, rows, shape, p, out)
    }

    fn compress(
        &self,
        step: &CudaStep,
        rows: [&CudaBuf; 2],
        ring: [&mut CudaBuf; 2],
        cap: usize,
        ape: &CudaWeight,
        norm: Option<&CudaWeight>,
        rope: Option<&Rope>,
        shape: &CompressShape,
        p: Prec,
        entries: &mut CudaBuf,
    ) -> EngineResult<()> {
        let [kv, gate] = ring;
        self.compress_op(
            step,
            rows,
            [&*kv, &*gate],
            cap,
            ape,
            norm,
            rope,
            shape,
            p,
            entries,
        )
    }

    fn dsa_select(
        &self,
        _step: &CudaStep,
        q: &CudaBuf,
        w: &CudaBuf,
        entries: &CudaBuf,
        rows: usize,
        shape: &SelectShape,
        ids: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.dsa_select_op(q, w, entries, rows, shape, ids)
    }

    fn mla_attention(
        &self,
        step: &CudaStep,
        q: &CudaBuf,
        latent: &CudaBuf,
        k_b: &CudaWeight,
        v_b: &CudaWeight,
        sel: Option<&CudaBuf>,
        rows: usize,
        shape: &MlaShape,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.mla_op(q, latent, k_b, v_b, sel, rows, shape, p, step.pos0, out)
    }

    fn sink_attention(
        &self,
        step: &CudaStep,
        q: &CudaBuf,
        kv: &CudaBuf,
        window: &CudaBuf,
        cap: usize,
        entries: Option<(&CudaBuf, Option<&CudaBuf>)>,
        sinks: &CudaWeight,
        rows: usize,
        shape: &SinkAttnShape,
        p: Prec,
        out: &mut CudaBuf,
    ) -> EngineResult<()> {
        self.sink_attention_op(
            step, q, kv, window, cap, entries, sinks, rows, shape, p, out,
        )
    }
}

fn ms_between(a: Instant, b: Instant) -> f64 {
    b.duration_since(a).as_secs_f64() * 1e3
}
