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
        Ok(r) => eprint!("{}", r.summary(&cli.args.output)),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
