//! Test support for the converter's tests: the `glm5_next` golden-master fixtures
//! (`crates/engine/tests/fixtures/glm5_next/`, made by `tools/reference/`) and their
//! conversion to an in-memory GGUF. These tests live here, not beside the family, because
//! they check what the converter writes (and that the engine refuses broken files); the
//! family's parity tests are in `crates/engine/src/families/glm5_next/tests/`.

#![allow(dead_code)]

use std::path::PathBuf;

use ds4_convert::{Options, OutType};
use ds4_gguf::GgufWriter;

/// The fixture folder `name`; the fixtures are committed, so a missing one is a failure.
pub fn fixture(name: &str) -> PathBuf {
    ds4_engine::fixtures::fixture("glm5_next", name)
}

pub use ds4_engine::fixtures::manifest;

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
    ds4_convert::convert_dir(&ck, &opts, &mut w).unwrap();
    w.to_bytes()
}
