//! `trace FIXTURE GGUF [POS...]`: where CUDA and the CPU part, layer by layer. Both
//! backends prefill the golden master's prompt from one GGUF, recording each layer's
//! attention and MLP outputs and streams (`forward_traced`); for each position asked for
//! (default: the three prompt rows where CUDA's logits are furthest from the CPU's) one
//! line per layer gives CUDA's relative error against the CPU there, so the first layer
//! that departs shows where a discrete choice (a routing, a selection) went the other way.

use std::path::Path;
use std::sync::Arc;

use ds4_cuda::CudaBackend;
use ds4_engine::backend::cpu::CpuBackend;
use ds4_engine::families::{deepseek4, glm5_next};
use ds4_engine::fixtures::{golden, row_err};
use ds4_engine::model::Model;
use ds4_gguf::GgufFile;

use crate::Res;
use crate::families::{row, rows_by_err};

/// One backend's prompt: every row of logits and the per-layer records `[streams,
/// attention output, MLP output]` (`[S, N·D]`, `[S, D]`, `[S, D]` per layer).
struct Traced {
    logits: Vec<f32>,
    layers: [Vec<Vec<f32>>; 3],
}

/// The prompt through `$family::$model` on backend `$b` (both families record the same
/// `Trace` fields).
macro_rules! traced {
    ($family:ident::$model:ident, $b:expr, $file:expr, $prompt:expr) => {{
        let m = $family::$model::load($b, $file, "trace".into())?;
        let mut cache = m.new_cache($prompt.len() + 1)?;
        let mut tr = $family::Trace::default();
        let logits = m.forward_traced(&mut *cache, $prompt, &mut tr)?;
        Traced {
            logits,
            layers: [tr.streams, tr.attn_out, tr.mlp_out],
        }
    }};
}

pub fn trace(args: &[String]) -> Res<()> {
    let (Some(dir), Some(gguf)) = (args.first(), args.get(1)) else {
        return Err("usage: gpu_check trace FIXTURE_DIR GGUF [POS...]".into());
    };
    let g = golden(Path::new(dir));
    let file = Arc::new(GgufFile::open(Path::new(gguf))?);
    let gpu = Arc::new(CudaBackend::new(0)?);
    let cpu = Arc::new(CpuBackend::new(8)?);
    let arch = file.architecture()?;
    let p = &g.prompt[..];
    let (ours, theirs) = if glm5_next::ARCH_NAMES.contains(&arch) {
        (
            traced!(glm5_next::Glm5Next, gpu, &file, p),
            traced!(glm5_next::Glm5Next, cpu, &file, p),
        )
    } else if arch == deepseek4::ARCH {
        (
            traced!(deepseek4::DeepSeek4, gpu, &file, p),
            traced!(deepseek4::DeepSeek4, cpu, &file, p),
        )
    } else {
        return Err(format!("trace: no per-layer records for architecture '{arch}'").into());
    };
    let (v, s) = (g.vocab, g.prompt.len());
    let mut positions: Vec<usize> = args[2..]
        .iter()
        .map(|a| a.parse::<usize>())
        .collect::<Result<_, _>>()?;
    if let Some(p) = positions.iter().find(|&&p| p >= s) {
        return Err(format!("trace: position {p} is past the prompt's {s} tokens").into());
    }
    if positions.is_empty() {
        positions = rows_by_err(&ours.logits, &theirs.logits, v)
            .iter()
            .take(3)
            .map(|&(p, _)| p)
            .collect();
    }
    for p in positions {
        let e = row_err(row(&ours.logits, p, v), row(&theirs.logits, p, v));
        println!("position {p}: logits CUDA vs CPU {e:.3e}; per layer streams / attention / MLP:");
        for l in 0..ours.layers[0].len() {
            let errs: Vec<String> = (0..3)
                .map(|k| {
                    let (a, b) = (&ours.layers[k][l], &theirs.layers[k][l]);
                    let w = a.len() / s;
                    format!("{:.3e}", row_err(row(a, p, w), row(b, p, w)))
                })
                .collect();
            println!("  layer {l:2}: {}", errs.join(" / "));
        }
    }
    Ok(())
}
