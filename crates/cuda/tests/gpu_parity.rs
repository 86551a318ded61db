//! CUDA against the CPU backend on synthetic models (the same GGUF on both): logits of
//! prefill and decode within the tolerances of docs/parity.md, deterministic, greedy
//! continuations equal where the CPU's top-1/top-2 gap is comfortable.
//!
//! Skips with a message without a usable GPU, unless `DS4_REQUIRE_GPU=1`. The full
//! matrix of shapes and quant types runs in `scripts/gpu-check.sh`.

use std::sync::Arc;

use ds4_cuda::parity::{compare, test_tokens};
use ds4_cuda::synth::{Spec, write_gguf};
use ds4_cuda::{CudaBackend, gpu_available, load_model};
use ds4_gguf::GgufFile;

fn gpu() -> Option<Arc<CudaBackend>> {
    if let Err(why) = gpu_available() {
        let required = std::env::var("DS4_REQUIRE_GPU").is_ok_and(|v| v == "1");
        assert!(!required, "DS4_REQUIRE_GPU=1 but no usable GPU: {why}");
        eprintln!("skipped: no usable CUDA device ({why})");
        return None;
    }
    Some(Arc::new(CudaBackend::new(0).expect("device opens")))
}

#[test]
fn cuda_matches_cpu_on_synthetic_models() {
    let Some(backend) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("ds4-gpu-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["tiny-llama:q4_k_m", "tiny-qwen2:q8_0", "tiny-llama:iq2_xxs"] {
        let spec = Spec::parse(name).unwrap();
        let path = dir.join("m.gguf");
        write_gguf(&spec, &path).unwrap();
        let file = Arc::new(GgufFile::open(&path).unwrap());
        let cpu = ds4_engine::loader::load_model(&file, &path).unwrap();
        let cuda = load_model(backend.clone(), &file, &path).unwrap();
        let rep = compare(
            &cpu,
            &cuda,
            &test_tokens(40, spec.n_vocab(), 42),
            16,
            Some(&file),
        )
        .unwrap();
        assert!(rep.passes(), "{name}: {rep:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
