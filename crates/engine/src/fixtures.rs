//! The golden-master fixtures of the model families (`crates/engine/tests/fixtures/`,
//! made by `tools/reference/`): `.npy` reading and the parity metric of their
//! manifests, for the families' tests and for the GPU checks that compare a device
//! against the same references.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The fixture folder `family/name` of this source tree, which must exist: a missing
/// fixture is a failure, not a skip (the fixtures are committed).
pub fn fixture(family: &str, name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
        .join(name);
    assert!(
        p.join("manifest.json").exists(),
        "fixture {} is missing (committed with the repository; regenerate with tools/reference/make-fixtures.sh)",
        p.display()
    );
    p
}

/// A little-endian `.npy` array of `<f4` or `<i4`, as f32 values and its shape.
pub fn npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
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
pub fn npy_i32(path: &Path) -> Vec<i32> {
    npy(path).1.into_iter().map(|v| v as i32).collect()
}

/// The manifest of a fixture.
pub fn manifest(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// The parity metric of one row: max |ours − ref| / max(1, std(ref)).
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

/// The fixture arrays every family's parity test compares with.
pub struct Golden {
    pub prompt: Vec<u32>,
    pub prefill: Vec<f32>,
    pub decode_tokens: Vec<u32>,
    pub decode: Vec<f32>,
    pub vocab: usize,
}

pub fn golden(dir: &Path) -> Golden {
    let ids = |f: &str| -> Vec<u32> {
        npy_i32(&dir.join(f))
            .into_iter()
            .map(|v| v as u32)
            .collect()
    };
    let (shape, prefill) = npy(&dir.join("prefill_logits.npy"));
    let (_, decode) = npy(&dir.join("decode_logits.npy"));
    Golden {
        prompt: ids("prompt.npy"),
        prefill,
        decode_tokens: ids("decode_tokens.npy"),
        decode,
        vocab: shape[1],
    }
}
