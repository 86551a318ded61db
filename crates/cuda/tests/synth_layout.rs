//! Our `glm53-flash:q2` and `deepseek4-flash:q2` are the files
//! `../shared/tools/synth_gguf.py --shape glm53-flash` / `--shape deepseek4-flash` writes
//! (llama.cpp's `glm5-next` and `deepseek4` layouts): for each window of the fixtures
//! (`tests/fixtures/synth_{glm53,deepseek4}_flash.json`, made by
//! `tools/synth-layout/make_fixture.py` from the script's own planner and writer), the
//! same header bytes (metadata and tensor directory), the same keys, value types and
//! values, tensor names, dims and types, and the same weight and decode-read bytes.

use ds4_cuda::synth::{Spec, header_bytes};
use ds4_gguf::Value;
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

const GLM: &str = include_str!("fixtures/synth_glm53_flash.json");
const DEEPSEEK4: &str = include_str!("fixtures/synth_deepseek4_flash.json");

/// gguf-py's type name of a value (`UINT32`, `ARRAY[INT32]`, …).
fn type_name(v: &Value) -> String {
    match v {
        Value::U32(_) => "UINT32".into(),
        Value::I32(_) => "INT32".into(),
        Value::F32(_) => "FLOAT32".into(),
        Value::Bool(_) => "BOOL".into(),
        Value::String(_) => "STRING".into(),
        Value::Array(a) => format!("ARRAY[{}]", a.first().map_or("?".into(), type_name)),
        other => format!("{other:?}"),
    }
}

/// A value as the fixture records it (arrays of more than 64 values as their length).
fn as_json(v: &Value) -> Json {
    match v {
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        Value::Array(a) if a.len() > 64 => json!({ "len": a.len() }),
        Value::Array(a) => Json::Array(a.iter().map(as_json).collect()),
        other => panic!("unexpected value {other:?}"),
    }
}

/// Whether our value equals the fixture's (floats as the f32 they were written as).
fn same(ours: &Json, theirs: &Json) -> bool {
    match (ours, theirs) {
        (Json::Number(a), Json::Number(b)) => {
            a.as_f64().map(|x| x as f32) == b.as_f64().map(|x| x as f32)
        }
        (Json::Array(a), Json::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        _ => ours == theirs,
    }
}

#[test]
fn glm53_flash_q2_is_synth_gguf_pys_file() {
    same_as_script("glm53-flash:q2", GLM);
}

#[test]
fn deepseek4_flash_q2_is_synth_gguf_pys_file() {
    same_as_script("deepseek4-flash:q2", DEEPSEEK4);
}

/// Every window of the fixture `json` against our `name` cut to the same layers.
fn same_as_script(name: &str, json: &str) {
    let fixture: Json = serde_json::from_str(json).unwrap();
    let base = Spec::parse(name).unwrap();
    for w in fixture["windows"].as_array().unwrap() {
        let (first, layers) = (
            w["first_layer"].as_u64().unwrap(),
            w["layers"].as_u64().unwrap(),
        );
        let at = format!("{name} layers {first}..{}", first + layers - 1);
        let spec = base.window(first as usize, Some(layers as usize)).unwrap();
        let tensors = spec.tensors();
        assert_eq!(
            tensors.len() as u64,
            w["n_tensors"].as_u64().unwrap(),
            "{at}"
        );
        assert_eq!(
            spec.weight_bytes(),
            w["weight_bytes"].as_u64().unwrap(),
            "{at}"
        );
        assert_eq!(
            spec.decode_bytes(),
            w["decode_bytes"].as_u64().unwrap(),
            "{at}"
        );
        if let Some(expected) = w["tensors"].as_array() {
            for (t, e) in tensors.iter().zip(expected) {
                let dims: Vec<u64> = e[1]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .collect();
                assert_eq!(t.name, e[0].as_str().unwrap(), "{at}");
                assert_eq!(t.dims, dims, "{at}: {}", t.name);
                assert_eq!(
                    t.ty.name().to_ascii_uppercase(),
                    e[2].as_str().unwrap(),
                    "{at}: {}",
                    t.name
                );
            }
        }
        if let Some(expected) = w["metadata"].as_array() {
            let ours = spec.metadata();
            assert_eq!(ours.len(), expected.len(), "{at}");
            for ((k, v), e) in ours.iter().zip(expected) {
                assert_eq!(k, e[0].as_str().unwrap(), "{at}");
                assert_eq!(type_name(v), e[1].as_str().unwrap(), "{at}: {k}");
                assert!(
                    same(&as_json(v), &e[2]),
                    "{at}: {k} = {:?}, synth_gguf.py {}",
                    as_json(v),
                    e[2]
                );
            }
        }
        let header = header_bytes(&spec).unwrap();
        assert_eq!(
            header.len() as u64,
            w["header_len"].as_u64().unwrap(),
            "{at}"
        );
        let sha: String = Sha256::digest(&header)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            sha,
            w["header_sha256"].as_str().unwrap(),
            "{at}: header bytes differ"
        );
    }
}
