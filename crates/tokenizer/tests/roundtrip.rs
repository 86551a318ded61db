//! Property: for vocabularies without clean-up rules, decoding the tokens of any text gives
//! the text back (byte-level BPE covers every byte; SentencePiece falls back to byte
//! tokens and drops the space it prefixed). Also checks that streaming the pieces through
//! `StreamDecoder` gives the same text.

use ds4_gguf::GgufFile;
use ds4_tokenizer::{StreamDecoder, Tokenizer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The fixture vocabulary `name`, or `None` (a failure under CI) before any case runs.
fn load(name: &str) -> Option<Tokenizer> {
    let path = ds4_testkit::fixture(&format!("tokenizer/ggml-vocab-{name}.gguf"))?;
    Some(Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap())
}

/// Text without special-token strings: letters of several scripts, digits, punctuation,
/// white space of several kinds, emoji.
fn text() -> impl Strategy<Value = String> {
    proptest::string::string_regex(
        "[a-zA-Z0-9 \t\n\r.,!?'\"()\\-éßΩжव中한😀\u{0301}\u{00A0}\u{3000}]{0,40}",
    )
    .unwrap()
}

fn round_trip(tok: &Tokenizer, s: &str) {
    let ids = tok.encode(s, false, false);
    assert_eq!(tok.decode(&ids, false), s);
    let mut stream = StreamDecoder::new();
    let mut streamed: String = ids
        .iter()
        .map(|&id| stream.push(&tok.piece(id, false)))
        .collect();
    streamed += &stream.flush();
    if tok.bos().is_some() && !s.is_empty() && tok.kind() == ds4_tokenizer::VocabKind::Spm {
        // SentencePiece pieces keep the prefixed space that `decode` drops.
        assert_eq!(streamed, format!(" {s}"));
    } else {
        assert_eq!(streamed, s);
    }
}

/// 300 random texts round-trip through vocabulary `name`.
fn round_trips(name: &str) {
    let Some(tok) = load(name) else {
        return;
    };
    let mut runner = TestRunner::new(Config::with_cases(300));
    runner
        .run(&text(), |s| {
            round_trip(&tok, &s);
            Ok(())
        })
        .unwrap();
}

#[test]
fn byte_level_bpe_round_trips() {
    round_trips("qwen2");
}

#[test]
fn sentencepiece_round_trips() {
    round_trips("llama-spm");
}

#[test]
fn tokenizer_and_template_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<ds4_tokenizer::ChatTemplate>();
}
