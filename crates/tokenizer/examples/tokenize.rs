//! Tokenizes text with a GGUF's vocabulary and prints ids and timings.
//!
//! `cargo run -p ds4-tokenizer --example tokenize -- MODEL.gguf [TEXT] [--special]`

use std::time::Instant;

use ds4_gguf::GgufFile;
use ds4_tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: tokenize MODEL.gguf [TEXT] [--special]");
        std::process::exit(2);
    };
    let special = args.iter().any(|a| a == "--special");
    let text = args
        .iter()
        .skip(1)
        .find(|a| *a != "--special")
        .cloned()
        .unwrap_or_else(|| "Hello world".to_owned());
    let t0 = Instant::now();
    let file = GgufFile::open(path.as_ref())?;
    let t1 = Instant::now();
    let tok = Tokenizer::from_gguf(&file)?;
    let t2 = Instant::now();
    let ids = tok.encode(&text, false, special);
    let t3 = Instant::now();
    if ids.len() <= 200 {
        println!("{ids:?}");
        println!("decoded: {:?}", tok.decode(&ids, true));
    }
    println!(
        "open {:.1} ms, build {:.1} ms, encode {:.3} ms ({} bytes -> {} tokens)",
        (t1 - t0).as_secs_f64() * 1e3,
        (t2 - t1).as_secs_f64() * 1e3,
        (t3 - t2).as_secs_f64() * 1e3,
        text.len(),
        ids.len()
    );
    println!("eog: {:?}  eot: {:?}", tok.eog_ids(), tok.eot());
    Ok(())
}
