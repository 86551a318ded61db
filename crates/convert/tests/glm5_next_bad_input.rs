//! Bad input gives clear errors: GGUF metadata that contradicts the tensor shapes (the
//! error names the key), the layout the reference cannot run (a `shared` indexer layer
//! after a KDA layer), missing tensors, a wrong sign convention, and the same problems
//! in a checkpoint handed to the converter.

mod common;

use std::sync::Arc;

use common::*;
use ds4_convert::glm5_next::ARCH;
use ds4_convert::source::{MemorySource, SafetensorsDir, TensorSource};
use ds4_convert::{ConvertArgs, Options, OutType, TextConfig};
use ds4_engine::backend::cpu::CpuBackend;
use ds4_engine::families::glm5_next::Glm5Next;
use ds4_gguf::{GgufFile, GgufWriter, Value};

/// The metadata of a file being rewritten, in order.
type Meta = Vec<(String, Value)>;

/// Sets `{ARCH}.k` to `v`.
fn set(m: &mut Meta, k: &str, v: Value) {
    let k = key(k);
    match m.iter_mut().find(|(n, _)| *n == k) {
        Some(e) => e.1 = v,
        None => m.push((k, v)),
    }
}

/// Removes `{ARCH}.k`.
fn remove(m: &mut Meta, k: &str) {
    let k = key(k);
    m.retain(|(n, _)| *n != k);
}

/// The fixture model as a GGUF, rewritten: `meta` edits the metadata, tensors named in
/// `drop` are left out, `edit` may replace a tensor's bytes.
fn rewritten(
    meta: impl Fn(&mut Meta),
    drop: &[&str],
    edit: impl Fn(&str, &mut Vec<u8>),
) -> Option<Result<Glm5Next<CpuBackend>, String>> {
    let dir = fixture("lowerbound_sparse_f32");
    let src = GgufFile::from_bytes(gguf_bytes(&dir, OutType::F32, None)).unwrap();
    let mut kv: Meta = src
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    meta(&mut kv);
    let mut w = GgufWriter::new();
    for (k, v) in kv {
        w.add_metadata(k, v).unwrap();
    }
    for t in src.tensors() {
        if drop.contains(&t.name.as_str()) {
            continue;
        }
        let mut bytes = src.tensor_data(t).to_vec();
        edit(&t.name, &mut bytes);
        w.add_tensor(t.name.clone(), &t.dims, t.dtype, bytes)
            .unwrap();
    }
    let f = Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
    let b = Arc::new(CpuBackend::new(1).unwrap());
    Some(Glm5Next::load(b, &f, "bad".into()).map_err(|e| e.to_string()))
}

fn expect_err(r: Option<Result<Glm5Next<CpuBackend>, String>>, needles: &[&str]) {
    let Some(r) = r else { return };
    let e = r.err().expect("loading must fail");
    for n in needles {
        assert!(e.contains(n), "error {e:?} should mention {n:?}");
    }
}

/// `{ARCH}.k`.
fn key(k: &str) -> String {
    format!("{ARCH}.{k}")
}

#[test]
fn metadata_contradicting_shapes() {
    expect_err(
        rewritten(
            |m| set(m, "attention.kv_lora_rank", Value::U32(32)),
            &[],
            |_, _| {},
        ),
        &["blk.1.attn_k_b.weight", "shape"],
    );
    expect_err(
        rewritten(|m| set(m, "kda.head_dim", Value::U32(8)), &[], |_, _| {}),
        &[&key("kda.head_dim"), "8 contradicts blk.0.ssm_f_a.weight"],
    );
    expect_err(
        rewritten(
            |m| set(m, "hyper_connection.count", Value::U32(2)),
            &[],
            |_, _| {},
        ),
        &["hc_attn_fn", "shape"],
    );
}

/// The fixture has 3 KDA heads and 4 attention heads, so its file carries
/// `kda.head_count`; without it the KDA head count is `attention.head_count` (llama.cpp's
/// reading), which the projections contradict: the error names the key, not a shape.
#[test]
fn kda_head_count_is_named() {
    let src = GgufFile::from_bytes(gguf_bytes(
        &fixture("lowerbound_sparse_f32"),
        OutType::F32,
        None,
    ))
    .unwrap();
    assert_eq!(src.get(&key("kda.head_count")), Some(&Value::U32(3)));
    assert_eq!(src.get(&key("attention.head_count")), Some(&Value::U32(4)));
    expect_err(
        rewritten(|m| remove(m, "kda.head_count"), &[], |_, _| {}),
        &[
            &key("kda.head_count"),
            "absent",
            &key("attention.head_count"),
            "blk.0.attn_q.weight has 48 rows = 3 heads × 16",
        ],
    );
    expect_err(
        rewritten(|m| set(m, "kda.head_count", Value::U32(2)), &[], |_, _| {}),
        &[
            &key("kda.head_count"),
            "2 contradicts blk.0.attn_q.weight: 48 rows = 3 heads",
        ],
    );
}

#[test]
fn shared_indexer_after_kda_is_rejected() {
    // Layer 3 (KDA) followed by layer 4 (MLA) made `shared`.
    let types = Value::Array(
        [true, true, false, true, false]
            .into_iter()
            .map(Value::Bool)
            .collect(),
    );
    expect_err(
        rewritten(
            |m| set(m, "attention.indexer.types", types.clone()),
            &[],
            |_, _| {},
        ),
        &["layer 4", "shared", "layer 3 is a KDA layer", "cannot run"],
    );
    // The converter refuses the same layout in config.json.
    let dir = fixture("lowerbound_sparse_f32");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let bad = text.replacen(
        "\"full\",\n      \"full\"\n    ]",
        "\"full\",\n      \"shared\"\n    ]",
        1,
    );
    assert_ne!(bad, text, "fixture config layout changed");
    let cfg = TextConfig::parse(&bad).unwrap();
    let src = SafetensorsDir::open(&dir).unwrap();
    let opts = Options {
        outtype: OutType::F32,
        expert_type: None,
        name: "x".into(),
    };
    let e = ds4_convert::glm5_next::convert(&src, &cfg, &opts, &mut GgufWriter::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer 4") && e.contains("shared"), "{e}");
}

#[test]
fn missing_tensors_are_named() {
    expect_err(
        rewritten(|_| {}, &["blk.2.attn_q_b.weight"], |_, _| {}),
        &["blk.2.attn_q_b.weight", "missing"],
    );
    expect_err(
        rewritten(|_| {}, &["output.weight"], |_, _| {}),
        &["output.weight"],
    );
    expect_err(
        rewritten(|_| {}, &["blk.0.ssm_conv1d_k.weight"], |_, _| {}),
        &["blk.0.ssm_conv1d_k.weight"],
    );
}

#[test]
fn ssm_a_sign_convention_is_checked() {
    // ssm_a must hold −exp(A_log): flip the sign bit of every value.
    let flip = |name: &str, b: &mut Vec<u8>| {
        if name == "blk.0.ssm_a" {
            for c in b.chunks_exact_mut(4) {
                c[3] ^= 0x80;
            }
        }
    };
    expect_err(rewritten(|_| {}, &[], flip), &["blk.0.ssm_a", "negative"]);
}

#[test]
fn converter_names_missing_and_misshaped_checkpoint_tensors() {
    let dir = fixture("lowerbound_sparse_f32");
    let cfg =
        TextConfig::parse(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let st = SafetensorsDir::open(&dir).unwrap();
    let mut mem = MemorySource::default();
    for n in st.names() {
        mem.tensors.insert(
            n.clone(),
            (st.shape(&n).unwrap(), st.read(&n).unwrap().unwrap()),
        );
    }
    let opts = Options {
        outtype: OutType::F32,
        expert_type: None,
        name: "x".into(),
    };
    let missing = "model.language_model.layers.1.self_attn.kv_b_proj.weight";
    let saved = mem.tensors.remove(missing).unwrap();
    let e = ds4_convert::glm5_next::convert(&mem, &cfg, &opts, &mut GgufWriter::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("layers.1.self_attn.kv_b_proj.weight") && e.contains("missing"),
        "{e}"
    );
    mem.tensors
        .insert(missing.into(), (vec![7, 40], saved.1[..280].to_vec()));
    let e = ds4_convert::glm5_next::convert(&mem, &cfg, &opts, &mut GgufWriter::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains(missing) && e.contains("shape"), "{e}");
}

/// The converter's own arguments: a `--vocab-from` GGUF whose tokens do not match the
/// checkpoint's vocabulary (288 against 256 embedding rows), and an output path that is
/// a file of the checkpoint (writing it would destroy the input), are refused by name
/// before anything is written.
#[test]
fn converter_refuses_a_foreign_vocabulary_and_writing_over_its_input() {
    let dir = fixture("softplus_dense_f32");
    let out = std::env::temp_dir().join(format!("glm5_vocab_{}.gguf", std::process::id()));
    let args = |output: std::path::PathBuf, vocab_from: Option<std::path::PathBuf>| ConvertArgs {
        input: Some(dir.clone()),
        output,
        outtype: OutType::F32,
        expert_type: None,
        vocab_from,
        name: None,
        synthetic: None,
        seed: 1,
        mtp: false,
    };
    let foreign = fixture("real_layout_f32").join("llamacpp.gguf");
    let e = ds4_convert::run(&args(out.clone(), Some(foreign))).unwrap_err();
    assert!(
        e.to_string()
            .contains("288 tokens, but the checkpoint's vocabulary has 256"),
        "{e}"
    );
    assert!(!out.exists(), "nothing written");
    let weights = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    let before = std::fs::metadata(&weights).unwrap().len();
    let e = ds4_convert::run(&args(weights.clone(), None)).unwrap_err();
    assert!(
        e.to_string()
            .contains("a file of the checkpoint being converted"),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&weights).unwrap().len(), before);
}
