//! Run-time kernel compilation: the `.cu` sources under `kernels/` are embedded in the
//! binary, compiled by NVRTC for the device's architecture (`sm_90a` on the H200) to a
//! CUBIN, and cached on disk keyed by a SHA-256 of the sources, the options, the
//! architecture and the NVRTC version, so a second start loads the cached binary.
//!
//! Cache folder: `$DS4_CUDA_CACHE`, else `$XDG_CACHE_HOME/ds4-server/cuda`, else
//! `~/.cache/ds4-server/cuda`. A cache that cannot be written is skipped.

use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;

use cudarc::nvrtc::sys as nv;
use sha2::{Digest, Sha256};

use crate::error::{CudaError, Result};

/// The header every kernel includes.
pub const COMMON_HEADER: (&str, &str) = ("common.cuh", include_str!("../kernels/common.cuh"));

/// A kernel module: its file name, source and the kernels it defines.
pub struct Source {
    pub file: &'static str,
    pub text: &'static str,
    pub kernels: &'static [&'static str],
}

/// Every kernel module.
pub const SOURCES: &[Source] = &[
    Source {
        file: "gemv.cu",
        text: include_str!("../kernels/gemv.cu"),
        kernels: &[
            "gemv",
            "gemv_q4_0",
            "gemv_q4_0_pair",
            "gemv_q4_1",
            "gemv_q4_1_pair",
            "gemv_q5_0",
            "gemv_q5_0_pair",
            "gemv_q8_0",
            "gemv_q8_0_pair",
            "gemv_q4_k",
            "gemv_q4_k_pair",
            "gemv_q5_k",
            "gemv_q5_k_pair",
            "gemv_q6_k",
            "gemv_q6_k_pair",
            "gemv_iq2_xxs",
            "gemv_iq2_xxs_pair",
            "gemv_q2_k",
            "gemv_q2_k_pair",
            "gemv_experts_gate_up",
            "gemv_experts_down",
            "gemv_experts_down_sum",
            "gemv_experts_gate_up_q4_0",
            "gemv_experts_down_q4_0",
            "gemv_experts_down_sum_q4_0",
            "gemv_experts_gate_up_q4_1",
            "gemv_experts_down_q4_1",
            "gemv_experts_down_sum_q4_1",
            "gemv_experts_gate_up_q5_0",
            "gemv_experts_down_q5_0",
            "gemv_experts_down_sum_q5_0",
            "gemv_experts_gate_up_q8_0",
            "gemv_experts_down_q8_0",
            "gemv_experts_down_sum_q8_0",
            "gemv_experts_gate_up_q4_k",
            "gemv_experts_down_q4_k",
            "gemv_experts_down_sum_q4_k",
            "gemv_experts_gate_up_q5_k",
            "gemv_experts_down_q5_k",
            "gemv_experts_down_sum_q5_k",
            "gemv_experts_gate_up_q6_k",
            "gemv_experts_down_q6_k",
            "gemv_experts_down_sum_q6_k",
            "gemv_experts_gate_up_iq2_xxs",
            "gemv_experts_down_iq2_xxs",
            "gemv_experts_down_sum_iq2_xxs",
            "gemv_experts_gate_up_q2_k",
            "gemv_experts_down_q2_k",
            "gemv_experts_down_sum_q2_k",
        ],
    },
    Source {
        file: "elementwise.cu",
        text: include_str!("../kernels/elementwise.cu"),
        kernels: &[
            "rms_norm_rows",
            "rms_norm_store",
            "add_inplace",
            "swiglu",
            "add_bias_rows",
            "f32_to_bf16",
            "copy_f32",
            "fill_f32",
            "swiglu_ref",
            "add_round",
            "scale_sigmoid",
            "to_f32",
        ],
    },
    Source {
        file: "dequant.cu",
        text: include_str!("../kernels/dequant.cu"),
        kernels: &[
            "split_plane",
            "synth_blocks",
            "synth_floats",
            "embed_rows",
            "dequant_bf16",
            "embed_streams",
        ],
    },
    Source {
        file: "rope.cu",
        text: include_str!("../kernels/rope.cu"),
        kernels: &[
            "rope_rows",
            "rope_torch",
            "rope_torch_store",
            "kv_store",
            "rope_qk_store",
        ],
    },
    Source {
        file: "attention.cu",
        text: include_str!("../kernels/attention.cu"),
        kernels: &[
            "attn_decode_split_64",
            "attn_decode_split_128",
            "attn_decode_reduce",
            "attn_decode_fused_64",
            "attn_decode_fused_128",
            "attn_prefill_64",
            "attn_prefill_128",
        ],
    },
    Source {
        file: "norm.cu",
        text: include_str!("../kernels/norm.cu"),
        kernels: &[
            "rms_norm_ref",
            "rms_norm_rope",
            "layer_norm_ref",
            "gated_norm",
        ],
    },
    Source {
        file: "float_gemv.cu",
        text: include_str!("../kernels/float_gemv.cu"),
        kernels: &["gemv_float", "gemv_float_multi", "gemv_float_experts"],
    },
    Source {
        file: "moe.cu",
        text: include_str!("../kernels/moe.cu"),
        kernels: &["moe_route", "router_route", "moe_reduce"],
    },
    Source {
        file: "pick.cu",
        text: include_str!("../kernels/pick.cu"),
        kernels: &["greedy_pick"],
    },
    Source {
        file: "moe_mma.cu",
        text: include_str!("../kernels/moe_mma.cu"),
        kernels: &[
            "moe_sort",
            "moe_mma_gate_up",
            "moe_mma_down",
            "moe_mma_gate_up_iq2_xxs",
            "moe_mma_down_iq2_xxs",
            "moe_mma_gate_up_q2_k",
            "moe_mma_down_q2_k",
        ],
    },
    Source {
        file: "mhc.cu",
        text: include_str!("../kernels/mhc.cu"),
        kernels: &[
            "hc_rms",
            "hc_mixes",
            "hc_pre_finish",
            "hc_pre_one",
            "hc_post_pre",
            "hc_sinkhorn",
            "hc_post",
            "hc_head",
        ],
    },
    Source {
        file: "delta.cu",
        text: include_str!("../kernels/delta.cu"),
        kernels: &[
            "delta_conv",
            "delta_inputs",
            "delta_conv_state",
            "delta_recurrent_16",
            "delta_recurrent_32",
            "delta_recurrent_64",
            "delta_recurrent_128",
            "delta_replay_conv",
            "delta_replay_16",
            "delta_replay_32",
            "delta_replay_64",
            "delta_replay_128",
            "delta_step",
        ],
    },
    Source {
        file: "sparse.cu",
        text: include_str!("../kernels/sparse.cu"),
        kernels: &[
            "store_rows",
            "compress_windows",
            "dsa_scores",
            "dsa_topk",
            "mla_attend",
            "mla_expand",
            "mla_softmax",
            "sink_scores",
            "sink_mix",
        ],
    },
];

/// NVRTC options besides the architecture. No fast math: the kernels reproduce the CPU
/// backend's arithmetic (IEEE division and square root, accurate exp/sin/cos).
const OPTIONS: &[&str] = &["-std=c++17", "-lineinfo"];

/// Whether the NVRTC library can be loaded on this machine.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { nv::is_culib_present() }
}

fn check(r: nv::nvrtcResult, what: &'static str) -> Result<()> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            call: what,
            detail: format!("{r:?}"),
        })
    }
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary { lib: "libnvrtc" });
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: out-pointers to locals.
    check(unsafe { nv::nvrtcVersion(&mut a, &mut b) }, "nvrtcVersion")?;
    Ok((a, b))
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DS4_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("ds4-server/cuda"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ds4-server/cuda"))
}

/// Compiles `file` (one of [`SOURCES`]) for `arch` to a CUBIN, through the disk cache.
pub fn cubin(file: &str, src: &str, arch: &str) -> Result<Vec<u8>> {
    let version = nvrtc_version()?;
    let mut h = Sha256::new();
    for part in [
        arch,
        &format!("{version:?}"),
        &OPTIONS.join(" "),
        COMMON_HEADER.1,
        src,
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let digest: String = h
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    let stem = file.trim_end_matches(".cu");
    let path = cache_dir().map(|d| d.join(format!("{stem}-{arch}-{digest}.cubin")));
    if let Some(p) = &path
        && let Ok(bytes) = std::fs::read(p)
        && !bytes.is_empty()
    {
        tracing::debug!(file, path = %p.display(), "kernel cache hit");
        return Ok(bytes);
    }
    let t0 = std::time::Instant::now();
    let bytes = compile(file, src, arch, true)?;
    tracing::info!(
        file,
        arch,
        ms = t0.elapsed().as_millis() as u64,
        "compiled kernels"
    );
    if let Some(p) = &path {
        let _ = write_atomic(p, &bytes);
    }
    Ok(bytes)
}

fn write_atomic(path: &PathBuf, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Compiles one source with NVRTC: a CUBIN when `cubin` (a real architecture), else PTX.
pub fn compile(file: &str, src: &str, arch: &str, cubin: bool) -> Result<Vec<u8>> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary { lib: "libnvrtc" });
    }
    let c = |s: &str| CString::new(s).expect("no NUL in kernel sources");
    let (src_c, name_c) = (c(src), c(file));
    let (hdr_name, hdr_src) = (c(COMMON_HEADER.0), c(COMMON_HEADER.1));
    let headers = [hdr_src.as_ptr()];
    let include_names = [hdr_name.as_ptr()];
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all strings are NUL-terminated and outlive the program.
    check(
        unsafe {
            nv::nvrtcCreateProgram(
                &mut prog,
                src_c.as_ptr(),
                name_c.as_ptr(),
                1,
                headers.as_ptr(),
                include_names.as_ptr(),
            )
        },
        "nvrtcCreateProgram",
    )?;
    let arch_opt = c(&format!("--gpu-architecture={arch}"));
    let opts: Vec<CString> = OPTIONS.iter().map(|o| c(o)).collect();
    let mut opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    opt_ptrs.push(arch_opt.as_ptr());
    // SAFETY: `prog` is live; options are NUL-terminated.
    let r = unsafe { nv::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let out = if r != nv::nvrtcResult::NVRTC_SUCCESS {
        Err(CudaError::Compile {
            file: file.into(),
            arch: arch.into(),
            log: program_log(prog),
        })
    } else {
        fetch(prog, cubin)
    };
    // SAFETY: destroys the program created above.
    unsafe { nv::nvrtcDestroyProgram(&mut prog) };
    out
}

fn program_log(prog: nv::nvrtcProgram) -> String {
    let mut n = 0usize;
    // SAFETY: `prog` is live; the buffer has the reported size.
    unsafe {
        if nv::nvrtcGetProgramLogSize(prog, &mut n) != nv::nvrtcResult::NVRTC_SUCCESS || n == 0 {
            return String::new();
        }
        let mut buf = vec![0 as c_char; n];
        nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr());
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
    }
}

fn fetch(prog: nv::nvrtcProgram, cubin: bool) -> Result<Vec<u8>> {
    let mut n = 0usize;
    // SAFETY: `prog` compiled successfully; the buffer has the reported size.
    unsafe {
        if cubin {
            check(nv::nvrtcGetCUBINSize(prog, &mut n), "nvrtcGetCUBINSize")?;
            let mut buf = vec![0u8; n];
            check(
                nv::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char),
                "nvrtcGetCUBIN",
            )?;
            Ok(buf)
        } else {
            check(nv::nvrtcGetPTXSize(prog, &mut n), "nvrtcGetPTXSize")?;
            let mut buf = vec![0u8; n];
            check(
                nv::nvrtcGetPTX(prog, buf.as_mut_ptr() as *mut c_char),
                "nvrtcGetPTX",
            )?;
            Ok(buf)
        }
    }
}
