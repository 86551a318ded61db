//! A checkpoint with a Hugging Face `tokenizer.json` converts to a GGUF that the normal
//! loading path (`LoadedModel::open`, what `ds4-server run/chat/serve/bench` use) opens:
//! byte-level BPE vocabulary, GLM special tokens and end-of-generation set, the chat
//! template, and the model itself.

mod common;

use common::*;
use ds4_convert::{ConvertArgs, OutType};
use ds4_engine::LoadedModel;
use ds4_tokenizer::{ChatMessage, RenderOptions};

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

#[test]
fn hf_tokenizer_and_template_convert_and_load() {
    let fx = fixture("lowerbound_sparse_f32");
    let dir = std::env::temp_dir().join(format!("glm5_tok_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fx.join(f), dir.join(f)).unwrap();
    }
    // 256 byte tokens, merges for "he", "ll", "hell", "hello", then GLM's special tokens.
    let bc = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in bc.iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    let merges = ["h e", "l l", "he ll", "hell o"];
    for (k, m) in merges.iter().enumerate() {
        vocab.insert(m.replace(' ', ""), (256 + k).into());
    }
    let specials = [
        "<|endoftext|>",
        "[gMASK]",
        "<sop>",
        "<|system|>",
        "<|user|>",
        "<|assistant|>",
        "<|observation|>",
    ];
    let mut added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(k, t)| serde_json::json!({"id": 260 + k, "content": t, "special": true}))
        .collect();
    for (k, t) in ["<think>", "</think>", "<tool_call>", "</tool_call>"]
        .iter()
        .enumerate()
    {
        added.push(serde_json::json!({"id": 267 + k, "content": t, "special": false}));
    }
    let tok = serde_json::json!({"added_tokens": added, "model": {"type": "BPE", "vocab": vocab, "merges": merges}});
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let template = include_str!("../../tokenizer/templates/glm5.jinja");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"chat_template": template}).to_string(),
    )
    .unwrap();

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
    assert_eq!(lm.model.info().architecture, "glm5-next");
    let t = &lm.tokenizer;
    assert_eq!(t.n_vocab(), 320);
    let ids = t.encode("hello hello", false, false);
    assert_eq!(ids[0], 259, "'hello' is one merged token: {ids:?}");
    assert_eq!(t.decode(&ids, false), "hello hello");
    for s in ["<|endoftext|>", "<|user|>", "<|observation|>"] {
        let id = t.encode(s, false, true);
        assert_eq!(id.len(), 1, "{s}");
        assert!(t.is_eog(id[0]), "{s} must end generation");
    }
    let (text, prompt) = lm
        .chat_prompt(
            &[ChatMessage::new("user", "hello")],
            &RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(text, "[gMASK]<sop><|user|>hello<|assistant|><think>");
    assert_eq!(&prompt[..4], &[261, 262, 264, 259]);
    // The model runs on the prompt through the generic session.
    let mut s = ds4_engine::Session::new(lm.model.clone(), 256).unwrap();
    let logits = s.prefill(&prompt, &mut |_, _| {}).unwrap();
    assert_eq!(logits.len(), 320);
    assert!(logits.iter().all(|v| v.is_finite()));
    std::fs::remove_dir_all(&dir).ok();
}
