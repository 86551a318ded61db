//! The device: one CUDA context and one stream, device memory with stream-ordered
//! allocation and free, kernel launches (optionally with programmatic dependent
//! launch), copies and events, over `cudarc`'s dynamically loaded driver API.
//!
//! Everything the backend enqueues goes to the one stream, so the order of calls is the
//! order of execution and a step needs no host synchronisation until its logits are
//! read.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{CudaContext, result};

use crate::error::{CudaError, Result};

/// A device pointer.
pub type DPtr = u64;

/// The device and its stream.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    /// The device ordinal, counted after `CUDA_VISIBLE_DEVICES`.
    pub ordinal: usize,
    /// Streaming multiprocessors.
    pub n_sm: u32,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    /// The device's name.
    pub name: String,
    /// Largest dynamic shared memory a block may opt into.
    pub max_smem_optin: u32,
}

// SAFETY: the stream handle is only used through the driver API, which is thread-safe
// once the context is current (`bind` makes it so on every entry).
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

/// The number of GPUs this process sees: the driver numbers them `0..n` after applying
/// `CUDA_VISIBLE_DEVICES`.
///
/// Errors: [`CudaError::NoDevice`] without a driver or when `cuInit` fails.
pub fn visible_devices() -> Result<usize> {
    if !driver_present() {
        return Err(CudaError::NoDevice(
            "the CUDA driver library (libcuda.so) is not installed".into(),
        ));
    }
    result::init().map_err(|e| CudaError::NoDevice(format!("cuInit failed: {e:?}")))?;
    let n = result::device::get_count().map_err(|e| CudaError::NoDevice(format!("{e:?}")))?;
    Ok(n.max(0) as usize)
}

/// Total memory of device `ordinal` in bytes, without creating a context.
pub fn device_memory(ordinal: usize) -> Result<u64> {
    visible_devices()?;
    let dev =
        result::device::get(ordinal as i32).map_err(|e| CudaError::driver("cuDeviceGet", e))?;
    // SAFETY: a device handle just obtained.
    let bytes = unsafe { result::device::total_mem(dev) }
        .map_err(|e| CudaError::driver("cuDeviceTotalMem", e))?;
    Ok(bytes as u64)
}

/// The message for device `ordinal` when only `visible` GPUs are visible.
pub fn out_of_range(ordinal: usize, visible: usize) -> String {
    out_of_range_under(
        ordinal,
        visible,
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
    )
}

fn out_of_range_under(ordinal: usize, visible: usize, mask: Option<&str>) -> String {
    let mask = match mask {
        Some(m) => format!(" (CUDA_VISIBLE_DEVICES={m}; devices are numbered after the mask)"),
        None => String::new(),
    };
    let range = match visible {
        0 => "none".to_string(),
        1 => "only device 0".to_string(),
        n => format!("devices 0 to {}", n - 1),
    };
    format!(
        "device {ordinal} requested, {visible} GPU{} visible{mask}: {range}",
        if visible == 1 { "" } else { "s" }
    )
}

impl Gpu {
    /// Opens device `ordinal` (counted after `CUDA_VISIBLE_DEVICES`) with a new
    /// non-blocking stream.
    pub fn new(ordinal: usize) -> Result<Arc<Gpu>> {
        let n = visible_devices()?;
        if ordinal >= n {
            return Err(CudaError::NoDevice(out_of_range(ordinal, n)));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::driver("cuCtxCreate", e))?;
        let attr = |a| {
            ctx.attribute(a)
                .map_err(|e| CudaError::driver("cuDeviceGetAttribute", e))
        };
        let n_sm = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let cc = (
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let max_smem_optin =
            attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as u32;
        if cc.0 < 8 {
            return Err(CudaError::NoDevice(format!(
                "compute capability {}.{} is below 8.0",
                cc.0, cc.1
            )));
        }
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        ctx.bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| CudaError::driver("cuStreamCreate", e))?;
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            ordinal,
            n_sm,
            cc,
            name,
            max_smem_optin,
        }))
    }

    /// Makes the context current on this thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("cuCtxSetCurrent", e))
    }

    /// The raw stream.
    pub fn stream(&self) -> sys::CUstream {
        self.stream
    }

    /// The GPU architecture name NVRTC targets (`sm_90a` on Hopper).
    pub fn arch(&self) -> String {
        let (ma, mi) = self.cc;
        // The `a` variants enable architecture-specific instructions (wgmma, setmaxnreg).
        if ma == 9 && mi == 0 {
            "sm_90a".into()
        } else {
            format!("sm_{ma}{mi}")
        }
    }

    /// `bytes` of device memory, zeroed.
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DevMem> {
        self.bind()?;
        let n = bytes.max(256);
        // SAFETY: stream-ordered allocation on our stream; freed in `DevMem::drop`.
        let ptr = unsafe { result::malloc_async(self.stream, n) }
            .map_err(|e| CudaError::driver("cuMemAllocAsync", e))?;
        // SAFETY: `ptr` holds `n` bytes.
        unsafe { result::memset_d8_async(ptr, 0, n, self.stream) }
            .map_err(|e| CudaError::driver("cuMemsetD8Async", e))?;
        Ok(DevMem {
            ptr,
            bytes: n,
            gpu: self.clone(),
        })
    }

    /// Copies host bytes to `dst` (stream-ordered; the host buffer may be reused at once).
    pub fn htod(&self, dst: DPtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` holds at least `src.len()` bytes (callers size it). Pageable
        // source memory is staged before the call returns.
        unsafe { result::memcpy_htod_async(dst, src, self.stream) }
            .map_err(|e| CudaError::driver("cuMemcpyHtoDAsync", e))
    }

    /// Whether a graph capture is recording the stream (its work then goes into the
    /// graph instead of running).
    pub fn capturing(&self) -> Result<bool> {
        self.bind()?;
        // SAFETY: our stream.
        let status = unsafe { result::stream::is_capturing(self.stream) }
            .map_err(|e| CudaError::driver("cuStreamIsCapturing", e))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Copies device bytes to the host and waits for the copy.
    pub fn dtoh(&self, dst: &mut [u8], src: DPtr) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` holds at least `dst.len()` bytes.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream) }
            .map_err(|e| CudaError::driver("cuMemcpyDtoHAsync", e))?;
        self.sync()
    }

    /// Copies `bytes` between device buffers (stream-ordered).
    pub fn dtod(&self, dst: DPtr, src: DPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges are valid for `bytes`.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream) }
            .map_err(|e| CudaError::driver("cuMemcpyDtoDAsync", e))
    }

    /// Waits for everything enqueued so far.
    pub fn sync(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: our stream.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| CudaError::driver("cuStreamSynchronize", e))
    }

    /// Launches `f` on the stream. With `pdl`, the launch allows programmatic dependent
    /// launch: it may begin before the previous kernel ends and must wait for it with
    /// `griddepcontrol.wait` before touching its results (every kernel of this crate
    /// that runs inside a step does).
    pub fn launch(
        &self,
        f: Func,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &Args,
        pdl: bool,
    ) -> Result<()> {
        let mut ptrs = args.ptrs();
        if pdl {
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue {
                    programmaticStreamSerializationAllowed: 1,
                },
            };
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: `ptrs` point into `args`, which outlives the call; the kernel's
            // parameter list matches `args` (each launch site builds them together).
            unsafe { sys::cuLaunchKernelEx(&cfg, f.0, ptrs.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .map_err(|e| CudaError::driver("cuLaunchKernelEx", e))
        } else {
            // SAFETY: as above.
            unsafe { result::launch_kernel(f.0, grid, (block, 1, 1), smem, self.stream, &mut ptrs) }
                .map_err(|e| CudaError::driver("cuLaunchKernel", e))
        }
    }

    /// Blocks of `f` that fit on one multiprocessor with `block` threads and `smem`
    /// bytes of dynamic shared memory.
    pub fn occupancy(&self, f: Func, block: u32, smem: u32) -> u32 {
        // SAFETY: a valid function handle.
        unsafe {
            result::occupancy::max_active_block_per_multiprocessor(f.0, block as i32, smem as usize)
        }
        .map(|n| n.max(1) as u32)
        .unwrap_or(1)
    }

    /// A timing event.
    pub fn event(self: &Arc<Self>) -> Result<Event> {
        self.bind()?;
        let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| CudaError::driver("cuEventCreate", e))?;
        Ok(Event {
            ev,
            gpu: self.clone(),
        })
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        result::mem_get_info().map_err(|e| CudaError::driver("cuMemGetInfo", e))
    }

    /// Bytes of the device's default memory pool (the one [`Gpu::alloc`] draws from): in
    /// live allocations, and reserved from the device (live plus freed blocks the pool
    /// keeps).
    pub fn pool_usage(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the device is this context's.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .map_err(|e| CudaError::driver("cuDeviceGetDefaultMemPool", e))?;
        let get = |a: sys::CUmemPool_attribute| -> Result<u64> {
            let mut v = 0u64;
            // SAFETY: both attributes are u64 values; the pool is the device's.
            unsafe { sys::cuMemPoolGetAttribute(pool, a, (&mut v as *mut u64).cast()) }
                .result()
                .map_err(|e| CudaError::driver("cuMemPoolGetAttribute", e))?;
            Ok(v)
        };
        Ok((
            get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
        ))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: our stream; nothing uses it after the device is dropped.
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::stream::destroy(self.stream);
            }
        }
    }
}

/// A kernel function handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Func(pub sys::CUfunction);
// SAFETY: function handles are immutable and usable from any thread of the context.
unsafe impl Send for Func {}
unsafe impl Sync for Func {}

impl Func {
    /// Its compiled resources, for an error message: registers per thread, the most
    /// threads a block may have with them, static shared memory.
    pub fn resources(&self) -> String {
        use sys::CUfunction_attribute as A;
        // SAFETY: a valid function handle; a failed query reads as -1.
        let get = |a| unsafe { result::function::get_function_attribute(self.0, a) }.unwrap_or(-1);
        format!(
            "{} registers per thread, at most {} threads per block, {} bytes of static shared memory",
            get(A::CU_FUNC_ATTRIBUTE_NUM_REGS),
            get(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            get(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        )
    }
}

/// Device memory, freed in stream order when dropped.
pub struct DevMem {
    ptr: DPtr,
    bytes: usize,
    gpu: Arc<Gpu>,
}

impl DevMem {
    pub fn ptr(&self) -> DPtr {
        self.ptr
    }

    /// The device it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: allocated by `Gpu::alloc` on this stream; kernels enqueued before
            // the free still see the memory.
            let _ = unsafe { result::free_async(self.ptr, self.gpu.stream) };
        }
    }
}

/// A CUDA event: for timing, or for waiting until the device has passed a point.
pub struct Event {
    ev: sys::CUevent,
    gpu: Arc<Gpu>,
}

// SAFETY: event handles are usable from any thread of the context.
unsafe impl Send for Event {}

impl Event {
    /// Records the event on the stream.
    pub fn record(&self) -> Result<()> {
        // SAFETY: our event and stream.
        unsafe { result::event::record(self.ev, self.gpu.stream) }
            .map_err(|e| CudaError::driver("cuEventRecord", e))
    }

    /// Whether the device has passed the event (without waiting).
    pub fn done(&self) -> Result<bool> {
        // SAFETY: our event.
        match unsafe { result::event::query(self.ev) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(CudaError::driver("cuEventQuery", e)),
        }
    }

    /// Waits until the device has passed the event.
    pub fn wait(&self) -> Result<()> {
        // SAFETY: our event.
        unsafe { result::event::synchronize(self.ev) }
            .map_err(|e| CudaError::driver("cuEventSynchronize", e))
    }

    /// Milliseconds from `self` to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        end.wait()?;
        // SAFETY: both events were recorded on our stream.
        unsafe { result::event::elapsed(self.ev, end.ev) }
            .map_err(|e| CudaError::driver("cuEventElapsedTime", e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: our event.
        let _ = unsafe { result::event::destroy(self.ev) };
    }
}

/// Kernel arguments: each value in its own 8-byte-aligned slot.
#[derive(Default, Clone, Debug, PartialEq)]
pub struct Args {
    words: Vec<u64>,
    offs: Vec<usize>,
}

impl Args {
    pub fn new() -> Self {
        Args::default()
    }

    /// Arguments of one value.
    pub fn with<T: bytemuck::NoUninit>(v: T) -> Self {
        let mut a = Args::new();
        a.push(v);
        a
    }

    /// Appends one argument (a scalar, a pointer or a `#[repr(C)]` struct).
    pub fn push<T: bytemuck::NoUninit>(&mut self, v: T) -> &mut Self {
        let n = std::mem::size_of::<T>().div_ceil(8).max(1);
        let off = self.words.len();
        self.words.resize(off + n, 0);
        // SAFETY: the slot holds at least size_of::<T>() bytes, u64-aligned.
        unsafe { std::ptr::write_unaligned(self.words.as_mut_ptr().add(off) as *mut T, v) };
        self.offs.push(off);
        self
    }

    /// Arguments from slots already laid out (`offs`: the first word of each).
    pub fn from_slots(words: &[u64], offs: &[u16]) -> Self {
        Args {
            words: words.to_vec(),
            offs: offs.iter().map(|&o| o as usize).collect(),
        }
    }

    fn ptrs(&self) -> Vec<*mut c_void> {
        self.offs
            .iter()
            .map(|&o| self.words[o..].as_ptr() as *mut c_void)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_names_the_visible_gpus_and_the_mask() {
        assert_eq!(
            out_of_range_under(2, 2, None),
            "device 2 requested, 2 GPUs visible: devices 0 to 1"
        );
        assert_eq!(
            out_of_range_under(1, 1, Some("3")),
            "device 1 requested, 1 GPU visible (CUDA_VISIBLE_DEVICES=3; devices are numbered after the mask): only device 0"
        );
        assert_eq!(
            out_of_range_under(0, 0, Some("")),
            "device 0 requested, 0 GPUs visible (CUDA_VISIBLE_DEVICES=; devices are numbered after the mask): none"
        );
    }
}
