//! Bad input gives one clear error naming the key, tensor or layer at fault: an unknown
//! layer type, missing tensors, metadata that contradicts the tensors, values the
//! reference cannot run. Each case rewrites llama.cpp's file of the `small_rates`
//! fixture (layers CSA, HCA, sliding, CSA, HCA; hash routing in layers 0–1).

use ds4_gguf::{GgufWriter, Value};

use super::*;

/// The fixture's GGUF rewritten: `meta` edits the metadata, tensors named in `drop` are
/// left out, `edit` may replace a tensor's bytes; the load error's text.
fn load_err(
    meta: impl Fn(&mut GgufWriter),
    drop: &[&str],
    edit: impl Fn(&str, &mut Vec<u8>),
) -> String {
    load_err_without(&[], meta, drop, edit)
}

/// As [`load_err`], also leaving out the metadata keys `skip`.
fn load_err_without(
    skip: &[&str],
    meta: impl Fn(&mut GgufWriter),
    drop: &[&str],
    edit: impl Fn(&str, &mut Vec<u8>),
) -> String {
    let src = GgufFile::from_bytes(llamacpp_bytes(&dir("small_rates_f32"))).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        if !skip.contains(&k) {
            w.add_metadata(k, v.clone()).unwrap();
        }
    }
    meta(&mut w);
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
    match DeepSeek4::load(Arc::new(CpuBackend::new(1).unwrap()), &f, "bad".into()) {
        Ok(_) => panic!("loading must fail"),
        Err(e) => e.to_string(),
    }
}

fn expect(e: &str, needles: &[&str]) {
    for n in needles {
        assert!(e.contains(n), "error {e:?} should mention {n:?}");
    }
}

fn ratios(v: &[i32]) -> Value {
    Value::Array(v.iter().map(|&x| Value::I32(x)).collect())
}

fn set(k: &'static str, v: Value) -> impl Fn(&mut GgufWriter) {
    move |w: &mut GgufWriter| drop(w.set_metadata(k, v.clone()))
}

#[test]
fn unknown_layer_type() {
    let e = load_err(
        set(
            "deepseek4.attention.compress_ratios",
            ratios(&[4, -1, 0, 4, 16, 0]),
        ),
        &[],
        |_, _| {},
    );
    expect(&e, &["layer 1", "unknown layer type", "compress_ratios[1]"]);
}

#[test]
fn missing_tensors_are_named() {
    expect(
        &load_err(|_| {}, &["blk.2.attn_q_b.weight"], |_, _| {}),
        &["blk.2.attn_q_b.weight", "missing"],
    );
    expect(
        &load_err(|_| {}, &["output_hc_fn.weight"], |_, _| {}),
        &["output_hc_fn.weight", "missing"],
    );
    expect(
        &load_err(|_| {}, &["blk.1.ffn_gate_tid2eid.weight"], |_, _| {}),
        &["blk.1.ffn_gate_tid2eid.weight", "missing"],
    );
    expect(
        &load_err(|_| {}, &["blk.3.indexer.proj.weight"], |_, _| {}),
        &["blk.3.indexer.proj.weight", "missing", "CSA"],
    );
    expect(
        &load_err(|_| {}, &["blk.4.attn_compressor_ape.weight"], |_, _| {}),
        &["blk.4.attn_compressor_ape.weight", "missing"],
    );
}

#[test]
fn metadata_contradicting_tensors() {
    // A compressed rate for the sliding layer 2: its compressor is missing.
    let e = load_err(
        set(
            "deepseek4.attention.compress_ratios",
            ratios(&[4, 16, 4, 4, 16, 0]),
        ),
        &[],
        |_, _| {},
    );
    expect(&e, &["blk.2.attn_compressor_kv.weight", "missing"]);
    // Rate 0 for the CSA layer 0, which has compressor tensors.
    let e = load_err(
        set(
            "deepseek4.attention.compress_ratios",
            ratios(&[0, 16, 0, 4, 16, 0]),
        ),
        &[],
        |_, _| {},
    );
    expect(&e, &["layer 0", "compress_ratios[0] is 0", "compressor"]);
    // Three hash layers: layer 2 has a router bias and no table.
    let e = load_err(
        set("deepseek4.hash_layer_count", Value::U32(3)),
        &[],
        |_, _| {},
    );
    expect(&e, &["layer 2", "hash"]);
    // One hash layer: layer 1 still has its table.
    let e = load_err(
        set("deepseek4.hash_layer_count", Value::U32(1)),
        &[],
        |_, _| {},
    );
    expect(&e, &["blk.1.ffn_gate_tid2eid.weight", "hash_layer_count"]);
    // Sizes the tensors contradict.
    let e = load_err(
        set("deepseek4.attention.head_count", Value::U32(8)),
        &[],
        |_, _| {},
    );
    expect(&e, &["blk.0.", "shape"]);
    let e = load_err(
        set("deepseek4.attention.output_lora_rank", Value::U32(16)),
        &[],
        |_, _| {},
    );
    expect(&e, &["blk.0.attn_output_a.weight", "shape"]);
    let e = load_err(
        set("deepseek4.attention.value_length", Value::U32(16)),
        &[],
        |_, _| {},
    );
    expect(&e, &["deepseek4.attention.value_length", "key"]);
    let e = load_err(
        set("deepseek4.attention.compress_ratios", ratios(&[4, 16, 0])),
        &[],
        |_, _| {},
    );
    expect(
        &e,
        &[
            "deepseek4.attention.compress_ratios",
            "shorter than block_count",
        ],
    );
}

#[test]
fn values_the_reference_cannot_run() {
    let e = load_err(
        set("deepseek4.expert_gating_func", Value::U32(2)),
        &[],
        |_, _| {},
    );
    expect(&e, &["deepseek4.expert_gating_func", "sqrt(softplus)"]);
    let e = load_err(
        set("deepseek4.attention.output_group_count", Value::U32(3)),
        &[],
        |_, _| {},
    );
    expect(&e, &["deepseek4.attention.output_group_count", "divide"]);
    let e = load_err_without(
        &["deepseek4.attention.compress_rope_freq_base"],
        |_| {},
        &[],
        |_, _| {},
    );
    expect(&e, &["deepseek4.attention.compress_rope_freq_base"]);
    // A hash table routing a token to an expert that does not exist.
    let bad_id = |name: &str, b: &mut Vec<u8>| {
        if name == "blk.0.ffn_gate_tid2eid.weight" {
            b[8..12].copy_from_slice(&9i32.to_le_bytes());
        }
    };
    let e = load_err(|_| {}, &[], bad_id);
    expect(
        &e,
        &["blk.0.ffn_gate_tid2eid.weight", "token 1", "expert 9"],
    );
}
