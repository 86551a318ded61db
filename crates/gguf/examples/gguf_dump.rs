//! Opens GGUF files and prints how long opening took (the fastest of `$GGUF_DUMP_REPEAT`
//! opens, default 1), the metadata (arrays summarised) and the tensor count per type.
//! Usage: `cargo run --release -p ds4-gguf --example gguf_dump -- <file.gguf>...`

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use ds4_gguf::{GgufFile, Value};

fn main() {
    let repeat: usize = std::env::var("GGUF_DUMP_REPEAT")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    for arg in std::env::args_os().skip(1) {
        let mut best = None;
        let mut opened = None;
        for _ in 0..repeat.max(1) {
            let start = Instant::now();
            let file = match GgufFile::open(Path::new(&arg)) {
                Ok(file) => file,
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::exit(1);
                }
            };
            let elapsed = start.elapsed();
            best = Some(best.map_or(elapsed, |b: std::time::Duration| b.min(elapsed)));
            opened = Some(file);
        }
        let (Some(file), Some(elapsed)) = (opened, best) else {
            continue;
        };
        println!(
            "{}: GGUF v{}, {} bytes, {} keys, {} tensors, opened in {:.2} ms",
            file.label(),
            file.version(),
            file.as_bytes().len(),
            file.metadata().len(),
            file.tensors().len(),
            elapsed.as_secs_f64() * 1e3
        );
        for (key, value) in file.metadata() {
            match value {
                Value::String(s) if s.len() > 60 => {
                    println!("  {key} = string of {} bytes", s.len())
                }
                Value::Array(_) => println!("  {key} = {}", value.describe()),
                _ => println!("  {key} = {value:?}"),
            }
        }
        let mut counts = BTreeMap::new();
        for t in file.tensors() {
            *counts.entry(t.dtype).or_insert(0usize) += 1;
        }
        for (dtype, n) in counts {
            println!("  {n} tensors of {dtype}");
        }
    }
}
