//! Test support for the `glm5_next` tests: the golden-master fixtures
//! (`crates/engine/tests/fixtures/glm5_next/`, made by `tools/reference/`), `.npy`
//! reading, conversion of a fixture checkpoint to an in-memory GGUF, and the parity
//! metric of issue 4.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use ds4_convert::{Options, OutType};
use ds4_engine::families::glm5_next::Glm5Next;
use ds4_gguf::{GgufFile, GgufWriter};

/// The fixture folder `name`, or `None` after printing why the test skips.
pub fn fixture(name: &str) -> Option<PathBuf> {
    let base = std::env::var_os("DS4_GLM_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/glm5_next")
        });
    let p = base.join(name);
    if p.join("manifest.json").exists() {
        Some(p)
    } else {
        eprintln!("skipped: fixture {} is absent", p.display());
        None
    }
}

/// A little-endian `.npy` array of `<f4` or `<i4`, as f32 values and its shape.
pub fn npy(path: &std::path::Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{}: not .npy", path.display());
    let (hlen, off) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[off..off + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_txt = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape: Vec<usize> = shape_txt
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let data = &b[off + hlen..];
    let vals: Vec<f32> = if header.contains("'<f4'") {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else if header.contains("'<i4'") {
        data.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect()
    } else {
        panic!("{}: unsupported dtype in {header}", path.display())
    };
    (shape, vals)
}

/// Integer array (`<i4`).
pub fn npy_i32(path: &std::path::Path) -> Vec<i32> {
    npy(path).1.into_iter().map(|v| v as i32).collect()
}

/// The manifest of a fixture.
pub fn manifest(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// The checkpoint folder of a fixture (bf16 fixtures reuse the f32 one).
pub fn checkpoint_dir(dir: &std::path::Path) -> PathBuf {
    let m = manifest(dir);
    let st = m["checkpoint"]["safetensors"].as_str().unwrap();
    dir.join(st).parent().unwrap().to_path_buf()
}

/// Converts a fixture checkpoint to GGUF bytes with `outtype` (and `expert` type).
pub fn gguf_bytes(dir: &std::path::Path, outtype: OutType, expert: Option<OutType>) -> Vec<u8> {
    let ck = checkpoint_dir(dir);
    let mut w = GgufWriter::new();
    let opts = Options {
        outtype,
        expert_type: expert,
        name: "fixture".into(),
    };
    // The bf16 fixtures' config.json is the f32 checkpoint's config.
    ds4_convert::convert_dir(&ck, &opts, &mut w).unwrap();
    w.to_bytes()
}

/// Loads a model from GGUF bytes.
pub fn load(bytes: Vec<u8>) -> Glm5Next {
    let f = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    Glm5Next::load(&f, "fixture".into()).unwrap()
}

/// The fixture's model converted with `outtype`.
pub fn model(dir: &std::path::Path, outtype: OutType) -> Glm5Next {
    load(gguf_bytes(dir, outtype, None))
}

/// Issue 4's metric for one row: max |ours − ref| / max(1, std(ref)).
pub fn row_err(ours: &[f32], reference: &[f32]) -> f64 {
    let n = reference.len() as f64;
    let mean = reference.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = reference
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let scale = var.sqrt().max(1.0);
    let m = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max);
    m / scale
}

/// The worst [`row_err`] over rows of `v` columns.
pub fn max_err(ours: &[f32], reference: &[f32], v: usize) -> f64 {
    assert_eq!(ours.len(), reference.len());
    ours.chunks(v)
        .zip(reference.chunks(v))
        .map(|(a, b)| row_err(a, b))
        .fold(0.0, f64::max)
}

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

/// Fixture arrays used by the comparisons.
pub struct Golden {
    pub prompt: Vec<u32>,
    pub prefill: Vec<f32>,
    pub decode_tokens: Vec<u32>,
    pub decode: Vec<f32>,
    pub vocab: usize,
}

pub fn golden(dir: &std::path::Path) -> Golden {
    let prompt = npy_i32(&dir.join("prompt.npy"))
        .into_iter()
        .map(|v| v as u32)
        .collect();
    let (shape, prefill) = npy(&dir.join("prefill_logits.npy"));
    let decode_tokens = npy_i32(&dir.join("decode_tokens.npy"))
        .into_iter()
        .map(|v| v as u32)
        .collect();
    let (_, decode) = npy(&dir.join("decode_logits.npy"));
    Golden {
        prompt,
        prefill,
        decode_tokens,
        decode,
        vocab: shape[1],
    }
}

/// Our logits for the fixture protocol: one-call prefill (every row) and the 32 decode
/// steps fed with the reference's tokens.
pub fn run_protocol(m: &Glm5Next, g: &Golden) -> (Vec<f32>, Vec<f32>) {
    use ds4_engine::model::{Logits, Model};
    let mut cache = m.new_cache(4096).unwrap();
    let mut pre = Vec::new();
    m.forward(&mut *cache, &g.prompt, Logits::All, &mut pre)
        .unwrap();
    let steps = g.decode.len() / g.vocab;
    let mut dec = Vec::new();
    let mut row = Vec::new();
    for i in 0..steps {
        m.forward(&mut *cache, &[g.decode_tokens[i]], Logits::Last, &mut row)
            .unwrap();
        dec.extend_from_slice(&row);
    }
    (pre, dec)
}
