//! Our converter writes llama.cpp's `glm5-next` layout. The `real_layout` fixture's
//! checkpoint and tokenizer, converted by `ds4-convert` and by llama.cpp's own converter
//! (`real_layout_f32/llamacpp.gguf`, made by `tools/reference/llamacpp_convert.py` from
//! llama.cpp commit 0c1e5709), give the same metadata keys with the same value types and
//! values, the same tensor names, ggml shapes and types, and the same tensor values. For
//! the other output types, the tensor types llama.cpp's converter chose (recorded in the
//! fixture manifest, `llamacpp_gguf.tensor_types`) are ours too.
//!
//! Deliberate differences (docs/glm5_next_gguf.md): `general.name` (llama.cpp derives
//! it from the folder name with its own capitalisation), the order of keys and tensors,
//! and, in a bf16 file made from an f32 checkpoint, the values of the F32-stored tensors
//! the bf16 reference holds in bf16 (ours are rounded to bf16).

mod common;

use std::collections::BTreeMap;

use common::*;
use ds4_convert::{ConvertArgs, OutType};
use ds4_gguf::{GgmlType, GgufFile};

/// The real_layout fixture converted by `ds4-server convert` (tokenizer included).
fn ours(outtype: OutType) -> GgufFile {
    let dir = fixture("real_layout_f32");
    let out = std::env::temp_dir().join(format!(
        "glm5_llamacpp_{}_{outtype:?}.gguf",
        std::process::id()
    ));
    let args = ConvertArgs {
        input: Some(dir),
        output: out.clone(),
        outtype,
        expert_type: None,
        vocab_from: None,
        name: None,
        synthetic: None,
        seed: 1,
        mtp: false,
    };
    let report = ds4_convert::run(&args).unwrap();
    assert!(report.unused.is_empty(), "{:?}", report.unused);
    let f = GgufFile::from_bytes(std::fs::read(&out).unwrap()).unwrap();
    std::fs::remove_file(&out).ok();
    f
}

fn llamacpp() -> GgufFile {
    GgufFile::open(&fixture("real_layout_f32").join("llamacpp.gguf")).unwrap()
}

fn f32_values(f: &GgufFile, name: &str) -> Vec<f32> {
    let info = f.tensor(name).unwrap();
    assert_eq!(info.dtype, GgmlType::F32, "{name}");
    f.tensor_data(info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn f32_file_equals_llamacpp() {
    let (a, b) = (ours(OutType::F32), llamacpp());
    assert_eq!(a.architecture().unwrap(), "glm5-next");
    let keys = |f: &GgufFile| -> Vec<String> { f.metadata().keys().map(String::from).collect() };
    let (mut ka, mut kb) = (keys(&a), keys(&b));
    ka.sort();
    kb.sort();
    assert_eq!(ka, kb, "metadata keys");
    let mut compared = 0;
    for k in &ka {
        if k == "general.name" {
            continue;
        }
        assert_eq!(a.get(k), b.get(k), "metadata key {k}: ours vs llama.cpp's");
        compared += 1;
    }
    assert!(compared > 50, "{compared} keys compared");

    let tensors = |f: &GgufFile| -> BTreeMap<String, (Vec<u64>, GgmlType)> {
        f.tensors()
            .iter()
            .map(|t| (t.name.clone(), (t.dims.clone(), t.dtype)))
            .collect()
    };
    let (ta, tb) = (tensors(&a), tensors(&b));
    assert_eq!(
        ta.keys().collect::<Vec<_>>(),
        tb.keys().collect::<Vec<_>>(),
        "tensor names"
    );
    for (name, (dims, ty)) in &tb {
        assert_eq!(
            &ta[name],
            &(dims.clone(), *ty),
            "{name}: ggml dims and type"
        );
    }
    // Values: equal, except `ssm_a = −exp(A_log)`, where our exp and PyTorch's may
    // differ in the last bit.
    for name in tb.keys() {
        let (x, y) = (f32_values(&a, name), f32_values(&b, name));
        if name.ends_with(".ssm_a") {
            for (p, q) in x.iter().zip(&y) {
                assert!(
                    (p - q).abs() <= q.abs() * f32::EPSILON,
                    "{name}: {p} vs {q}"
                );
            }
        } else {
            assert!(x == y, "{name}: values differ from llama.cpp's");
        }
    }
    assert_eq!(ta.len(), 236);
}

/// The tensor types of llama.cpp's bf16 / f16 / q8_0 files (which tensors stay F32,
/// which rows fall back to F16) are ours.
#[test]
fn other_outtypes_have_llamacpp_tensor_types() {
    let m = manifest(&fixture("real_layout_f32"));
    let recorded = &m["llamacpp_gguf"]["tensor_types"];
    for (label, outtype) in [
        ("bf16", OutType::Bf16),
        ("f16", OutType::F16),
        ("q8_0", OutType::Q8_0),
    ] {
        let want = &recorded[label];
        let default = want["default"].as_str().unwrap();
        let f = ours(outtype);
        let mut n_other = 0;
        for t in f.tensors() {
            let expected = want["other"][&t.name].as_str().unwrap_or(default);
            n_other += usize::from(expected != default);
            assert!(
                t.dtype.name().eq_ignore_ascii_case(expected),
                "{label}: {} is {}, llama.cpp writes {expected}",
                t.name,
                t.dtype.name()
            );
        }
        assert_eq!(
            n_other,
            want["other"].as_object().unwrap().len(),
            "{label}: tensors llama.cpp writes that we do not"
        );
        assert_eq!(f.tensors().len(), 236, "{label}");
    }
}
