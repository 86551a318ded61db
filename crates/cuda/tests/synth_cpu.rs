//! Synthetic models run on the CPU backend: every quant type of the small shapes loads,
//! and the logits are finite and spread out (random but valid weights, no saturation).
//! Needs no GPU.

use std::sync::Arc;

use ds4_cuda::parity::test_tokens;
use ds4_cuda::synth::dense::QUANTS;
use ds4_cuda::synth::{Spec, write_gguf};
use ds4_engine::Session;
use ds4_gguf::GgufFile;

#[test]
fn every_quant_runs_on_the_cpu_with_finite_spread_logits() {
    let dir = std::env::temp_dir().join(format!("ds4-synth-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (q, _) in QUANTS {
        for shape in ["tiny-llama", "tiny-qwen2"] {
            let name = format!("{shape}:{q}");
            let spec = Spec::parse(&name).unwrap();
            let path = dir.join("m.gguf");
            write_gguf(&spec, &path).unwrap();
            let file = Arc::new(GgufFile::open(&path).unwrap());
            let model = ds4_engine::loader::load_model(&file, &path).unwrap();
            assert_eq!(model.info().n_vocab, spec.n_vocab());
            let mut s = Session::new(model.clone(), 16).unwrap();
            let toks = test_tokens(6, spec.n_vocab(), 3);
            let l = s.prefill(&toks, &mut |_, _| {}).unwrap().to_vec();
            assert!(l.iter().all(|v| v.is_finite()), "{name}: non-finite logits");
            let mean = l.iter().map(|&v| v as f64).sum::<f64>() / l.len() as f64;
            let sd =
                (l.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / l.len() as f64).sqrt();
            assert!(sd > 0.05 && sd < 100.0, "{name}: logits sd {sd}");
            eprintln!("{name}: logits sd {sd:.3}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_cpu_backend_is_within_int8_activation_noise_of_the_f64_reference() {
    let dir = std::env::temp_dir().join(format!("ds4-synth-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["tiny-llama:q4_0", "tiny-llama:q6_k", "tiny-qwen2:q4_k_m"] {
        let spec = Spec::parse(name).unwrap();
        let path = dir.join("m.gguf");
        write_gguf(&spec, &path).unwrap();
        let file = Arc::new(GgufFile::open(&path).unwrap());
        let model = ds4_engine::loader::load_model(&file, &path).unwrap();
        let toks = test_tokens(8, spec.n_vocab(), 5);
        let mut s = Session::new(model, 16).unwrap();
        let cpu = s.forward_all(&toks).unwrap();
        let reference = ds4_cuda::reference::logits(&file, &toks).unwrap();
        for (i, r) in reference.iter().enumerate() {
            let d = ds4_cuda::parity::row_diff(&cpu[i * r.len()..(i + 1) * r.len()], r);
            // Int8 activations cost about 1e-2 of the logits here (docs/parity.md); a
            // wrong graph (RoPE pairs, GQA mapping, norms) costs far more.
            assert!(d.nrmse < 0.05, "{name} row {i}: nrmse {}", d.nrmse);
            eprintln!("{name} row {i}: cpu vs f64 reference nrmse {:.2e}", d.nrmse);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tiny_glm5_runs_on_the_cpu_with_finite_spread_logits() {
    // GLM-5.3-Flash's structure (KDA, MLA + DSA indexer, dense then MoE layers, mHC) at
    // hidden 256: prefill past the indexer's top-k (32), then decode.
    moe_runs_on_the_cpu("tiny-glm5:q2", 40);
}

#[test]
fn tiny_deepseek4_runs_on_the_cpu_with_finite_spread_logits() {
    // DeepSeek-V4-Flash's structure (sliding, CSA with the indexer, HCA; hash then score
    // routing; mHC) at hidden 256: prefill past the window (16) and the indexer's top-k
    // (8 entries of 4 tokens), then decode.
    moe_runs_on_the_cpu("tiny-deepseek4:q2", 60);
}

/// A synthetic MoE model written to a file and run on the CPU: a prompt of `n_prompt`
/// tokens, then three decode steps; every logits row finite and spread out.
fn moe_runs_on_the_cpu(name: &str, n_prompt: usize) {
    let dir = std::env::temp_dir().join(format!(
        "ds4-synth-{}-{}",
        name.replace(':', "-"),
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = Spec::parse(name).unwrap();
    let path = dir.join("m.gguf");
    write_gguf(&spec, &path).unwrap();
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let model = ds4_engine::loader::load_model(&file, &path).unwrap();
    assert_eq!(model.info().n_vocab, spec.n_vocab());
    let mut s = Session::new(model, 128).unwrap();
    let toks = test_tokens(n_prompt, spec.n_vocab(), 9);
    let mut rows = vec![s.prefill(&toks, &mut |_, _| {}).unwrap().to_vec()];
    for t in [5, 77, 300] {
        rows.push(s.decode(t).unwrap().to_vec());
    }
    for (i, l) in rows.iter().enumerate() {
        assert!(
            l.iter().all(|v| v.is_finite()),
            "{name} row {i}: non-finite logits"
        );
        let mean = l.iter().map(|&v| v as f64).sum::<f64>() / l.len() as f64;
        let sd =
            (l.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / l.len() as f64).sqrt();
        assert!(sd > 0.05 && sd < 100.0, "{name} row {i}: logits sd {sd}");
        eprintln!("{name} row {i}: logits sd {sd:.3}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn deepseek4_flash_header_is_a_valid_deepseek4_config() {
    // The whole model's keys and tensor directory (the header file of `bench
    // --synthetic deepseek4-flash:q2`: the device's tensors a sparse hole) through the
    // family's own parser and checks.
    use ds4_engine::families::deepseek4::config::{AttnKind, Config, Dtype};
    let spec = Spec::parse("deepseek4-flash:q2").unwrap();
    let file = ds4_cuda::synth::header_file(&spec).unwrap();
    let hp = ds4_engine::loader::Hparams::new(&file).unwrap();
    let c = Config::from_gguf(&hp, spec.n_vocab(), Dtype::F32).unwrap();
    assert_eq!((c.n_layer(), c.n_head, c.head_dim), (43, 64, 512));
    assert_eq!((c.sliding_window, c.index_topk), (128, 512));
    let csa = c
        .layers
        .iter()
        .filter(|l| matches!(l.0, AttnKind::Csa { rate: 4 }))
        .count();
    let hca = c
        .layers
        .iter()
        .filter(|l| matches!(l.0, AttnKind::Hca { rate: 128 }))
        .count();
    assert_eq!((csa, hca), (21, 20));
    assert_eq!(
        c.layers.iter().filter(|l| l.1).count(),
        3,
        "hash-routed layers"
    );
}
