//! llama.cpp's own outputs (`tests/data/llamacpp_vocab_cases.json`, see its README) for
//! special-token parsing, BOS/EOS insertion and detokenization on the 8 fixture
//! vocabularies.

use ds4_gguf::GgufFile;
use ds4_tokenizer::Tokenizer;
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn opt(v: &Value) -> Option<u32> {
    v.as_i64().filter(|&i| i >= 0).map(|i| i as u32)
}

#[test]
fn special_parsing_and_detokenization_match_llama_cpp() {
    let Some(dir) = ds4_testkit::fixture("tokenizer") else {
        return;
    };
    let data: Value = serde_json::from_str(include_str!("data/llamacpp_vocab_cases.json")).unwrap();
    let cases: Vec<&str> = data["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, want) in data["vocabs"].as_object().unwrap() {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        assert_eq!(tok.bos(), opt(&want["bos"]), "{name}: bos");
        assert_eq!(tok.eos(), opt(&want["eos"]), "{name}: eos");
        assert_eq!(tok.eot(), opt(&want["eot"]), "{name}: eot");
        assert_eq!(
            tok.add_bos(),
            want["add_bos"].as_bool().unwrap(),
            "{name}: add_bos"
        );
        assert_eq!(
            tok.add_eos(),
            want["add_eos"].as_bool().unwrap(),
            "{name}: add_eos"
        );
        let eog: Vec<u32> = tok.eog_ids().iter().copied().collect();
        assert_eq!(eog, ids(&want["eog"]), "{name}: eog");
        for (text, r) in cases.iter().zip(want["results"].as_array().unwrap()) {
            let special = ids(&r["special"]);
            let text_of = |b: Vec<u8>| String::from_utf8(b).unwrap();
            let got = [
                (
                    "plain",
                    format!("{:?}", tok.encode(text, false, false)),
                    format!("{:?}", ids(&r["plain"])),
                ),
                (
                    "special",
                    format!("{:?}", tok.encode(text, true, true)),
                    format!("{special:?}"),
                ),
                (
                    "detok",
                    text_of(tok.detokenize(&special, false, false)),
                    r["detok"].as_str().unwrap().to_owned(),
                ),
                (
                    "detok_special",
                    text_of(tok.detokenize(&special, false, true)),
                    r["detok_special"].as_str().unwrap().to_owned(),
                ),
                (
                    "detok_strip",
                    text_of(tok.detokenize(&special, true, true)),
                    r["detok_strip"].as_str().unwrap().to_owned(),
                ),
            ];
            for (what, got, want) in got {
                checked += 1;
                if got != want {
                    failures.push(format!(
                        "{name} {what} {text:?}\n  want {want}\n   got {got}"
                    ));
                }
            }
        }
    }
    println!(
        "{} of {checked} llama.cpp outputs match",
        checked - failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
