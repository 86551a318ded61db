//! The DeepSeek-V4 converter against llama.cpp's: for both f32 fixtures
//! (`crates/engine/tests/fixtures/deepseek4/*_f32/`), our `--outtype f32` conversion of
//! the checkpoint has exactly the keys (values included) and tensors (names, shapes,
//! types, values) of `llamacpp.gguf`, which llama.cpp's own converter wrote from the
//! same checkpoint; the family is picked from `config.json`, and an unknown one is
//! named. (The engine's tests replay both files against the reference.)

use std::path::PathBuf;

use ds4_convert::{Family, Options, OutType};
use ds4_gguf::{GgmlType, GgufFile, GgufWriter, Value};

fn fixture(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/fixtures/deepseek4")
        .join(name);
    assert!(
        p.join("manifest.json").exists(),
        "fixture {} is missing",
        p.display()
    );
    p
}

fn ours(dir: &std::path::Path, outtype: OutType) -> GgufFile {
    let mut w = GgufWriter::new();
    let opts = Options {
        outtype,
        expert_type: None,
        name: "fixture".into(),
    };
    let report = ds4_convert::convert_dir(dir, &opts, &mut w).unwrap();
    assert!(report.unused.is_empty(), "unused: {:?}", report.unused);
    assert!(
        report.fallbacks.is_empty(),
        "fallbacks: {:?}",
        report.fallbacks
    );
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

/// Values of a tensor (MXFP4 dequantized, I32 as integers).
fn values(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    let data = f.tensor_data(t);
    if t.dtype == GgmlType::I32 {
        return data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
            .collect();
    }
    let cols = t.dims[0] as usize;
    let rb = t.row_bytes().unwrap() as usize;
    let mut out = vec![0f32; t.n_elements() as usize];
    for (o, r) in out.chunks_exact_mut(cols).zip(data.chunks_exact(rb)) {
        ds4_quant::dequantize_row(t.dtype, r, o).unwrap();
    }
    out
}

fn same_as_llamacpp(name: &str) {
    let dir = fixture(name);
    let ours = ours(&dir, OutType::F32);
    let theirs = GgufFile::open(&dir.join("llamacpp.gguf")).unwrap();
    // Keys: every llama.cpp key of the architecture, with the same value and type.
    let keys = |f: &GgufFile| -> Vec<(String, Value)> {
        let mut v: Vec<(String, Value)> = f
            .metadata()
            .iter()
            .filter(|(k, _)| {
                k.starts_with("deepseek4.")
                    || *k == "general.architecture"
                    || *k == "general.file_type"
                    || *k == "general.quantization_version"
            })
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let (ko, kt) = (keys(&ours), keys(&theirs));
    let names = |v: &[(String, Value)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&ko), names(&kt), "{name}: key sets differ");
    for ((k, a), (_, b)) in ko.iter().zip(&kt) {
        assert_eq!(a, b, "{name}: key {k}");
    }
    // Tensors: names, shapes, types, values.
    let mut to: Vec<&str> = ours.tensors().iter().map(|t| t.name.as_str()).collect();
    let mut tt: Vec<&str> = theirs.tensors().iter().map(|t| t.name.as_str()).collect();
    to.sort_unstable();
    tt.sort_unstable();
    assert_eq!(to, tt, "{name}: tensor sets differ");
    let mut mxfp4_bytes_equal = 0;
    for t in theirs.tensors() {
        let o = ours.tensor(&t.name).unwrap();
        assert_eq!(o.dims, t.dims, "{name}: {} dims", t.name);
        assert_eq!(o.dtype, t.dtype, "{name}: {} type", t.name);
        let (a, b) = (values(&ours, &t.name), values(&theirs, &t.name));
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}: {} values differ",
            t.name
        );
        if t.dtype == GgmlType::MXFP4 && ours.tensor_data(o) == theirs.tensor_data(t) {
            mxfp4_bytes_equal += 1;
        }
    }
    // ggml's MXFP4 quantizer picks DeepSeek's exponent for e2m1-exact blocks: the
    // bytes agree too.
    assert_eq!(mxfp4_bytes_equal, 15, "{name}: MXFP4 bytes");
    eprintln!(
        "{name}: {} keys, {} tensors identical to llama.cpp's",
        ko.len(),
        tt.len()
    );
}

#[test]
fn small_rates_equals_llamacpp() {
    same_as_llamacpp("small_rates_f32");
}

#[test]
fn real_layout_equals_llamacpp() {
    same_as_llamacpp("real_layout_f32");
}

#[test]
fn family_comes_from_config() {
    let text = std::fs::read_to_string(fixture("small_rates_f32").join("config.json")).unwrap();
    assert_eq!(Family::detect(&text).unwrap(), Family::DeepSeekV4);
    let e =
        Family::detect(r#"{"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]}"#)
            .unwrap_err()
            .to_string();
    assert!(
        e.contains("qwen3_moe") && e.contains("Qwen3MoeForCausalLM") && e.contains("deepseek_v4"),
        "{e}"
    );
    // A DeepSeek-V4 folder no longer gets GLM's error about `layer_types`.
    let tmp = std::env::temp_dir().join(format!("ds4_convert_family_{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(
        tmp.join("config.json"),
        text.replace("\"sliding_attention\"", "\"full_attention\""),
    )
    .unwrap();
    std::fs::copy(
        fixture("small_rates_f32").join("model.safetensors"),
        tmp.join("model.safetensors"),
    )
    .unwrap();
    let opts = Options {
        outtype: OutType::F32,
        expert_type: None,
        name: "x".into(),
    };
    let e = ds4_convert::convert_dir(&tmp, &opts, &mut GgufWriter::new())
        .unwrap_err()
        .to_string();
    std::fs::remove_dir_all(&tmp).ok();
    assert!(e.contains("layer 2") && e.contains("full_attention"), "{e}");
}
