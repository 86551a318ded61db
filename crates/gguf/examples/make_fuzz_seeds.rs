//! Writes the seed corpus of the cargo-fuzz target (`fuzz/`): small valid files made by
//! `GgufWriter` covering every value type, nested arrays, several tensor types and
//! alignments, plus the gguf-py test file and the first 4 KiB of each vocabulary fixture.
//!
//! Usage: `cargo run -p ds4-gguf --example make_fuzz_seeds -- <out dir> [<fixtures dir>]`

use std::io::Read;
use std::path::{Path, PathBuf};

use ds4_gguf::{GgmlType, GgufWriter, Value};

fn s(v: &str) -> Value {
    Value::String(v.to_owned())
}

fn every_scalar() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(1)),
        ("i8", Value::I8(-1)),
        ("u16", Value::U16(2)),
        ("i16", Value::I16(-2)),
        ("u32", Value::U32(3)),
        ("i32", Value::I32(-3)),
        ("u64", Value::U64(4)),
        ("i64", Value::I64(-4)),
        ("f32", Value::F32(0.5)),
        ("f64", Value::F64(-0.25)),
        ("bool", Value::Bool(true)),
        ("str", s("héllo")),
    ]
}

/// (file name, writer) for each seed.
fn seeds() -> Vec<(String, GgufWriter)> {
    let mut out = Vec::new();
    out.push(("empty".to_owned(), GgufWriter::new()));

    let mut w = GgufWriter::new();
    for (k, v) in every_scalar() {
        w.add_metadata(format!("t.{k}"), v).unwrap();
    }
    out.push(("scalars".to_owned(), w));

    let mut w = GgufWriter::new();
    for (k, v) in every_scalar() {
        w.add_metadata(format!("a.{k}"), Value::Array(vec![v.clone(), v]))
            .unwrap();
    }
    w.add_metadata("a.empty", Value::Array(vec![])).unwrap();
    w.add_metadata(
        "a.nested",
        Value::Array(vec![
            Value::Array(vec![s("x"), s("y")]),
            Value::Array(vec![Value::Array(vec![Value::I32(1)])]),
        ]),
    )
    .unwrap();
    out.push(("arrays".to_owned(), w));

    for (i, dtype) in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::IQ2_XXS,
        GgmlType::I32,
    ]
    .into_iter()
    .enumerate()
    {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", s("llama")).unwrap();
        if i % 3 == 1 {
            w.set_alignment(1 << (i % 7)).unwrap();
        }
        let row = dtype.block_size() as u64;
        let bytes = |rows: u64| vec![0x5a; (rows * dtype.type_size() as u64) as usize];
        w.add_tensor("a.weight", &[row, 2], dtype, bytes(2))
            .unwrap();
        w.add_tensor("b.bias", &[row], dtype, bytes(1)).unwrap();
        w.add_tensor("c.empty", &[row, 0], dtype, vec![]).unwrap();
        out.push((format!("tensors_{}", dtype.name()), w));
    }
    out
}

fn main() {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let Some(out_dir) = args.first() else {
        eprintln!("usage: make_fuzz_seeds <out dir> [<fixtures dir>]");
        std::process::exit(2);
    };
    std::fs::create_dir_all(out_dir).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(out_dir.join(format!("seed_{name}")), bytes).unwrap();
    };
    for (name, w) in seeds() {
        write(&name, &w.to_bytes());
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    write(
        "gguf_py_all_types",
        &std::fs::read(manifest.join("tests/data/gguf_py_all_types.bin")).unwrap(),
    );
    let fixtures = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| manifest.join("../../../shared/fixtures"));
    if let Ok(entries) = std::fs::read_dir(fixtures.join("tokenizer")) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "gguf") {
                let mut prefix = Vec::new();
                let file = std::fs::File::open(&path).unwrap();
                file.take(4096).read_to_end(&mut prefix).unwrap();
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                write(&stem, &prefix);
            }
        }
    }
}
