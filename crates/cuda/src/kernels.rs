//! The kernel functions of every module, loaded once per device from the CUBINs that
//! [`crate::compile`] produces.

use std::ffi::CString;

use cudarc::driver::{result, sys};

use crate::compile::{SOURCES, cubin};
use crate::driver::{Func, Gpu};
use crate::error::{CudaError, Result};
use crate::layout::MATRIX_TYPES;

/// Every kernel the backend launches.
pub struct Kernels {
    /// The GEMV for any mix of types.
    pub gemv: Func,
    /// GEMVs specialized for one type (in [`MATRIX_TYPES`] order), and for Q4_K with Q6_K.
    pub gemv_typed: [Func; 8],
    pub gemv_q4_k_q6_k: Func,
    pub rms_norm_rows: Func,
    pub add_inplace: Func,
    pub swiglu: Func,
    pub add_bias_rows: Func,
    pub f32_to_bf16: Func,
    pub copy_f32: Func,
    pub split_plane: Func,
    pub synth_blocks: Func,
    pub embed_rows: Func,
    pub dequant_bf16: Func,
    pub rope_rows: Func,
    pub kv_store: Func,
    pub rope_qk_store: Func,
    pub attn_decode_split_64: Func,
    pub attn_decode_split_128: Func,
    pub attn_decode_reduce: Func,
    pub attn_prefill_64: Func,
    pub attn_prefill_128: Func,
    modules: Vec<Module>,
}

struct Module(sys::CUmodule);
// SAFETY: module handles are used only to unload on drop.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

/// Largest dynamic shared memory the GEMV may use (its activation: ~2.6 bytes per input).
pub const GEMV_MAX_SMEM: u32 = 200 * 1024;

impl Kernels {
    /// Compiles (or loads from the cache) and loads every module for `gpu`.
    pub fn load(gpu: &Gpu) -> Result<Kernels> {
        gpu.bind()?;
        let arch = gpu.arch();
        let mut modules = Vec::new();
        let mut funcs = std::collections::HashMap::new();
        for src in SOURCES {
            let image = cubin(src.file, src.text, &arch)?;
            // SAFETY: a CUBIN produced by NVRTC for this device's architecture.
            let module = unsafe { result::module::load_data(image.as_ptr() as *const _) }
                .map_err(|e| CudaError::driver("cuModuleLoadData", e))?;
            modules.push(Module(module));
            for &name in src.kernels {
                let c = CString::new(name).expect("kernel names have no NUL");
                // SAFETY: `module` is loaded; the name comes from its source.
                let f = unsafe { result::module::get_function(module, c) }
                    .map_err(|e| CudaError::driver("cuModuleGetFunction", e))?;
                funcs.insert(name, Func(f));
            }
        }
        let get = |n: &str| {
            funcs.get(n).copied().ok_or_else(|| CudaError::Unsupported(format!("kernel {n} missing from the sources")))
        };
        let k = Kernels {
            gemv: get("gemv")?,
            gemv_typed: [
                get("gemv_q4_0")?,
                get("gemv_q4_1")?,
                get("gemv_q5_0")?,
                get("gemv_q8_0")?,
                get("gemv_q4_k")?,
                get("gemv_q5_k")?,
                get("gemv_q6_k")?,
                get("gemv_iq2_xxs")?,
            ],
            gemv_q4_k_q6_k: get("gemv_q4_k_q6_k")?,
            rms_norm_rows: get("rms_norm_rows")?,
            add_inplace: get("add_inplace")?,
            swiglu: get("swiglu")?,
            add_bias_rows: get("add_bias_rows")?,
            f32_to_bf16: get("f32_to_bf16")?,
            copy_f32: get("copy_f32")?,
            split_plane: get("split_plane")?,
            synth_blocks: get("synth_blocks")?,
            embed_rows: get("embed_rows")?,
            dequant_bf16: get("dequant_bf16")?,
            rope_rows: get("rope_rows")?,
            kv_store: get("kv_store")?,
            rope_qk_store: get("rope_qk_store")?,
            attn_decode_split_64: get("attn_decode_split_64")?,
            attn_decode_split_128: get("attn_decode_split_128")?,
            attn_decode_reduce: get("attn_decode_reduce")?,
            attn_prefill_64: get("attn_prefill_64")?,
            attn_prefill_128: get("attn_prefill_128")?,
            modules,
        };
        let smem = GEMV_MAX_SMEM.min(gpu.max_smem_optin);
        for f in k.gemv_typed.iter().copied().chain([k.gemv, k.gemv_q4_k_q6_k]) {
            // SAFETY: a valid function handle; the value is within the device's limit.
            unsafe {
                result::function::set_function_attribute(
                    f.0,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
            }
            .map_err(|e| CudaError::driver("cuFuncSetAttribute", e))?;
        }
        Ok(k)
    }
}

impl Kernels {
    /// Distinct fake handles, for testing lowering without a device.
    #[cfg(test)]
    pub(crate) fn fake() -> Kernels {
        let mut n = 0usize;
        let mut f = || {
            n += 1;
            Func(n as sys::CUfunction)
        };
        Kernels {
            gemv: f(),
            gemv_typed: [f(), f(), f(), f(), f(), f(), f(), f()],
            gemv_q4_k_q6_k: f(),
            rms_norm_rows: f(),
            add_inplace: f(),
            swiglu: f(),
            add_bias_rows: f(),
            f32_to_bf16: f(),
            copy_f32: f(),
            split_plane: f(),
            synth_blocks: f(),
            embed_rows: f(),
            dequant_bf16: f(),
            rope_rows: f(),
            kv_store: f(),
            rope_qk_store: f(),
            attn_decode_split_64: f(),
            attn_decode_split_128: f(),
            attn_decode_reduce: f(),
            attn_prefill_64: f(),
            attn_prefill_128: f(),
            modules: Vec::new(),
        }
    }
}

impl Kernels {
    /// The GEMV kernel for a launch whose segments have `types`: specialized when they
    /// are one type or Q4_K with Q6_K, else the generic one.
    pub fn gemv_for(&self, types: &[ds4_gguf::GgmlType]) -> Func {
        use ds4_gguf::GgmlType::{Q4_K, Q6_K};
        let first = types[0];
        if types.iter().all(|&t| t == first)
            && let Some(i) = MATRIX_TYPES.iter().position(|&t| t == first)
        {
            return self.gemv_typed[i];
        }
        if types.iter().all(|&t| t == Q4_K || t == Q6_K) {
            return self.gemv_q4_k_q6_k;
        }
        self.gemv
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        for m in &self.modules {
            // SAFETY: modules loaded in `load`; no kernel of them runs after the backend drops.
            let _ = unsafe { result::module::unload(m.0) };
        }
    }
}

