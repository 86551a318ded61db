//! The device side of the GPU responsiveness probe (issue 6, `ds4-server gpu-probe`
//! and `--gpu-probe`): a 4 KiB device-to-device copy on the probe's own stream,
//! bracketed by two timing events, submitted when the caller asks for a sample.
//!
//! Each [`RawSample`] holds four times in milliseconds: on the host clock (monotonic,
//! since the probe's anchor) when the copy was submitted and when the host saw it
//! complete; on the GPU clock (since the anchor event) when the copy started and
//! ended. GPU times are accumulated from event-to-event intervals between consecutive
//! samples, so each `cuEventElapsedTime` span stays short (one sample period) and keeps
//! its sub-microsecond resolution. Relating the two clocks (and so splitting the
//! round trip into the wait before the GPU started, the GPU interval and the return to
//! the host) is the caller's job.
//!
//! The probe uses the device's primary context (the one [`crate::CudaBackend`] uses,
//! when both run in one process) with a separate non-blocking stream, so its copies
//! queue behind nothing of the engine's stream and measure only how long the GPU takes
//! to get to them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUdeviceptr, CUevent, CUresult, CUstream};
use cudarc::driver::{CudaContext, DriverError, result};

use crate::error::{CudaError, Result};

/// Bytes copied per sample.
pub const COPY_BYTES: usize = 4096;

/// How long the host spins (yielding) on a submitted copy before it polls with sleeps.
const SPIN: Duration = Duration::from_millis(2);
/// Sleep between polls once the spin is over, while the copy has not started.
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// One probe copy as measured. Host times on the monotonic clock, GPU times on the
/// event clock; both in ms since the probe was created ([`Probe::new`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawSample {
    /// Host time just before the copy was enqueued.
    pub submit_ms: f64,
    /// Host time when the host saw the copy's end event complete.
    pub return_ms: f64,
    /// GPU time of the start event (the copy began after it).
    pub gpu_start_ms: f64,
    /// GPU time of the end event.
    pub gpu_end_ms: f64,
}

/// A copy that has been submitted and not yet seen complete.
struct Pending {
    pair: usize,
    submit_ms: f64,
}

/// The probe: a stream, two 4 KiB buffers and timing events on one device.
///
/// Not `Send`: create and use it on the probing thread.
pub struct Probe {
    ctx: Arc<CudaContext>,
    stream: CUstream,
    src: CUdeviceptr,
    dst: CUdeviceptr,
    anchor: CUevent,
    /// Two (start, end) pairs used alternately, so the previous sample's end event
    /// stays valid as the reference of the next start.
    pairs: [[CUevent; 2]; 2],
    next_pair: usize,
    /// The event the next start is measured from, and its GPU time (ms).
    reference: CUevent,
    reference_ms: f64,
    pending: Option<Pending>,
    anchor_host: Instant,
    /// The device's name.
    pub device_name: String,
}

impl Probe {
    /// Opens device `ordinal`'s primary context with a new non-blocking stream, two
    /// [`COPY_BYTES`] buffers and five events, and records the anchor event (waiting
    /// for it, so host and GPU time start together to within the driver's round trip).
    ///
    /// Errors: [`CudaError::NoDevice`] without a driver or device, else the failing
    /// driver call.
    pub fn new(ordinal: usize) -> Result<Probe> {
        if !crate::driver::driver_present() {
            return Err(CudaError::NoDevice(
                "the CUDA driver library (libcuda.so) is not installed".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| CudaError::NoDevice(format!("device {ordinal}: {e:?}")))?;
        let device_name = ctx.name().unwrap_or_else(|_| "unknown".into());
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| CudaError::driver("cuStreamCreate", e))?;
        // Build the probe before allocating, so that `Drop` frees whatever was made.
        let mut p = Probe {
            ctx,
            stream,
            src: 0,
            dst: 0,
            anchor: std::ptr::null_mut(),
            pairs: [[std::ptr::null_mut(); 2]; 2],
            next_pair: 0,
            reference: std::ptr::null_mut(),
            reference_ms: 0.0,
            pending: None,
            anchor_host: Instant::now(),
            device_name,
        };
        // SAFETY: plain allocations of COPY_BYTES, freed in `Drop`.
        p.src = unsafe { result::malloc_sync(COPY_BYTES) }
            .map_err(|e| CudaError::driver("cuMemAlloc", e))?;
        // SAFETY: as above.
        p.dst = unsafe { result::malloc_sync(COPY_BYTES) }
            .map_err(|e| CudaError::driver("cuMemAlloc", e))?;
        let event = || {
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(|e| CudaError::driver("cuEventCreate", e))
        };
        p.anchor = event()?;
        for pair in 0..2 {
            for i in 0..2 {
                p.pairs[pair][i] = event()?;
            }
        }
        // SAFETY: our event and stream.
        unsafe { result::event::record(p.anchor, p.stream) }
            .map_err(|e| CudaError::driver("cuEventRecord", e))?;
        // SAFETY: our event, just recorded.
        unsafe { result::event::synchronize(p.anchor) }
            .map_err(|e| CudaError::driver("cuEventSynchronize", e))?;
        p.anchor_host = Instant::now();
        p.reference = p.anchor;
        Ok(p)
    }

    /// Host milliseconds since the anchor.
    fn host_ms(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.anchor_host).as_secs_f64() * 1e3
    }

    /// Submits one copy and waits for it, at most `timeout`: spinning (yielding the
    /// CPU) for the first 2 ms, then polling the start event every 50 µs and spinning
    /// again once the copy has started, so the return time stays precise.
    ///
    /// A copy still pending from an earlier call that timed out is waited for first
    /// (within the same `timeout`) and then dropped from the results.
    ///
    /// Errors: [`CudaError::Driver`] for a failed driver call; a timeout is
    /// `CudaError::Driver { call: "probe copy", .. }` naming the time waited.
    pub fn sample(&mut self, timeout: Duration) -> Result<RawSample> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))?;
        if self.pending.is_some() {
            self.wait_pending(Instant::now() + timeout)?;
        }
        let pair = self.next_pair;
        let [start, end] = self.pairs[pair];
        let submitted = Instant::now();
        // SAFETY: our events, stream and two COPY_BYTES buffers.
        unsafe {
            result::event::record(start, self.stream)
                .map_err(|e| CudaError::driver("cuEventRecord", e))?;
            result::memcpy_dtod_async(self.dst, self.src, COPY_BYTES, self.stream)
                .map_err(|e| CudaError::driver("cuMemcpyDtoDAsync", e))?;
            result::event::record(end, self.stream)
                .map_err(|e| CudaError::driver("cuEventRecord", e))?;
        }
        self.next_pair = 1 - pair;
        self.pending = Some(Pending {
            pair,
            submit_ms: self.host_ms(submitted),
        });
        self.wait_pending(submitted + timeout)
    }

    /// Waits for the pending copy until `deadline`; on completion moves the reference
    /// to its end event and returns its times.
    fn wait_pending(&mut self, deadline: Instant) -> Result<RawSample> {
        let Some(Pending { pair, submit_ms }) = self.pending else {
            return Err(CudaError::Unsupported("probe: no copy pending".into()));
        };
        let [start, end] = self.pairs[pair];
        let spin_until = Instant::now() + SPIN;
        let mut started = false;
        let returned = loop {
            if done(end)? {
                break Instant::now();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CudaError::Driver {
                    call: "probe copy",
                    detail: format!(
                        "not complete {:.0} ms after submission",
                        now.duration_since(self.anchor_host).as_secs_f64() * 1e3 - submit_ms
                    ),
                });
            }
            if !started && now >= spin_until {
                started = done(start)?;
            }
            if now < spin_until || started {
                std::thread::yield_now();
            } else {
                std::thread::sleep(POLL_SLEEP);
            }
        };
        // SAFETY: all three events were recorded on our stream and are complete.
        let (to_start, copy) = unsafe {
            (
                result::event::elapsed(self.reference, start)
                    .map_err(|e| CudaError::driver("cuEventElapsedTime", e))?,
                result::event::elapsed(start, end)
                    .map_err(|e| CudaError::driver("cuEventElapsedTime", e))?,
            )
        };
        let gpu_start_ms = self.reference_ms + f64::from(to_start);
        let gpu_end_ms = gpu_start_ms + f64::from(copy);
        self.reference = end;
        self.reference_ms = gpu_end_ms;
        self.pending = None;
        Ok(RawSample {
            submit_ms,
            return_ms: self.host_ms(returned),
            gpu_start_ms,
            gpu_end_ms,
        })
    }
}

/// Whether `ev` has completed (`cuEventQuery`).
fn done(ev: CUevent) -> Result<bool> {
    // SAFETY: an event created by this module and recorded on its stream.
    match unsafe { result::event::query(ev) } {
        Ok(()) => Ok(true),
        Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(e) => Err(CudaError::driver("cuEventQuery", e)),
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: our stream, events and buffers; nothing uses them after the sync.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            for ev in self.pairs.iter().flatten().chain([&self.anchor]) {
                if !ev.is_null() {
                    let _ = result::event::destroy(*ev);
                }
            }
            for ptr in [self.src, self.dst] {
                if ptr != 0 {
                    let _ = result::free_sync(ptr);
                }
            }
            let _ = result::stream::destroy(self.stream);
        }
    }
}
