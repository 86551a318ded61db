//! The kernel functions of every module, loaded once per device from the CUBINs that
//! [`crate::compile`] produces.

use std::ffi::CString;

use cudarc::driver::{result, sys};

use crate::compile::{SOURCES, cubin};
use crate::driver::{Func, Gpu};
use crate::error::{CudaError, Result};
use ds4_gguf::GgmlType;

/// Every kernel the backend launches.
pub struct Kernels {
    /// The GEMV reading weights straight from global memory: 8 warps, 2 blocks per SM;
    /// any mix of weight types in one launch.
    pub gemv: Func,
    /// The same for launches whose matrices are all of one type, with fewer registers
    /// and more blocks per SM: `gemv_typed[GEMV_TYPES index][pair]`
    /// (`gemv_<type>[_pair]` in kernels/gemv.cu).
    pub gemv_typed: [[Func; 2]; 9],
    /// Expert kernels holding one weight type's registers: `experts_typed[GEMV_TYPES
    /// index]` = `[gate_up, down, down_sum]` (`gemv_experts_*_<type>`); see
    /// [`Kernels::experts_for`].
    pub experts_typed: [[Func; 3]; 9],
    pub rms_norm_rows: Func,
    pub rms_norm_store: Func,
    pub add_inplace: Func,
    pub swiglu: Func,
    pub add_bias_rows: Func,
    pub f32_to_bf16: Func,
    pub copy_f32: Func,
    pub split_plane: Func,
    pub synth_blocks: Func,
    pub synth_floats: Func,
    pub embed_rows: Func,
    pub dequant_bf16: Func,
    pub rope_rows: Func,
    pub rope_torch: Func,
    pub rope_torch_store: Func,
    pub kv_store: Func,
    pub rope_qk_store: Func,
    pub attn_decode_split_64: Func,
    pub attn_decode_split_128: Func,
    pub attn_decode_reduce: Func,
    /// RoPE, KV store, split-K attention and merge of one decode token in one launch.
    pub attn_decode_fused_64: Func,
    pub attn_decode_fused_128: Func,
    pub attn_prefill_64: Func,
    pub attn_prefill_128: Func,
    /// The MoE families' kernels (see each module's header).
    pub gemv_experts_gate_up: Func,
    pub gemv_experts_down: Func,
    pub gemv_float: Func,
    pub gemv_float_multi: Func,
    pub gemv_float_experts: Func,
    pub rms_norm_ref: Func,
    pub rms_norm_rope: Func,
    pub layer_norm_ref: Func,
    pub gated_norm: Func,
    pub moe_route: Func,
    pub moe_reduce: Func,
    /// The greedy choice of a step, kept on the device (`Backend::pick`).
    pub greedy_pick: Func,
    pub router_route: Func,
    pub gemv_experts_down_sum: Func,
    pub moe_sort: Func,
    pub moe_mma_gate_up: Func,
    pub moe_mma_down: Func,
    /// `[gate_up, down]` tensor-core expert kernels for IQ2_XXS and Q2_K weights
    /// (`MMA_TYPES`).
    pub moe_mma_typed: [[Func; 2]; 2],
    pub hc_rms: Func,
    pub hc_mixes: Func,
    pub hc_pre_finish: Func,
    pub hc_pre_one: Func,
    pub hc_post_pre: Func,
    pub hc_sinkhorn: Func,
    pub hc_post: Func,
    pub hc_head: Func,
    pub delta_conv: Func,
    pub delta_inputs: Func,
    pub delta_conv_state: Func,
    pub delta_recurrent_16: Func,
    pub delta_recurrent_32: Func,
    pub delta_recurrent_64: Func,
    pub delta_recurrent_128: Func,
    pub delta_replay_conv: Func,
    pub delta_replay_16: Func,
    pub delta_replay_32: Func,
    pub delta_replay_64: Func,
    pub delta_replay_128: Func,
    pub delta_step: Func,
    /// Dynamic shared memory `delta_step` may use (the limit [`Kernels::load`] sets).
    pub delta_step_smem: usize,
    /// The dynamic shared memory `mla_attend` may use (bytes).
    pub mla_attend_smem: usize,
    pub store_rows: Func,
    pub compress_windows: Func,
    pub dsa_scores: Func,
    pub dsa_topk: Func,
    pub mla_attend: Func,
    pub mla_expand: Func,
    pub mla_softmax: Func,
    pub sink_scores: Func,
    pub sink_mix: Func,
    pub to_f32: Func,
    pub fill_f32: Func,
    pub swiglu_ref: Func,
    pub add_round: Func,
    pub scale_sigmoid: Func,
    pub embed_streams: Func,
    modules: Vec<Module>,
}

struct Module(sys::CUmodule);
// SAFETY: module handles are used only to unload on drop.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

/// The weight types with typed GEMV kernels and their kernel-name stems.
pub const GEMV_TYPES: [(GgmlType, &str); 9] = [
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q5_K, "q5_k"),
    (GgmlType::Q6_K, "q6_k"),
    (GgmlType::IQ2_XXS, "iq2_xxs"),
    (GgmlType::Q2_K, "q2_k"),
];

/// The weight types with typed tensor-core expert kernels (`moe_mma_typed`, the q2 mix).
pub const MMA_TYPES: [GgmlType; 2] = [GgmlType::IQ2_XXS, GgmlType::Q2_K];

/// Largest dynamic shared memory the GEMV may use (its activation: ~2.6 bytes per input),
/// and `delta_step` (a head's state).
pub const GEMV_MAX_SMEM: u32 = 200 * 1024;

impl Kernels {
    /// The expert kernels `[gate_up, down, down_sum]` for weights of ggml type `ty`: the
    /// typed ones when `typed` and the type has them, else those for any type.
    pub fn experts_for(&self, ty: u32, typed: bool) -> [Func; 3] {
        let t = GEMV_TYPES.iter().position(|&(g, _)| g as u32 == ty);
        match t {
            Some(t) if typed => self.experts_typed[t],
            _ => [
                self.gemv_experts_gate_up,
                self.gemv_experts_down,
                self.gemv_experts_down_sum,
            ],
        }
    }

    /// The tensor-core expert kernel (`DOWN`: down, else the gate/up pair) for weights
    /// of ggml type `ty`: the typed one when the type has one, else the one for any type.
    pub fn moe_mma_for<const DOWN: bool>(&self, ty: u32) -> Func {
        match MMA_TYPES.iter().position(|&g| g as u32 == ty) {
            Some(t) => self.moe_mma_typed[t][DOWN as usize],
            None if DOWN => self.moe_mma_down,
            None => self.moe_mma_gate_up,
        }
    }

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
            funcs.get(n).copied().ok_or_else(|| {
                CudaError::Unsupported(format!("kernel {n} missing from the sources"))
            })
        };
        let mut gemv_typed = [[Func(std::ptr::null_mut()); 2]; 9];
        for (t, (_, stem)) in GEMV_TYPES.iter().enumerate() {
            gemv_typed[t] = [
                get(&format!("gemv_{stem}"))?,
                get(&format!("gemv_{stem}_pair"))?,
            ];
        }
        let mut experts_typed = [[Func(std::ptr::null_mut()); 3]; 9];
        for (t, (_, stem)) in GEMV_TYPES.iter().enumerate() {
            experts_typed[t] = [
                get(&format!("gemv_experts_gate_up_{stem}"))?,
                get(&format!("gemv_experts_down_{stem}"))?,
                get(&format!("gemv_experts_down_sum_{stem}"))?,
            ];
        }
        let mut k = Kernels {
            gemv: get("gemv")?,
            gemv_typed,
            experts_typed,
            rms_norm_rows: get("rms_norm_rows")?,
            rms_norm_store: get("rms_norm_store")?,
            add_inplace: get("add_inplace")?,
            swiglu: get("swiglu")?,
            add_bias_rows: get("add_bias_rows")?,
            f32_to_bf16: get("f32_to_bf16")?,
            copy_f32: get("copy_f32")?,
            split_plane: get("split_plane")?,
            synth_blocks: get("synth_blocks")?,
            synth_floats: get("synth_floats")?,
            embed_rows: get("embed_rows")?,
            dequant_bf16: get("dequant_bf16")?,
            rope_rows: get("rope_rows")?,
            rope_torch: get("rope_torch")?,
            rope_torch_store: get("rope_torch_store")?,
            kv_store: get("kv_store")?,
            rope_qk_store: get("rope_qk_store")?,
            attn_decode_split_64: get("attn_decode_split_64")?,
            attn_decode_split_128: get("attn_decode_split_128")?,
            attn_decode_reduce: get("attn_decode_reduce")?,
            attn_decode_fused_64: get("attn_decode_fused_64")?,
            attn_decode_fused_128: get("attn_decode_fused_128")?,
            attn_prefill_64: get("attn_prefill_64")?,
            attn_prefill_128: get("attn_prefill_128")?,
            gemv_experts_gate_up: get("gemv_experts_gate_up")?,
            gemv_experts_down: get("gemv_experts_down")?,
            gemv_float: get("gemv_float")?,
            gemv_float_multi: get("gemv_float_multi")?,
            gemv_float_experts: get("gemv_float_experts")?,
            rms_norm_ref: get("rms_norm_ref")?,
            rms_norm_rope: get("rms_norm_rope")?,
            layer_norm_ref: get("layer_norm_ref")?,
            gated_norm: get("gated_norm")?,
            moe_route: get("moe_route")?,
            moe_reduce: get("moe_reduce")?,
            greedy_pick: get("greedy_pick")?,
            router_route: get("router_route")?,
            gemv_experts_down_sum: get("gemv_experts_down_sum")?,
            moe_sort: get("moe_sort")?,
            moe_mma_gate_up: get("moe_mma_gate_up")?,
            moe_mma_down: get("moe_mma_down")?,
            moe_mma_typed: [
                [
                    get("moe_mma_gate_up_iq2_xxs")?,
                    get("moe_mma_down_iq2_xxs")?,
                ],
                [get("moe_mma_gate_up_q2_k")?, get("moe_mma_down_q2_k")?],
            ],
            hc_rms: get("hc_rms")?,
            hc_mixes: get("hc_mixes")?,
            hc_pre_finish: get("hc_pre_finish")?,
            hc_pre_one: get("hc_pre_one")?,
            hc_post_pre: get("hc_post_pre")?,
            hc_sinkhorn: get("hc_sinkhorn")?,
            hc_post: get("hc_post")?,
            hc_head: get("hc_head")?,
            delta_conv: get("delta_conv")?,
            delta_inputs: get("delta_inputs")?,
            delta_conv_state: get("delta_conv_state")?,
            delta_recurrent_16: get("delta_recurrent_16")?,
            delta_recurrent_32: get("delta_recurrent_32")?,
            delta_recurrent_64: get("delta_recurrent_64")?,
            delta_recurrent_128: get("delta_recurrent_128")?,
            delta_replay_conv: get("delta_replay_conv")?,
            delta_replay_16: get("delta_replay_16")?,
            delta_replay_32: get("delta_replay_32")?,
            delta_replay_64: get("delta_replay_64")?,
            delta_replay_128: get("delta_replay_128")?,
            delta_step: get("delta_step")?,
            delta_step_smem: 0,
            mla_attend_smem: 0,
            store_rows: get("store_rows")?,
            compress_windows: get("compress_windows")?,
            dsa_scores: get("dsa_scores")?,
            dsa_topk: get("dsa_topk")?,
            mla_attend: get("mla_attend")?,
            mla_expand: get("mla_expand")?,
            mla_softmax: get("mla_softmax")?,
            sink_scores: get("sink_scores")?,
            sink_mix: get("sink_mix")?,
            to_f32: get("to_f32")?,
            fill_f32: get("fill_f32")?,
            swiglu_ref: get("swiglu_ref")?,
            add_round: get("add_round")?,
            scale_sigmoid: get("scale_sigmoid")?,
            embed_streams: get("embed_streams")?,
            modules,
        };
        let optin = gpu.max_smem_optin as i32;
        // Lets `f` use up to GEMV_MAX_SMEM of dynamic shared memory, less where its static
        // and dynamic shared memory together would pass the device's opt-in limit (GPUs
        // before Hopper); returns the limit set.
        let allow = |f: Func| -> Result<i32> {
            // SAFETY: a valid function handle.
            let fixed = unsafe {
                result::function::get_function_attribute(
                    f.0,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                )
            }
            .map_err(|e| CudaError::driver("cuFuncGetAttribute", e))?;
            let smem = (GEMV_MAX_SMEM as i32).min(optin - fixed);
            // SAFETY: a valid function handle; the value is within the device's limit.
            unsafe {
                result::function::set_function_attribute(
                    f.0,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem,
                )
            }
            .map_err(|e| CudaError::driver("cuFuncSetAttribute", e))?;
            Ok(smem)
        };
        let typed = k.gemv_typed.iter().flatten();
        let experts = [
            &k.gemv_experts_gate_up,
            &k.gemv_experts_down,
            &k.gemv_experts_down_sum,
        ];
        let experts_typed = k.experts_typed.iter().flatten();
        for f in std::iter::once(&k.gemv)
            .chain(typed)
            .chain(experts)
            .chain(experts_typed)
        {
            allow(*f)?;
        }
        k.delta_step_smem = allow(k.delta_step)?.max(0) as usize;
        k.mla_attend_smem = allow(k.mla_attend)?.max(0) as usize;
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
            gemv_typed: std::array::from_fn(|_| [f(), f()]),
            experts_typed: std::array::from_fn(|_| [f(), f(), f()]),
            rms_norm_rows: f(),
            rms_norm_store: f(),
            add_inplace: f(),
            swiglu: f(),
            add_bias_rows: f(),
            f32_to_bf16: f(),
            copy_f32: f(),
            split_plane: f(),
            synth_blocks: f(),
            synth_floats: f(),
            embed_rows: f(),
            dequant_bf16: f(),
            rope_rows: f(),
            rope_torch: f(),
            rope_torch_store: f(),
            kv_store: f(),
            rope_qk_store: f(),
            attn_decode_split_64: f(),
            attn_decode_split_128: f(),
            attn_decode_reduce: f(),
            attn_decode_fused_64: f(),
            attn_decode_fused_128: f(),
            attn_prefill_64: f(),
            attn_prefill_128: f(),
            gemv_experts_gate_up: f(),
            gemv_experts_down: f(),
            gemv_float: f(),
            gemv_float_multi: f(),
            gemv_float_experts: f(),
            rms_norm_ref: f(),
            rms_norm_rope: f(),
            layer_norm_ref: f(),
            gated_norm: f(),
            moe_route: f(),
            moe_reduce: f(),
            greedy_pick: f(),
            router_route: f(),
            gemv_experts_down_sum: f(),
            moe_sort: f(),
            moe_mma_gate_up: f(),
            moe_mma_down: f(),
            moe_mma_typed: [[f(), f()], [f(), f()]],
            hc_rms: f(),
            hc_mixes: f(),
            hc_pre_finish: f(),
            hc_pre_one: f(),
            hc_post_pre: f(),
            hc_sinkhorn: f(),
            hc_post: f(),
            hc_head: f(),
            delta_conv: f(),
            delta_inputs: f(),
            delta_conv_state: f(),
            delta_recurrent_16: f(),
            delta_recurrent_32: f(),
            delta_recurrent_64: f(),
            delta_recurrent_128: f(),
            delta_replay_conv: f(),
            delta_replay_16: f(),
            delta_replay_32: f(),
            delta_replay_64: f(),
            delta_replay_128: f(),
            delta_step: f(),
            delta_step_smem: GEMV_MAX_SMEM as usize,
            mla_attend_smem: GEMV_MAX_SMEM as usize,
            store_rows: f(),
            compress_windows: f(),
            dsa_scores: f(),
            dsa_topk: f(),
            mla_attend: f(),
            mla_expand: f(),
            mla_softmax: f(),
            sink_scores: f(),
            sink_mix: f(),
            to_f32: f(),
            fill_f32: f(),
            swiglu_ref: f(),
            add_round: f(),
            scale_sigmoid: f(),
            embed_streams: f(),
            modules: Vec::new(),
        }
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

#[cfg(test)]
mod tests {
    use crate::compile::SOURCES;

    #[test]
    fn every_kernel_looked_up_is_declared_in_its_source() {
        let this = include_str!("kernels.rs");
        for part in this.split("get(\"").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            if name.is_empty() || name.contains(' ') {
                continue;
            }
            assert!(
                SOURCES.iter().any(|s| s.kernels.contains(&name)),
                "kernel {name} is not listed in compile::SOURCES"
            );
        }
    }
}
