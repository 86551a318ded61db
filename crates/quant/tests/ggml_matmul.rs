//! Whole matrix products against ggml's CPU backend, bit for bit: for every weight type,
//! with and without repacking where ggml repacks, and for every token count that changes
//! ggml's choice of kernel; checked multi-threaded, single-threaded and by row ranges.
//! ggml's tiled K-quant kernels are off here, as in the llama.cpp that recorded the
//! fixtures (see `ggml_matmul_tiled.rs` for them).

mod common;

use common::check;
use ds4_quant::GgmlType;

macro_rules! ggml_case {
    ($test:ident, $name:literal, $ty:ident, $variant:literal) => {
        #[test]
        fn $test() {
            check($name, GgmlType::$ty, $variant);
        }
    };
}

ggml_case!(q4_0, "q4_0", Q4_0, "");
ggml_case!(q4_0_repacked, "q4_0", Q4_0, ".repack");
ggml_case!(q4_1, "q4_1", Q4_1, "");
ggml_case!(q5_0, "q5_0", Q5_0, "");
ggml_case!(q5_1, "q5_1", Q5_1, "");
ggml_case!(q8_0, "q8_0", Q8_0, "");
ggml_case!(q2_k, "q2_k", Q2_K, "");
ggml_case!(q2_k_repacked, "q2_k", Q2_K, ".repack");
ggml_case!(q3_k, "q3_k", Q3_K, "");
ggml_case!(q4_k, "q4_k", Q4_K, "");
ggml_case!(q4_k_repacked, "q4_k", Q4_K, ".repack");
ggml_case!(q5_k, "q5_k", Q5_K, "");
ggml_case!(q6_k, "q6_k", Q6_K, "");
ggml_case!(iq2_xxs, "iq2_xxs", IQ2_XXS, "");
ggml_case!(mxfp4, "mxfp4", MXFP4, "");
ggml_case!(mxfp4_repacked, "mxfp4", MXFP4, ".repack");
ggml_case!(f32, "f32", F32, "");
ggml_case!(f16, "f16", F16, "");
ggml_case!(bf16, "bf16", BF16, "");
ggml_case!(odd_q4_0, "odd/q4_0", Q4_0, "");
ggml_case!(odd_q8_0, "odd/q8_0", Q8_0, "");
ggml_case!(odd_q5_1, "odd/q5_1", Q5_1, "");
ggml_case!(odd_mxfp4, "odd/mxfp4", MXFP4, "");
ggml_case!(odd_f32, "odd/f32", F32, "");
ggml_case!(odd_f16, "odd/f16", F16, "");
ggml_case!(odd_bf16, "odd/bf16", BF16, "");
