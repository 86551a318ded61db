//! A DeepSeek-V4 checkpoint with a Hugging Face `tokenizer.json` converts (`ds4-server
//! convert`) to a GGUF that the normal loading path (`LoadedModel::open`) opens:
//! byte-level BPE with DeepSeek-V3's pre-tokenizer and its BOS/EOS; llama.cpp's own file
//! of the fixture (with the tiny tokenizer its converter was given) opens the same way.

use std::path::PathBuf;

use ds4_convert::{ConvertArgs, OutType};
use ds4_engine::{LoadedModel, Logits};

/// The committed fixture folder `name` (a missing one is a failure).
fn fixture(name: &str) -> PathBuf {
    ds4_engine::fixtures::fixture("deepseek4", name)
}

/// GPT-2's byte-to-character table (bytes_to_unicode).
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap();
    }
    out
}

fn prompt_logits(lm: &LoadedModel, text: &str) -> Vec<f32> {
    let toks = lm.tokenize_rendered(text);
    let mut cache = lm.model.new_cache(256).unwrap();
    let mut out = Vec::new();
    lm.model
        .forward(&mut *cache, &toks, Logits::Last, &mut out)
        .unwrap();
    out
}

#[test]
fn hf_tokenizer_converts_and_loads() {
    let fx = fixture("small_rates_f32");
    let dir = std::env::temp_dir().join(format!("ds4_v4_tok_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fx.join(f), dir.join(f)).unwrap();
    }
    // Specials at 0 and 1 (the config's BOS/EOS), 256 byte tokens, merges for "hello".
    let bc = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in bc.iter().enumerate() {
        vocab.insert(c.to_string(), (2 + i).into());
    }
    let merges = ["h e", "l l", "he ll", "hell o"];
    for (k, m) in merges.iter().enumerate() {
        vocab.insert(m.replace(' ', ""), (258 + k).into());
    }
    let added = serde_json::json!([
        {"id": 0, "content": "<｜begin▁of▁sentence｜>", "special": true},
        {"id": 1, "content": "<｜end▁of▁sentence｜>", "special": true},
    ]);
    let tok = serde_json::json!({"added_tokens": added, "model": {"type": "BPE", "vocab": vocab, "merges": merges}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let out = dir.join("model.gguf");
    let args = ConvertArgs {
        input: Some(dir.clone()),
        output: out.clone(),
        outtype: OutType::F32,
        expert_type: None,
        mtp: false,
        vocab_from: None,
        name: None,
        synthetic: None,
        seed: 1,
    };
    let report = ds4_convert::run(&args).unwrap();
    assert!(report.unused.is_empty(), "{:?}", report.unused);
    let lm = LoadedModel::open(&out).unwrap();
    assert_eq!(lm.model.info().architecture, "deepseek4");
    assert_eq!(
        lm.gguf.get("tokenizer.ggml.pre").and_then(|v| v.as_str()),
        Some("deepseek-v3")
    );
    let t = &lm.tokenizer;
    assert_eq!(t.n_vocab(), 288);
    assert_eq!((t.bos(), t.add_bos()), (Some(0), true));
    let ids = lm.tokenize_rendered("hello");
    assert_eq!(ids, vec![0, 261], "BOS, then the merged 'hello'");
    assert!(
        prompt_logits(&lm, "hello hello")
            .iter()
            .all(|x| x.is_finite())
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn llamacpp_file_opens_through_the_normal_path() {
    for name in ["small_rates_f32", "real_layout_f32"] {
        let lm = LoadedModel::open(&fixture(name).join("llamacpp.gguf")).unwrap();
        assert_eq!(lm.model.info().architecture, "deepseek4");
        let logits = prompt_logits(&lm, "hello world");
        assert_eq!(logits.len(), lm.model.info().n_vocab);
        assert!(logits.iter().all(|x| x.is_finite()));
    }
}
