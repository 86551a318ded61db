//! NCCL, loaded at run time like the other CUDA libraries: the binary builds and runs
//! without it, and only a multi-GPU run asks for it (issue 16, `docs/multi_gpu.md`).
//!
//! The library is opened by its runtime name `libnccl.so.2` (what the `libnccl2`
//! package and the `nvidia-nccl-cu12`/`-cu13` wheels install), then `libnccl.so` (the
//! `-dev` symlink), from the loader's search path (`LD_LIBRARY_PATH`). cudarc's `nccl`
//! feature is not used: its loader tries neither `libnccl.so.2` nor a path, so a
//! machine without the `-dev` package reads as having no NCCL, and it panics on a
//! missing symbol instead of returning an error.
//!
//! NVLink multicast (NVLS) is turned off (`NCCL_NVLS_ENABLE=0`) before the library
//! loads: the GPU machines this project runs on do not allow it.
//!
//! A [`Comm`] is one rank of a communicator over GPUs of this process
//! (`ncclCommInitAll`); its collectives are enqueued on the rank's [`Gpu`] stream, so
//! they order with the step's kernels and can be captured in a CUDA graph.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

use crate::driver::{DPtr, Gpu};
use crate::error::{CudaError, Result};

type RawComm = *mut c_void;
/// `ncclResult_t`; 0 is `ncclSuccess`.
type Status = c_int;
/// `ncclFloat32` of `ncclDataType_t`.
const FLOAT32: c_int = 7;
/// `ncclSum` of `ncclRedOp_t`.
const SUM: c_int = 0;

/// The library names tried, in order.
const NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// The NCCL entry points this backend calls.
struct Api {
    get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> Status,
    comm_destroy: unsafe extern "C" fn(RawComm) -> Status,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> Status,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        RawComm,
        *mut c_void,
    ) -> Status,
    /// Keeps the functions above valid.
    _lib: libloading::Library,
}

/// Loads the library once; `Err` holds why it could not be used.
fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|why| CudaError::NcclMissing(why.clone()))
}

fn load() -> std::result::Result<Api, String> {
    // SAFETY: runs once, before NCCL (which reads its environment at initialisation) is
    // loaded; no other thread of this crate reads or writes the environment meanwhile.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    let mut tried = Vec::new();
    for name in NAMES {
        // SAFETY: NCCL's initialisers only set up its own state.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return bind(lib).map_err(|e| format!("{name}: {e}")),
            // libloading's message is "dlopen failed"; the loader's own is the source.
            Err(e) => {
                tried.push(std::error::Error::source(&e).map_or(e.to_string(), |s| s.to_string()))
            }
        }
    }
    Err(format!(
        "it is not installed or not on the library path (tried {}: {}); install libnccl2, or the nvidia-nccl-cu13 wheel and add its lib folder to LD_LIBRARY_PATH",
        NAMES.join(", "),
        tried.join("; ")
    ))
}

fn bind(lib: libloading::Library) -> std::result::Result<Api, libloading::Error> {
    // SAFETY: each symbol is declared with NCCL 2's C signature (`nccl.h`).
    unsafe {
        Ok(Api {
            get_version: *lib.get(b"ncclGetVersion\0")?,
            get_error_string: *lib.get(b"ncclGetErrorString\0")?,
            comm_init_all: *lib.get(b"ncclCommInitAll\0")?,
            comm_destroy: *lib.get(b"ncclCommDestroy\0")?,
            all_reduce: *lib.get(b"ncclAllReduce\0")?,
            all_gather: *lib.get(b"ncclAllGather\0")?,
            _lib: lib,
        })
    }
}

fn check(api: &Api, r: Status, call: &'static str) -> Result<()> {
    if r == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for any status.
    let text = unsafe { CStr::from_ptr((api.get_error_string)(r)) };
    Err(CudaError::Nccl {
        call,
        detail: format!("{} (status {r})", text.to_string_lossy()),
    })
}

/// NCCL's version as `(major, minor, patch)`.
///
/// Errors: [`CudaError::NcclMissing`] when the library cannot be loaded (naming what
/// was tried and how to install it).
pub fn version() -> Result<(u32, u32, u32)> {
    let api = api()?;
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    check(api, unsafe { (api.get_version)(&mut v) }, "ncclGetVersion")?;
    // NCCL ≥ 2.9 encodes major·10000 + minor·100 + patch.
    let v = v as u32;
    Ok((v / 10000, v / 100 % 100, v % 100))
}

/// One rank of a communicator over GPUs of this process.
pub struct Comm {
    raw: RawComm,
    gpu: Arc<Gpu>,
    /// This rank and the number of ranks.
    pub rank: usize,
    pub n_ranks: usize,
}

// SAFETY: a communicator is used from one thread at a time (its owner's); NCCL allows
// that thread to differ between calls.
unsafe impl Send for Comm {}

impl Comm {
    /// A communicator over `gpus` (rank `i` on `gpus[i]`), with `NCCL_NVLS_ENABLE=0`.
    ///
    /// Errors: [`CudaError::NcclMissing`] without NCCL, [`CudaError::Nccl`] when its
    /// initialisation fails.
    pub fn init_all(gpus: &[Arc<Gpu>]) -> Result<Vec<Comm>> {
        let api = api()?;
        let devices: Vec<c_int> = gpus.iter().map(|g| g.ordinal as c_int).collect();
        let mut raw = vec![std::ptr::null_mut(); gpus.len()];
        // SAFETY: `raw` and `devices` hold one entry per rank.
        check(
            api,
            unsafe {
                (api.comm_init_all)(raw.as_mut_ptr(), devices.len() as c_int, devices.as_ptr())
            },
            "ncclCommInitAll",
        )?;
        Ok(raw
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (raw, gpu))| Comm {
                raw,
                gpu: gpu.clone(),
                rank,
                n_ranks: gpus.len(),
            })
            .collect())
    }

    /// `recv[i] = Σ_ranks send[i]` for `count` f32, enqueued on this rank's stream.
    pub fn all_reduce_sum_f32(&self, send: DPtr, recv: DPtr, count: usize) -> Result<()> {
        let api = api()?;
        self.gpu.bind()?;
        // SAFETY: both buffers hold `count` f32 on this rank's device; the stream is live.
        let r = unsafe {
            (api.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                FLOAT32,
                SUM,
                self.raw,
                self.gpu.stream() as *mut c_void,
            )
        };
        check(api, r, "ncclAllReduce")
    }

    /// `recv` = every rank's `count` f32 of `send`, in rank order, enqueued on this
    /// rank's stream.
    pub fn all_gather_f32(&self, send: DPtr, recv: DPtr, count: usize) -> Result<()> {
        let api = api()?;
        self.gpu.bind()?;
        // SAFETY: `send` holds `count` f32 and `recv` `count · n_ranks` on this rank's
        // device; the stream is live.
        let r = unsafe {
            (api.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                FLOAT32,
                self.raw,
                self.gpu.stream() as *mut c_void,
            )
        };
        check(api, r, "ncclAllGather")
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: created by `init_all`; the stream's work is waited for first.
            let _ = self.gpu.sync();
            let _ = unsafe { (api.comm_destroy)(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_loads_nccl_or_says_what_was_tried_and_turns_nvls_off() {
        match version() {
            Ok((major, ..)) => assert_eq!(major, 2),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.starts_with("NCCL could not be loaded: it is not installed or not on the library path (tried libnccl.so.2, libnccl.so: "),
                    "{e}"
                );
                assert!(e.ends_with("add its lib folder to LD_LIBRARY_PATH"), "{e}");
            }
        }
        assert_eq!(std::env::var("NCCL_NVLS_ENABLE").as_deref(), Ok("0"));
    }
}
