//! The two development models of `fixtures/llamacpp` (in the model cache of
//! `ds4-server pull`, located by `ds4_testkit`: a failure under CI when absent, a visible
//! skip elsewhere). Tensor counts per type are the
//! fixture README's; offsets, sizes, data sha256 and values were read with gguf-py 0.19.0
//! (an independent reader); the chat-template sha256 is the fixture JSON's.

use std::collections::BTreeMap;
use std::time::Instant;

use ds4_gguf::{GgmlType, GgufFile};
use sha2::{Digest, Sha256};

fn open(file: &str) -> Option<GgufFile> {
    let path = ds4_testkit::model(file)?;
    let start = Instant::now();
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let elapsed = start.elapsed();
    eprintln!("{file}: opened in {:.1} ms", elapsed.as_secs_f64() * 1e3);
    // Parsing is metadata-only (a few MB); tensor data is mapped, not read.
    assert!(elapsed.as_secs_f64() < 5.0, "opening took {elapsed:?}");
    Some(gguf)
}

fn type_counts(file: &GgufFile) -> BTreeMap<GgmlType, usize> {
    let mut counts = BTreeMap::new();
    for t in file.tensors() {
        *counts.entry(t.dtype).or_default() += 1;
    }
    counts
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// (name, dims, type, offset in the data section, bytes, sha256 of the data)
type Expected<'a> = (&'a str, &'a [u64], GgmlType, u64, u64, &'a str);

fn check_tensors(file: &GgufFile, expected: &[Expected]) {
    for &(name, dims, dtype, offset, n_bytes, digest) in expected {
        let t = file.require_tensor(name).unwrap();
        assert_eq!(
            (t.dims.as_slice(), t.dtype, t.offset, t.n_bytes()),
            (dims, dtype, offset, n_bytes),
            "{name}"
        );
        assert_eq!(sha256(file.tensor_data(t)), digest, "{name}");
    }
}

#[test]
fn qwen2_5_coder_0_5b_q4_k_m() {
    let Some(file) = open("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    assert_eq!(file.tensors().len(), 291);
    let expected = BTreeMap::from([
        (GgmlType::Q5_0, 133),
        (GgmlType::Q8_0, 13),
        (GgmlType::Q6_K, 12),
        (GgmlType::Q4_K, 12),
        (GgmlType::F32, 121),
    ]);
    assert_eq!(type_counts(&file), expected);
    assert_eq!(file.metadata().len(), 26);
    assert_eq!(file.data_offset(), 5_947_776);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.architecture().unwrap(), "qwen2");
    assert_eq!(
        file.get_str("general.name").unwrap(),
        "Qwen2.5 Coder 0.5B Instruct AWQ"
    );
    assert_eq!(file.get_u32("qwen2.block_count").unwrap(), 24);
    assert_eq!(file.get_u32("qwen2.attention.head_count_kv").unwrap(), 2);
    assert_eq!(file.get_f32("qwen2.rope.freq_base").unwrap(), 1_000_000.0);
    assert!(!file.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    let keys: Vec<&str> = file.metadata().keys().collect();
    assert_eq!(keys.first(), Some(&"general.architecture"));
    assert_eq!(keys.last(), Some(&"general.quantization_version"));

    let tokens = file.get_arr_str("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 151_936);
    assert_eq!((tokens[0], tokens[151_935]), ("!", "[PAD151935]"));
    let merges = file.get_arr_str("tokenizer.ggml.merges").unwrap();
    assert_eq!((merges.len(), merges[0]), (151_387, "Ġ Ġ"));
    assert_eq!(
        sha256(file.get_str("tokenizer.chat_template").unwrap().as_bytes()),
        "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f"
    );

    check_tensors(
        &file,
        &[
            (
                "output.weight",
                &[896, 151936],
                GgmlType::Q8_0,
                0,
                144_643_072,
                "bdbf9edb1641bd85a1c1dc99f84714ddacea35c51702a2ba7f20c65a435d1862",
            ),
            (
                "token_embd.weight",
                &[896, 151936],
                GgmlType::Q5_0,
                144_643_072,
                93_592_576,
                "22a92081cc6f706df447fb36101ea0a36c98a10c893818c08c3a4541efdce365",
            ),
            (
                "blk.23.ffn_down.weight",
                &[4864, 896],
                GgmlType::Q4_K,
                401_881_344,
                2_451_456,
                "ca9761c1ed6322d790d4ff1442d56f874debaf9371907317f074dde9c310f7af",
            ),
            (
                "output_norm.weight",
                &[896],
                GgmlType::F32,
                485_448_704,
                3584,
                "f8fa0ac93ef31395f0a899e6f56c3c0f8feb6eb6a62f1eb1991c4c4c1cda32d7",
            ),
        ],
    );
    let bias = file.require_tensor("blk.0.attn_q.bias").unwrap();
    let bias = file.tensor_as::<f32>(bias).unwrap();
    assert_eq!(bias.len(), 896);
    assert_eq!(&bias[..3], [-0.029_907_227, -0.007_934_57, -0.085_449_22]);
}

#[test]
fn smollm2_135m_q4_1() {
    let Some(file) = open("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    assert_eq!(file.tensors().len(), 272);
    let expected = BTreeMap::from([
        (GgmlType::Q4_1, 210),
        (GgmlType::F32, 61),
        (GgmlType::Q8_0, 1),
    ]);
    assert_eq!(type_counts(&file), expected);
    // The embedding is tied: no output.weight, token_embd.weight is the Q8_0 tensor.
    assert!(file.tensor("output.weight").is_none());
    assert_eq!(file.metadata().len(), 33);
    assert_eq!(file.data_offset(), 1_785_664);
    assert_eq!(file.architecture().unwrap(), "llama");
    assert_eq!(file.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(file.get_usize("llama.vocab_size").unwrap(), 49152);
    assert_eq!(file.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        file.get_arr_str("general.languages").unwrap().len(),
        1,
        "general.languages"
    );
    let tokens = file.get_arr_str("tokenizer.ggml.tokens").unwrap();
    assert_eq!((tokens[0], tokens[49_151]), ("<|endoftext|>", "ectable"));
    assert_eq!(
        sha256(file.get_str("tokenizer.chat_template").unwrap().as_bytes()),
        "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788"
    );
    check_tensors(
        &file,
        &[
            (
                "token_embd.weight",
                &[576, 49152],
                GgmlType::Q8_0,
                0,
                30_081_024,
                "0d728edd2a012d1663a6069567240d124c752bab88b6fcbe1a985eae428193c3",
            ),
            (
                "blk.29.ffn_down.weight",
                &[1536, 576],
                GgmlType::Q4_1,
                78_845_184,
                552_960,
                "390f8753cf01dc755e66063a8d1cce91b31d41f34f59c11f03d6eb5145dbbf40",
            ),
        ],
    );
    let norm = file.require_tensor("output_norm.weight").unwrap();
    assert_eq!(
        &file.tensor_as::<f32>(norm).unwrap()[..3],
        [1.757_812_5, 1.820_312_5, 1.781_25]
    );
    // Asking for the wrong element type is an error, not a reinterpretation.
    let embd = file.require_tensor("token_embd.weight").unwrap();
    assert!(file.tensor_as::<f32>(embd).is_err());
}
