//! llama.cpp's `test-tokenizer-0` vectors (`fixtures/tokenizer/`): 8 vocabulary-only GGUFs,
//! every case tokenized with `add_special = false, parse_special = false`.

use ds4_gguf::GgufFile;
use ds4_tokenizer::Tokenizer;

const VOCABS: [&str; 8] = [
    "qwen2",
    "qwen35",
    "gpt-2",
    "llama-bpe",
    "deepseek-llm",
    "deepseek-coder",
    "llama-spm",
    "starcoder",
];

#[test]
fn every_fixture_case_matches_llama_cpp() {
    let Some(dir) = ds4_testkit::fixture("tokenizer") else {
        return;
    };
    let mut total = 0;
    let mut failures = Vec::new();
    for name in VOCABS {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let file = GgufFile::open(&path).unwrap();
        let started = std::time::Instant::now();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let load = started.elapsed();
        let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
        let mut cases: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        assert_eq!(
            cases.pop(),
            Some(""),
            "{name}: .inp must end with the separator"
        );
        let expected: Vec<Vec<u32>> = out
            .lines()
            .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
            .collect();
        assert_eq!(cases.len(), expected.len(), "{name}: case count");
        let started = std::time::Instant::now();
        for (text, want) in cases.iter().zip(&expected) {
            total += 1;
            let got = tok.encode(text, false, false);
            if &got != want {
                failures.push(format!(
                    "{name}: {text:?}\n   want {want:?}\n    got {got:?}"
                ));
            }
        }
        println!(
            "{name}: {} cases, load {:.1} ms, encode {:.2} ms",
            cases.len(),
            load.as_secs_f64() * 1e3,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    println!("{} of {total} cases match", total - failures.len());
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(total, 372);
}
