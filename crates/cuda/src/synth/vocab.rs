//! Vocabularies of synthetic models, as `tokenizer.ggml.*` metadata: byte-level BPE
//! vocabularies of the model's size (GPT-2's byte-to-unicode map, so every byte string
//! tokenizes).

use ds4_gguf::Value;

/// GPT-2's byte-to-unicode map: the printable character standing for each byte in
/// byte-level BPE vocabularies.
pub fn byte_to_unicode() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        out[b as usize] = if printable(b as u8) {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("in range")
        };
    }
    out
}

/// Whether GPT-2's map keeps byte `b` as its own character.
fn printable(b: u8) -> bool {
    matches!(b, 33..=126 | 161..=172 | 174..=255)
}

/// The vocabulary of the dense synthetic models: the 256 byte tokens, then `ĠĠ` (two
/// spaces, the one merge), then distinct two- and three-byte filler strings, then BOS
/// and EOS (control tokens); `add_bos` as `tokenizer.ggml.add_bos_token`.
pub fn byte_level(n: usize, add_bos: bool) -> Vec<(String, Value)> {
    let bu = byte_to_unicode();
    let mut tokens: Vec<String> = bu.iter().map(|c| c.to_string()).collect();
    let space2 = format!("{0}{0}", bu[b' ' as usize]);
    tokens.push(space2.clone());
    let n_fill = n.saturating_sub(tokens.len() + 2);
    let mut i = 0usize;
    while tokens.len() < 257 + n_fill {
        let s: String = if i < 65536 {
            [bu[i >> 8], bu[i & 0xFF]].iter().collect()
        } else {
            let j = i - 65536;
            [bu[(j >> 16) & 0xFF], bu[(j >> 8) & 0xFF], bu[j & 0xFF]]
                .iter()
                .collect()
        };
        i += 1;
        if s != space2 {
            tokens.push(s);
        }
    }
    tokens.push("<|bos|>".into());
    tokens.push("<|eos|>".into());
    tokens.truncate(n);
    let types = (0..tokens.len())
        .map(|k| Value::I32(if k + 2 >= n { 3 } else { 1 }))
        .collect();
    let sp = bu[b' ' as usize];
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![Value::String(format!("{sp} {sp}"))]),
        ),
        (
            "tokenizer.ggml.bos_token_id".into(),
            Value::U32(n as u32 - 2),
        ),
        (
            "tokenizer.ggml.eos_token_id".into(),
            Value::U32(n as u32 - 1),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
    ]
}

/// `synth_gguf.py`'s minimal vocabulary (`tokenizer_minimal`): the 256 byte symbols
/// (printable bytes first, then the others, in GPT-2's order), `Ġt` (the one merge),
/// `<s>` and `</s>` (control, BOS and EOS), then unused `[PADi]` tokens up to `n`.
pub fn minimal(n: usize) -> Vec<(String, Value)> {
    let bu = byte_to_unicode();
    let bytes = (0..=255u8)
        .filter(|&b| printable(b))
        .chain((0..=255u8).filter(|&b| !printable(b)));
    let mut tokens: Vec<String> = bytes.map(|b| bu[b as usize].to_string()).collect();
    tokens.extend(["Ġt", "<s>", "</s>"].map(String::from));
    let mut types = vec![1; 257];
    types.extend([3, 3]);
    for i in tokens.len()..n {
        tokens.push(format!("[PAD{i}]"));
        types.push(5);
    }
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![Value::String("Ġ t".into())]),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(257)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(258)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        let bu = byte_to_unicode();
        assert_eq!(bu[b'a' as usize], 'a');
        assert_eq!(bu[b' ' as usize], 'Ġ');
        assert_eq!(bu[b'\n' as usize], 'Ċ');
        assert_eq!(bu[0], 'Ā');
        let mut all: Vec<char> = bu.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    fn tokens(md: &[(String, Value)]) -> Vec<&str> {
        let (_, v) = md
            .iter()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
            .unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect()
    }

    #[test]
    fn vocabularies_have_the_size_and_distinct_tokens() {
        for md in [
            byte_level(1536, true),
            byte_level(70000, false),
            minimal(1024),
        ] {
            let mut t = tokens(&md);
            let n = t.len();
            assert!(n == 1536 || n == 70000 || n == 1024);
            t.sort();
            t.dedup();
            assert_eq!(t.len(), n);
        }
    }

    #[test]
    fn the_minimal_vocabulary_is_synth_gguf_pys() {
        let md = minimal(300);
        let t = tokens(&md);
        assert_eq!(&t[..3], ["!", "\"", "#"]);
        assert_eq!(t[187], "ÿ");
        assert_eq!(t[188], "Ā");
        assert_eq!(t[188 + 32], "Ġ");
        assert_eq!(&t[256..260], ["Ġt", "<s>", "</s>", "[PAD259]"]);
    }
}
