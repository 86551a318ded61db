//! ggml's tiled K-quant kernels (llama.cpp's default since they were added; off in the
//! llama.cpp of the fixtures), enabled for this test binary with `DS4_GGML_TILED=1`:
//! whole products against ggml, bit for bit.

mod common;

use common::check;
use ds4_quant::GgmlType;

fn tiled(name: &str, ty: GgmlType) {
    // SAFETY: every test of this binary sets the same value before any product reads it.
    unsafe { std::env::set_var("DS4_GGML_TILED", "1") };
    check(name, ty, ".tiled");
}

#[test]
fn q2_k() {
    tiled("q2_k", GgmlType::Q2_K);
}

#[test]
fn q3_k() {
    tiled("q3_k", GgmlType::Q3_K);
}

#[test]
fn q4_k() {
    tiled("q4_k", GgmlType::Q4_K);
}

#[test]
fn q5_k() {
    tiled("q5_k", GgmlType::Q5_K);
}

#[test]
fn q6_k() {
    tiled("q6_k", GgmlType::Q6_K);
}

#[test]
fn iq2_xxs() {
    tiled("iq2_xxs", GgmlType::IQ2_XXS);
}
