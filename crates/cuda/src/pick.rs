//! Greedy choices made on the device (`Backend::pick`, `step_picked`, `take_pick`):
//! pipelined greedy decoding, where the host queues the next step before it has read the
//! token that step evaluates, so the device does not wait for the host between steps.
//!
//! `greedy_pick` (kernels/pick.cu) ends a step: it rewrites the thread's step inputs as
//! the next one-token step, with the argmax of the step's logits as its token (so
//! [`CudaBackend::step_picked_op`] hands that step over without a copy), and stores the
//! token in the thread's ring of choices — page-locked host memory the device writes —
//! at the next step's position modulo [`RING`]. The pick's event, recorded after the
//! step, tells the host when its slot holds the token. The launch's arguments are the
//! same at every step, so a captured decode graph replays with it.

use ds4_engine::Result as EngineResult;

use crate::backend::{CudaBackend, CudaBuf, CudaStep, Pinned, engine_err};
use crate::driver::{DPtr, Event};
use crate::error::CudaError;
use crate::moe_ops::Launch;
use crate::ops::PickParams;

/// Slots of a thread's ring of choices: a choice must be taken before its thread's
/// steps have moved this many positions on (pipelined decoding holds two).
pub(crate) const RING: usize = 16;

/// Blocks of a `greedy_pick` launch: each keys a share of the row, the last one to finish
/// all the blocks' keys.
const PICK_BLOCKS: u32 = 128;
/// Threads of a block (kernels/pick.cu's PICK_THREADS).
const PICK_THREADS: u32 = 256;

/// A greedy choice made on the device, read from its slot once `done` has passed.
pub struct CudaPick {
    slot: *const u32,
    done: Event,
    /// The position of the step whose token it is.
    pos: usize,
    /// The thread whose step inputs hold the token.
    thread: std::thread::ThreadId,
    /// Whether its step was a graph replay (its wait then counts as a replay's).
    replayed: bool,
}

// SAFETY: the slot is host memory the backend holds for as long as it lives; it is read
// only after the event, under no lock the device needs.
unsafe impl Send for CudaPick {}

impl CudaBackend {
    /// `Backend::step_picked`: the step inputs `greedy_pick` left are the next step's.
    /// The caller steps one sequence on this thread between the pick and this step (the
    /// step inputs are the thread's).
    pub(crate) fn step_picked_op(&self, last: &CudaPick, pos0: usize) -> EngineResult<CudaStep> {
        if last.thread != std::thread::current().id() {
            return Err(ds4_engine::EngineError::Backend(
                "a picked token's step on another thread than its choice's".into(),
            ));
        }
        if last.pos != pos0 {
            return Err(ds4_engine::EngineError::Backend(format!(
                "a picked token's step at position {pos0}, but the last choice is for position {}",
                last.pos
            )));
        }
        self.begin_step(None, 1, pos0)
    }

    /// `Backend::pick`: records `greedy_pick`, enqueues the step and an event after it.
    pub(crate) fn pick_op(
        &self,
        step: &CudaStep,
        logits: &CudaBuf,
        n: usize,
    ) -> EngineResult<CudaPick> {
        let (ring_dev, ring_host) = self.pick_ring().map_err(engine_err)?;
        let partials = self.scratch_mem("pick_partials", 8 * PICK_BLOCKS as usize)?;
        let counter = self.scratch_mem("pick_counter", 4)?;
        let p = PickParams {
            logits: self.buf_of(logits, n, "pick")?,
            step: self.step_ptr(),
            ring: ring_dev,
            partials: partials.ptr(),
            counter: counter.ptr(),
            n: n as i32,
            ring_len: RING as i32,
        };
        self.launch_op(Launch {
            f: self.k.greedy_pick,
            grid: (PICK_BLOCKS, 1, 1),
            block: PICK_THREADS,
            smem: 0,
            args: Self::args(p),
            label: "greedy_pick",
            keep: vec![&logits.mem, &partials, &counter],
        });
        self.flush_this_thread()?;
        let (done, replayed) = {
            let mut st = self.lock();
            (st.pick_events.pop(), std::mem::take(&mut st.replayed))
        };
        let done = match done {
            Some(e) => e,
            None => self.gpu.event().map_err(engine_err)?,
        };
        done.record().map_err(engine_err)?;
        let pos = step.pos0 + step.n_tok;
        Ok(CudaPick {
            // SAFETY: `pos % RING` is within the ring.
            slot: unsafe { ring_host.add(pos % RING) },
            done,
            pos,
            thread: std::thread::current().id(),
            replayed,
        })
    }

    /// `Backend::take_pick`: waits for the pick's step and reads its slot.
    pub(crate) fn take_pick_op(&self, pick: CudaPick) -> EngineResult<u32> {
        let t0 = std::time::Instant::now();
        pick.done.wait().map_err(engine_err)?;
        // SAFETY: the slot is in the live ring; the device wrote it before the event.
        let token = unsafe { std::ptr::read_volatile(pick.slot) };
        let mut st = self.lock();
        if pick.replayed {
            st.stats.host_read_ms += t0.elapsed().as_secs_f64() * 1e3;
        }
        Self::read_graph_timing(&mut st);
        st.pick_events.push(pick.done);
        Ok(token)
    }

    /// This thread's ring of choices: its device and host addresses.
    fn pick_ring(&self) -> crate::error::Result<(DPtr, *const u32)> {
        let tid = std::thread::current().id();
        let mut st = self.lock();
        if let Some((ring, dev)) = st.pick_rings.get(&tid) {
            return Ok((*dev, ring.ptr as *const u32));
        }
        self.gpu.bind()?;
        let ring = Pinned::alloc(4 * RING, cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP)?;
        let mut dev: DPtr = 0;
        // SAFETY: `ring` is page-locked memory allocated with DEVICEMAP.
        unsafe {
            cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dev, ring.ptr.cast(), 0)
                .result()
                .map_err(|e| CudaError::driver("cuMemHostGetDevicePointer", e))?;
        }
        let host = ring.ptr as *const u32;
        st.pick_rings.insert(tid, (ring, dev));
        Ok((dev, host))
    }
}
