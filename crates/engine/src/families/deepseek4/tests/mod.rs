//! The `deepseek4` golden-master tests on the CPU backend: the fixtures of
//! `crates/engine/tests/fixtures/deepseek4/` (made by `tools/reference/`, see its
//! README). The f32 fixtures are loaded from `llamacpp.gguf`, the file llama.cpp's own
//! converter wrote from the fixture checkpoint; the bf16 fixtures from our converter's
//! BF16 output of the same checkpoint. Unit tests (not `tests/`) so that the ablation
//! switches, compiled only into test builds, are reachable.

mod ablation;
mod bad_input;
mod hidden;
mod mtp;
mod parity;
mod session;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ds4_convert::{Options, OutType};
use ds4_gguf::{GgufFile, GgufWriter};

use super::DeepSeek4;
use crate::backend::cpu::CpuBackend;
pub use crate::fixtures::*;
use crate::model::{Logits, Model};

pub type Cpu = DeepSeek4<CpuBackend>;

/// The fixture folder `name` of this family.
pub fn dir(name: &str) -> PathBuf {
    fixture("deepseek4", name)
}

/// The f32 folder holding the checkpoint and `llamacpp.gguf` of a fixture (bf16
/// fixtures reuse the f32 one's).
pub fn checkpoint_dir(dir: &Path) -> PathBuf {
    let m = manifest(dir);
    let st = m["checkpoint"]["safetensors"].as_str().unwrap();
    dir.join(st).parent().unwrap().to_path_buf()
}

/// A model from GGUF bytes on a two-thread CPU backend.
pub fn load(bytes: Vec<u8>) -> Cpu {
    let f = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    DeepSeek4::load(Arc::new(CpuBackend::new(2).unwrap()), &f, "fixture".into()).unwrap()
}

/// The bytes of llama.cpp's conversion of a fixture checkpoint.
pub fn llamacpp_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(checkpoint_dir(dir).join("llamacpp.gguf")).unwrap()
}

/// The f32 model of a fixture, from llama.cpp's file.
pub fn llamacpp_model(dir: &Path) -> Cpu {
    load(llamacpp_bytes(dir))
}

/// Our converter's GGUF of a fixture checkpoint with `outtype` (experts MXFP4).
pub fn ours_bytes(dir: &Path, outtype: OutType) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let opts = Options {
        outtype,
        expert_type: None,
        name: "fixture".into(),
    };
    ds4_convert::convert_dir(&checkpoint_dir(dir), &opts, &mut w).unwrap();
    w.to_bytes()
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
