//! `ds4-server synth NAME OUT.gguf`: writes a synthetic model (random, valid quantized
//! weights of a real model's shape, e.g. `llama3-8b:q4_k_m`) as a GGUF file, so that
//! another engine can run the identical weights that `bench --synthetic NAME` builds
//! in GPU memory (issue 5, item 5). Needs no GPU; the whole file is built in memory
//! before it is written (about its size in RAM).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use ds4_cuda::synth::{Spec, write_gguf};

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// `SHAPE:QUANT`, e.g. `llama3-8b:q4_k_m`, `qwen2.5-1.5b:q8_0`, `tiny-llama:q4_0`.
    pub name: String,
    /// The GGUF file to write (overwritten).
    pub out: PathBuf,
}

pub fn main(args: SynthArgs) -> Result<()> {
    let spec = Spec::parse(&args.name)?;
    let t0 = Instant::now();
    write_gguf(&spec, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    let size = std::fs::metadata(&args.out)
        .with_context(|| format!("reading back {}", args.out.display()))?
        .len();
    let s = &spec.shape;
    eprintln!(
        "{}: {} ({} layers, {} embd, {} ffn, {} heads / {} kv, vocab {}), {} tensors, \
         {:.3} GB of weights, {} bytes written to {} in {:.1} s",
        spec.name(),
        s.arch,
        s.n_layer,
        s.n_embd,
        s.n_ff,
        s.n_head,
        s.n_head_kv,
        s.n_vocab,
        spec.tensors().len(),
        spec.weight_bytes() as f64 / 1e9,
        size,
        args.out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
