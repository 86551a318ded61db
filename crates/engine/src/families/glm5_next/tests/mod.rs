//! The `glm5_next` golden-master tests on the CPU backend: the fixtures of
//! `crates/engine/tests/fixtures/glm5_next/` (made by `tools/reference/`, see its
//! README), converted to GGUF by `ds4-convert` in memory. Unit tests (not `tests/`) so
//! that the ablation switches, compiled only into test builds, are reachable.

mod ablation;
mod compat;
mod hidden;
mod parity;
mod quant;
mod session;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_convert::{Options, OutType};
use ds4_gguf::{GgufFile, GgufWriter};

use super::Glm5Next;
use crate::backend::cpu::CpuBackend;
use crate::families::bounds::Pinned;
pub use crate::fixtures::*;
use crate::model::{Logits, Model};

pub type Cpu = Glm5Next<CpuBackend>;

/// The fixture folder `name` of this family.
pub fn dir(name: &str) -> PathBuf {
    fixture("glm5_next", name)
}

/// The checkpoint folder of a fixture (bf16 fixtures reuse the f32 one).
pub fn checkpoint_dir(dir: &Path) -> PathBuf {
    let m = manifest(dir);
    let st = m["checkpoint"]["safetensors"].as_str().unwrap();
    dir.join(st).parent().unwrap().to_path_buf()
}

/// Converts a fixture checkpoint to GGUF bytes with `outtype` (and `expert` type).
pub fn gguf_bytes(dir: &Path, outtype: OutType, expert: Option<OutType>) -> Vec<u8> {
    let ck = checkpoint_dir(dir);
    let mut w = GgufWriter::new();
    let opts = Options {
        outtype,
        expert_type: expert,
        name: "fixture".into(),
    };
    ds4_convert::convert_dir(&ck, &opts, &mut w).unwrap();
    w.to_bytes()
}

/// A model from GGUF bytes on a two-thread CPU backend.
pub fn load(bytes: Vec<u8>) -> Cpu {
    let f = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    Glm5Next::load(Arc::new(CpuBackend::new(2).unwrap()), &f, "fixture".into()).unwrap()
}

/// The fixture's model converted with `outtype`.
pub fn model(dir: &Path, outtype: OutType) -> Cpu {
    load(gguf_bytes(dir, outtype, None))
}

/// Our logits for the fixture protocol: one-call prefill (every row) and the decode
/// steps fed with the reference's tokens.
pub fn run_protocol(m: &Cpu, g: &Golden) -> (Vec<f32>, Vec<f32>) {
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

/// f32 bounds: 3× the worst rows measured on 2026-12-02 (docs/parity.md, GLM table;
/// the reference's own run-to-run noise is ~7e-6, 3.0e-5 on `real_layout`).
pub fn f32_pinned(name: &str) -> Pinned {
    match name {
        "lowerbound_sparse_f32" => Pinned::f32(7.36e-6, 3.31e-6, 3.0),
        "softplus_dense_f32" => Pinned::f32(8.21e-6, 5.78e-6, 3.0),
        "real_layout_f32" => Pinned::f32(2.84e-5, 1.08e-5, 3.0),
        _ => panic!("{name}: no f32 measurement pinned"),
    }
}
