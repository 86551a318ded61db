//! Files of other writers load and compute the same model: files of earlier versions of
//! our converter (architecture `glm5next`, the KDA head count always in
//! `kda.head_count`, `head_count_kv` = the head count for MLA layers, scalar SwiGLU
//! clamps, 3-D conv weights, `expert_shared_feed_forward_length`,
//! `expert_gating_func` 2, `nextn_predict_layers` 0), and llama.cpp's conventions for
//! absent keys (`swiglu_clamp_shexp` = `swiglu_clamp_exp`, `expert_gating_func` 0 =
//! sigmoid, MTP layers counted in `block_count` and the per-layer arrays). Each variant
//! of the `real_layout` file must give bit-identical prefill logits.

use ds4_convert::OutType;
use ds4_gguf::{GgufFile, GgufWriter, Value};

use super::*;

/// The real_layout f32 file of our converter, rewritten: `meta` edits the metadata
/// (name, value) list, `dims` may change a tensor's ggml dims.
fn rewritten(
    meta: impl Fn(&mut Vec<(String, Value)>),
    dims: impl Fn(&str, &mut Vec<u64>),
) -> Vec<u8> {
    let src =
        GgufFile::from_bytes(gguf_bytes(&dir("real_layout_f32"), OutType::F32, None)).unwrap();
    let mut kv: Vec<(String, Value)> = src
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
        let mut d = t.dims.clone();
        dims(&t.name, &mut d);
        w.add_tensor(t.name.clone(), &d, t.dtype, src.tensor_data(t).to_vec())
            .unwrap();
    }
    w.to_bytes()
}

fn prefill(bytes: Vec<u8>) -> Vec<f32> {
    let m = load(bytes);
    let g = golden(&dir("real_layout_f32"));
    let mut cache = m.new_cache(4096).unwrap();
    let mut out = Vec::new();
    m.forward(&mut *cache, &g.prompt, Logits::All, &mut out)
        .unwrap();
    out
}

fn set(kv: &mut [(String, Value)], key: &str, v: Value) {
    kv.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

#[test]
fn earlier_glm5next_files_compute_the_same() {
    let base = prefill(rewritten(|_| {}, |_, _| {}));
    let legacy = rewritten(
        |kv| {
            for (k, v) in kv.iter_mut() {
                if let Some(rest) = k.strip_prefix("glm5-next.") {
                    *k = format!("glm5next.{rest}");
                }
                if k == "general.architecture" {
                    *v = Value::String("glm5next".into());
                }
            }
            kv.retain(|(k, _)| k != "general.type" && k != "general.size_label");
            let hkv = (0..8)
                .map(|i| Value::U32(if i % 4 == 3 { 4 } else { 0 }))
                .collect();
            set(kv, "glm5next.attention.head_count_kv", Value::Array(hkv));
            set(kv, "glm5next.swiglu_clamp_exp", Value::F32(2.0));
            set(kv, "glm5next.swiglu_clamp_shexp", Value::F32(2.0));
            for (k, v) in [
                ("kda.head_count", 4),
                ("expert_shared_feed_forward_length", 16),
                ("expert_gating_func", 2),
                ("nextn_predict_layers", 0),
            ] {
                kv.push((format!("glm5next.{k}"), Value::U32(v)));
            }
        },
        |name, d| {
            if name.contains(".ssm_conv1d_") {
                d.truncate(3);
            }
        },
    );
    let f = GgufFile::from_bytes(legacy.clone()).unwrap();
    assert_eq!(f.architecture().unwrap(), "glm5next");
    assert_eq!(
        f.tensor("blk.0.ssm_conv1d_q.weight").unwrap().dims,
        [4, 1, 48]
    );
    assert!(
        prefill(legacy) == base,
        "a glm5next file computes differently"
    );
}

#[test]
fn llamacpp_defaults_for_absent_keys() {
    let base = prefill(rewritten(|_| {}, |_, _| {}));
    // No swiglu_clamp_shexp: the shared expert and dense MLP take swiglu_clamp_exp.
    let no_shexp = rewritten(
        |kv| kv.retain(|(k, _)| k != "glm5-next.swiglu_clamp_shexp"),
        |_, _| {},
    );
    assert!(prefill(no_shexp) == base, "swiglu_clamp_shexp default");
    // expert_gating_func 0 (none) reads as sigmoid, as in llama.cpp.
    let gating0 = rewritten(
        |kv| kv.push(("glm5-next.expert_gating_func".into(), Value::U32(0))),
        |_, _| {},
    );
    assert!(prefill(gating0) == base, "expert_gating_func 0");
    // A converted MTP layer: block_count 9 with nextn_predict_layers 1, per-layer arrays
    // of 9 entries; the trunk is the first 8 layers (the MTP layer's tensors are not read).
    let mtp = rewritten(
        |kv| {
            set(kv, "glm5-next.block_count", Value::U32(9));
            kv.push(("glm5-next.nextn_predict_layers".into(), Value::U32(1)));
            for k in [
                "glm5-next.attention.head_count_kv",
                "glm5-next.attention.indexer.types",
                "glm5-next.swiglu_clamp_exp",
                "glm5-next.swiglu_clamp_shexp",
            ] {
                let e = kv.iter_mut().find(|(n, _)| n == k).unwrap();
                let Value::Array(a) = &mut e.1 else {
                    panic!("{k} is not an array")
                };
                a.push(a[3].clone());
            }
        },
        |_, _| {},
    );
    let m = load(mtp.clone());
    assert_eq!(m.config().n_layer(), 8);
    assert!(prefill(mtp) == base, "nextn_predict_layers");
}
