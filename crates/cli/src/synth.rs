//! `ds4-server synth NAME OUT.gguf [--layers N] [--first-layer K]`: writes a synthetic
//! model (random, valid weights of a real model's shape, e.g. `llama3-8b:q4_k_m`,
//! `glm53-flash:q2`, `deepseek4-flash:q2`) as a GGUF file, so that another engine can run the identical
//! weights that `bench --synthetic NAME` builds in GPU memory (issue 5, item 5; issue
//! 11, item 3). A layer window keeps real layers K..K+N-1 with their real kinds. Needs
//! no GPU; one tensor is in memory at a time.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use ds4_cuda::synth::{Spec, write_gguf};

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// `SHAPE:QUANT`, e.g. `llama3-8b:q4_k_m`, `qwen2.5-1.5b:q8_0`, `glm53-flash:q2`,
    /// `deepseek4-flash:q2`, `tiny-llama:q4_0`, `tiny-glm5:q2`, `tiny-deepseek4:q2`.
    pub name: String,
    /// The GGUF file to write (overwritten).
    pub out: PathBuf,
    /// Write only N layers of the real layer schedule (default: to the last layer).
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = ds4_args::int::<usize>(1..))]
    pub layers: Option<usize>,
    /// Real layer index of the file's first layer.
    #[arg(long, value_name = "K", default_value_t = 0, allow_negative_numbers = true,
          value_parser = ds4_args::int::<usize>(0..))]
    pub first_layer: usize,
}

pub fn main(args: SynthArgs) -> Result<()> {
    let spec = Spec::parse(&args.name)?.window(args.first_layer, args.layers)?;
    let (w, total) = (spec.window, spec.n_layer_real());
    eprintln!(
        "{}: {}, {} layers (real layers {}..{} of {total}), {} tensors",
        spec.name(),
        spec.arch(),
        w.n_layer,
        w.first,
        w.first + w.n_layer - 1,
        spec.tensors().len()
    );
    for (kind, layers) in layer_runs(&spec.layer_kinds(), w.first) {
        eprintln!("  {kind}: {layers}");
    }
    let (weights, decode) = (spec.weight_bytes(), spec.decode_bytes());
    eprintln!(
        "  weights {weights} bytes ({:.3} GB); one decode token reads {decode} bytes ({:.3} GB)",
        weights as f64 / 1e9,
        decode as f64 / 1e9
    );
    let t0 = Instant::now();
    write_gguf(&spec, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    let size = std::fs::metadata(&args.out)
        .with_context(|| format!("reading back {}", args.out.display()))?
        .len();
    eprintln!(
        "wrote {size} bytes to {} in {:.1} s",
        args.out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The layers of each kind, in order of first appearance and numbered as the real
/// model's (the file's first layer is real layer `first`): `layers 0..2`,
/// `11 layers: 3, 7, .., 43`.
fn layer_runs(kinds: &[&'static str], first: usize) -> Vec<(&'static str, String)> {
    let mut groups: Vec<(&'static str, Vec<usize>)> = Vec::new();
    for (i, &k) in (first..).zip(kinds) {
        match groups.iter_mut().find(|g| g.0 == k) {
            Some(g) => g.1.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    groups
        .into_iter()
        .map(|(k, idx)| {
            let (a, b) = (idx[0], idx[idx.len() - 1]);
            let span = match idx.len() {
                1 => format!("layer {a}"),
                n if b - a == n - 1 => format!("layers {a}..{b}"),
                2 => format!("layers {a}, {b}"),
                n => format!("{n} layers: {a}, {}, .., {b}", idx[1]),
            };
            (k, span)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm53_flash_layers_group_as_synth_gguf_py_prints_them() {
        let spec = Spec::parse("glm53-flash:q2").unwrap();
        let runs = layer_runs(&spec.layer_kinds(), 0);
        assert_eq!(
            runs,
            [
                ("KDA, dense FFN", "layers 0..2".to_string()),
                ("MLA+indexer, MoE", "11 layers: 3, 7, .., 43".to_string()),
                ("KDA, MoE", "31 layers: 4, 5, .., 44".to_string()),
            ]
        );
    }

    #[test]
    fn layer_runs_group_kinds() {
        let kinds = ["a", "a", "a", "b", "a", "c", "c", "b", "a", "a", "a", "b"];
        assert_eq!(
            layer_runs(&kinds, 0),
            [
                ("a", "7 layers: 0, 1, .., 10".to_string()),
                ("b", "3 layers: 3, 7, .., 11".to_string()),
                ("c", "layers 5..6".to_string()),
            ]
        );
        assert_eq!(layer_runs(&["a", "b", "a"], 0)[0].1, "layers 0, 2");
        assert_eq!(layer_runs(&["a", "b", "a"], 2)[1].1, "layer 3");
    }
}
