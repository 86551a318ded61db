//! `cargo run -p ds4-convert --release --example convert -- [ARGS]`: the converter
//! without the `ds4-server` binary (the same arguments as `ds4-server convert`).
//!
//! Examples:
//!     convert path/to/GLM-5.3-Flash -o glm.gguf --outtype q8_0 --expert-type q4_k
//!     convert --synthetic bench -o bench.gguf --outtype q8_0 --expert-type q4_k --vocab-from qwen.gguf

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ds4_convert::ConvertArgs,
}

fn main() {
    let cli = Cli::parse();
    match ds4_convert::run(&cli.args) {
        Ok(r) => {
            eprintln!(
                "wrote {} ({} tensors, {:.1} MiB of data)",
                cli.args.output.display(),
                r.tensors,
                r.bytes as f64 / 1048576.0
            );
            for (name, want, got) in &r.fallbacks {
                eprintln!("  {name}: {got} instead of {want} (rows are not whole {want} blocks)");
            }
            if !r.unused.is_empty() {
                eprintln!(
                    "  {} checkpoint tensors unused, e.g. {}",
                    r.unused.len(),
                    r.unused[0]
                );
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
