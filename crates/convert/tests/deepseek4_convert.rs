//! The DeepSeek-V4 converter against llama.cpp's: for both f32 fixtures
//! (`crates/engine/tests/fixtures/deepseek4/*_f32/`), our `--outtype f32` conversion of
//! the checkpoint has exactly the keys (values included) and tensors (names, shapes,
//! types, values) of `llamacpp.gguf`, which llama.cpp's own converter wrote from the
//! same checkpoint; the family is picked from `config.json`, and an unknown one is
//! named. (The engine's tests replay both files against the reference.)

use std::path::PathBuf;

use ds4_convert::source::{MemorySource, Raw, SafetensorsDir, TensorSource};
use ds4_convert::{Family, Options, OutType};
use ds4_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use safetensors::Dtype;

/// The committed fixture folder `name` (a missing one is a failure).
fn fixture(name: &str) -> PathBuf {
    ds4_engine::fixtures::fixture("deepseek4", name)
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

/// The small_rates checkpoint in memory.
fn memory(dir: &std::path::Path) -> (ds4_convert::deepseek4::Config, MemorySource) {
    let cfg = ds4_convert::deepseek4::Config::parse(
        &std::fs::read_to_string(dir.join("config.json")).unwrap(),
    )
    .unwrap();
    let st = SafetensorsDir::open(dir).unwrap();
    let mut mem = MemorySource::default();
    for n in st.names() {
        mem.tensors.insert(
            n.clone(),
            (st.shape(&n).unwrap(), st.read(&n).unwrap().unwrap()),
        );
    }
    (cfg, mem)
}

fn convert_mem(
    cfg: &ds4_convert::deepseek4::Config,
    mem: &MemorySource,
    mtp: bool,
) -> Result<Vec<u8>, String> {
    let mut w = GgufWriter::new();
    let opts = ds4_convert::deepseek4::Options {
        outtype: OutType::F32,
        expert_type: None,
        name: "x".into(),
        mtp,
    };
    let r = ds4_convert::deepseek4::convert(mem, cfg, &opts, &mut w).map_err(|e| e.to_string())?;
    assert!(r.unused.is_empty(), "unused: {:?}", r.unused);
    Ok(w.to_bytes())
}

/// An FP8 e4m3fn byte's value (finite codes).
fn e4m3_val(b: u8) -> f32 {
    let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 15) as i32;
    let m = (b & 7) as f32;
    s * if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// The nearest FP8 e4m3fn code of `x` (finite, |x| ≤ 448).
fn e4m3_code(x: f32) -> u8 {
    (0..=255u8)
        .filter(|&b| b & 0x7f != 0x7f)
        .min_by(|&a, &b| (e4m3_val(a) - x).abs().total_cmp(&(e4m3_val(b) - x).abs()))
        .unwrap()
}

/// The published checkpoint's formats: routed experts in DeepSeek's FP4 (codes + E8M0
/// scales) and a matrix in FP8 with 128×128-block E8M0 scales convert to exactly what
/// their float values convert to (the experts repacked bit for bit).
#[test]
fn fp4_experts_and_fp8_matrices_convert_like_their_values() {
    let dir = fixture("small_rates_f32");
    let (cfg, mut mem) = memory(&dir);
    let float_ref = GgufFile::from_bytes(convert_mem(&cfg, &mem, false).unwrap()).unwrap();
    // FP4: every expert of layer 0, from ggml's MXFP4 blocks back to DeepSeek's packing.
    let mut packed_count = 0;
    for name in mem.tensors.keys().cloned().collect::<Vec<_>>() {
        if !name.starts_with("layers.0.ffn.experts.") {
            continue;
        }
        let (shape, v) = mem.tensors.remove(&name).unwrap();
        let (rows, cols) = (shape[0], shape[1]);
        let mut codes = vec![0u8; rows * cols / 2];
        let mut scales = vec![0u8; rows * cols / 32];
        for r in 0..rows {
            let mut blk = vec![0u8; cols / 32 * 17];
            ds4_quant::quantize_row(GgmlType::MXFP4, &v[r * cols..(r + 1) * cols], &mut blk)
                .unwrap();
            for b in 0..cols / 32 {
                let q = &blk[b * 17..(b + 1) * 17];
                scales[r * cols / 32 + b] = q[0];
                for j in 0..32 {
                    let c = if j < 16 {
                        q[1 + j] & 15
                    } else {
                        q[1 + j - 16] >> 4
                    };
                    let k = r * cols + b * 32 + j;
                    codes[k / 2] |= if k % 2 == 0 { c } else { c << 4 };
                }
            }
        }
        let stem = name.strip_suffix(".weight").unwrap();
        mem.raw.insert(
            name.clone(),
            Raw {
                dtype: Dtype::U8,
                shape: vec![rows, cols / 2],
                bytes: codes,
            },
        );
        mem.raw.insert(
            format!("{stem}.scale"),
            Raw {
                dtype: Dtype::U8,
                shape: vec![rows, cols / 32],
                bytes: scales,
            },
        );
        packed_count += 1;
    }
    assert_eq!(packed_count, 18);
    // FP8: layer 1's wq_b [128, 48]: one 128×128 block, scale 2^-6.
    let name = "layers.1.attn.wq_b.weight";
    let (shape, v) = mem.tensors.remove(name).unwrap();
    let scale = 2f32.powi(-6);
    let codes: Vec<u8> = v.iter().map(|&x| e4m3_code(x / scale)).collect();
    mem.raw.insert(
        name.into(),
        Raw {
            dtype: Dtype::F8_E4M3,
            shape: shape.clone(),
            bytes: codes.clone(),
        },
    );
    mem.raw.insert(
        "layers.1.attn.wq_b.scale".into(),
        Raw {
            dtype: Dtype::F8_E8M0,
            shape: vec![1, 1],
            bytes: vec![127 - 6],
        },
    );
    let ours = GgufFile::from_bytes(convert_mem(&cfg, &mem, false).unwrap()).unwrap();
    for t in float_ref.tensors() {
        let o = ours.tensor(&t.name).unwrap();
        if t.name == "blk.1.attn_q_b.weight" {
            // Exactly the FP8 values times their block scale.
            let got = values(&ours, &t.name);
            let want: Vec<f32> = codes.iter().map(|&c| e4m3_val(c) * scale).collect();
            assert_eq!(got, want, "FP8 dequantization");
            assert_ne!(got, values(&float_ref, &t.name));
            continue;
        }
        assert_eq!(ours.tensor_data(o), float_ref.tensor_data(t), "{}", t.name);
    }
}

/// `--mtp`: the `mtp.0.*` block (here: layer 2's tensors, an `e_proj`/`h_proj` pair and
/// norms) is written as llama.cpp's `blk.5.nextn.*` block, which the engine loads as
/// its MTP head.
#[test]
fn mtp_block_is_exported_and_loads() {
    let dir = fixture("small_rates_f32");
    let (cfg, mut mem) = memory(&dir);
    let d = cfg.hidden_size;
    for (n, (s, v)) in mem.tensors.clone() {
        if let Some(rest) = n.strip_prefix("layers.2.") {
            mem.tensors.insert(format!("mtp.0.{rest}"), (s, v));
        }
    }
    let eye = |k: f32| {
        (0..d * d)
            .map(|i| if i % (d + 1) == 0 { k } else { 0.0 })
            .collect::<Vec<f32>>()
    };
    mem.tensors
        .insert("mtp.0.e_proj.weight".into(), (vec![d, d], eye(0.5)));
    mem.tensors
        .insert("mtp.0.h_proj.weight".into(), (vec![d, d], eye(0.25)));
    for n in ["enorm", "hnorm", "norm"] {
        mem.tensors
            .insert(format!("mtp.0.{n}.weight"), (vec![d], vec![1.0; d]));
    }
    // Without --mtp the block is skipped (as llama.cpp does).
    let plain = GgufFile::from_bytes(convert_mem(&cfg, &mem, false).unwrap()).unwrap();
    assert!(plain.tensor("blk.5.nextn.eh_proj.weight").is_none());
    let bytes = convert_mem(&cfg, &mem, true).unwrap();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.get("deepseek4.block_count").unwrap().as_u64(), Some(6));
    assert_eq!(
        f.get("deepseek4.nextn_predict_layers").unwrap().as_u64(),
        Some(1)
    );
    let eh = values(&f, "blk.5.nextn.eh_proj.weight");
    assert_eq!(eh.len(), 2 * d * d);
    assert_eq!(
        (eh[0], eh[d], eh[2 * d + 1], eh[2 * d + d + 1]),
        (0.5, 0.25, 0.5, 0.25)
    );
    assert!(f.tensor("blk.5.nextn.shared_head_norm.weight").is_some());
    let m = ds4_engine::families::deepseek4::DeepSeek4::load(
        std::sync::Arc::new(ds4_engine::backend::cpu::CpuBackend::new(1).unwrap()),
        &std::sync::Arc::new(f),
        "mtp".into(),
    )
    .unwrap();
    assert_eq!(m.mtp().map(|x| x.index), Some(5));
}

/// Missing and misshaped checkpoint tensors are named.
#[test]
fn converter_names_missing_and_misshaped_tensors() {
    let dir = fixture("small_rates_f32");
    let (cfg, mut mem) = memory(&dir);
    let name = "layers.3.attn.indexer.compressor.ape";
    let saved = mem.tensors.remove(name).unwrap();
    let e = convert_mem(&cfg, &mem, false).unwrap_err();
    assert!(e.contains(name) && e.contains("missing"), "{e}");
    mem.tensors
        .insert(name.into(), (vec![5, 32], vec![0.0; 160]));
    let e = convert_mem(&cfg, &mem, false).unwrap_err();
    assert!(e.contains(name) && e.contains("shape"), "{e}");
    mem.tensors.insert(name.into(), saved);
    let t = "layers.0.ffn.gate.tid2eid";
    let (s, mut v) = mem.tensors.remove(t).unwrap();
    v[3] = 7.0;
    mem.tensors.insert(t.into(), (s, v));
    let e = convert_mem(&cfg, &mem, false).unwrap_err();
    assert!(e.contains(t) && e.contains("expert 7"), "{e}");
    let (s, mut v) = mem.tensors.remove(t).unwrap();
    v[3] = 0.0;
    mem.tensors.insert(t.into(), (s, v));
    // An FP8 matrix without its scales.
    let w = "layers.1.attn.wq_b.weight";
    let (shape, _) = mem.tensors.remove(w).unwrap();
    mem.raw.insert(
        w.into(),
        Raw {
            dtype: Dtype::F8_E4M3,
            shape,
            bytes: vec![0x38; 128 * 48],
        },
    );
    let e = convert_mem(&cfg, &mem, false).unwrap_err();
    assert!(
        e.contains("layers.1.attn.wq_b.scale") && e.contains("missing"),
        "{e}"
    );
}
