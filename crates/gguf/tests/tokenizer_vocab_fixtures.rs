//! The vocabulary-only GGUFs of `fixtures/tokenizer` (copied from llama.cpp): zero tensors,
//! metadata only. Expected values are the fixture README's table.

use ds4_gguf::{GgufFile, Value};

/// (NAME, tokenizer.ggml.model, tokenizer.ggml.pre, number of tokens), from the README.
const VOCABS: [(&str, &str, &str, usize); 8] = [
    ("qwen2", "gpt2", "qwen2", 151936),
    ("qwen35", "gpt2", "qwen35", 151936),
    ("gpt-2", "gpt2", "gpt-2", 50257),
    ("llama-bpe", "gpt2", "llama-bpe", 128256),
    ("deepseek-llm", "gpt2", "deepseek-llm", 102400),
    ("deepseek-coder", "gpt2", "deepseek-coder", 32256),
    ("llama-spm", "llama", "default", 32000),
    ("starcoder", "gpt2", "starcoder", 49152),
];

#[test]
fn every_vocab_gguf_opens_with_its_pre_tokenizer() {
    let Some(dir) = ds4_testkit::fixture("tokenizer") else {
        return;
    };
    for (name, model, pre, n_tokens) in VOCABS {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(file.version(), 3, "{name}");
        assert!(file.tensors().is_empty(), "{name}");
        assert_eq!(
            file.get_str("tokenizer.ggml.model").unwrap(),
            model,
            "{name}"
        );
        assert_eq!(file.get_str("tokenizer.ggml.pre").unwrap(), pre, "{name}");
        let tokens = file.get_arr_str("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.len(), n_tokens, "{name}");
        let types = file
            .get_as::<Vec<i32>>("tokenizer.ggml.token_type")
            .unwrap();
        assert_eq!(types.len(), n_tokens, "{name}");
    }
}

#[test]
fn vocab_metadata_has_expected_shapes() {
    let Some(dir) = ds4_testkit::fixture("tokenizer") else {
        return;
    };
    // SentencePiece vocabularies carry scores; BPE ones carry merges.
    let spm = GgufFile::open(&dir.join("ggml-vocab-llama-spm.gguf")).unwrap();
    let scores = spm.get_as::<Vec<f32>>("tokenizer.ggml.scores").unwrap();
    assert_eq!(scores.len(), 32000);
    let tokens = spm.get_arr_str("tokenizer.ggml.tokens").unwrap();
    // Llama 2's vocabulary starts with <unk>, <s>, </s> and the byte tokens.
    assert_eq!(&tokens[..4], ["<unk>", "<s>", "</s>", "<0x00>"]);

    let gpt2 = GgufFile::open(&dir.join("ggml-vocab-gpt-2.gguf")).unwrap();
    assert!(matches!(
        gpt2.get("tokenizer.ggml.merges"),
        Some(Value::Array(m)) if !m.is_empty()
    ));
    // GPT-2's byte-level vocabulary starts with "!" (byte 0x21).
    assert_eq!(gpt2.get_arr_str("tokenizer.ggml.tokens").unwrap()[0], "!");
}
