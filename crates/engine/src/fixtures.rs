//! The golden-master fixtures of the model families (`crates/engine/tests/fixtures/`,
//! made by `tools/reference/`): `.npy` reading and the parity metric of their
//! manifests, for the families' tests and for the GPU checks that compare a device
//! against the same references.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The fixture folder `family/name` of this source tree, which must exist: a missing
/// fixture is a failure, not a skip (the fixtures are committed).
pub fn fixture(family: &str, name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
        .join(name);
    assert!(
        p.join("manifest.json").exists(),
        "fixture {} is missing (committed with the repository; regenerate with tools/reference/make-fixtures.sh)",
        p.display()
    );
    p
}

/// A little-endian `.npy` array of `<f4` or `<i4`, as f32 values and its shape.
pub fn npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{}: not .npy", path.display());
    let (hlen, off) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = std::str::from_utf8(&b[off..off + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_txt = header
        .split("'shape': (")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap();
    let shape: Vec<usize> = shape_txt
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let data = &b[off + hlen..];
    let vals: Vec<f32> = if header.contains("'<f4'") {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else if header.contains("'<i4'") {
        data.chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect()
    } else {
        panic!("{}: unsupported dtype in {header}", path.display())
    };
    (shape, vals)
}

/// Integer array (`<i4`).
pub fn npy_i32(path: &Path) -> Vec<i32> {
    npy(path).1.into_iter().map(|v| v as i32).collect()
}

/// The manifest of a fixture.
pub fn manifest(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

/// The parity metric of one row: max |ours − ref| / max(1, std(ref)).
pub fn row_err(ours: &[f32], reference: &[f32]) -> f64 {
    let n = reference.len() as f64;
    let mean = reference.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = reference
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let scale = var.sqrt().max(1.0);
    let m = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max);
    m / scale
}

/// The worst [`row_err`] over rows of `v` columns.
pub fn max_err(ours: &[f32], reference: &[f32], v: usize) -> f64 {
    assert_eq!(ours.len(), reference.len());
    ours.chunks(v)
        .zip(reference.chunks(v))
        .map(|(a, b)| row_err(a, b))
        .fold(0.0, f64::max)
}

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

/// The fixture arrays every family's parity test compares with.
pub struct Golden {
    pub prompt: Vec<u32>,
    pub prefill: Vec<f32>,
    pub decode_tokens: Vec<u32>,
    pub decode: Vec<f32>,
    pub vocab: usize,
}

pub fn golden(dir: &Path) -> Golden {
    let ids = |f: &str| -> Vec<u32> {
        npy_i32(&dir.join(f))
            .into_iter()
            .map(|v| v as u32)
            .collect()
    };
    let (shape, prefill) = npy(&dir.join("prefill_logits.npy"));
    let (_, decode) = npy(&dir.join("decode_logits.npy"));
    Golden {
        prompt: ids("prompt.npy"),
        prefill,
        decode_tokens: ids("decode_tokens.npy"),
        decode,
        vocab: shape[1],
    }
}

/// Pipelined greedy decoding ([`crate::Session::decode_greedy`]: the backend chooses every
/// token, each step queued before the host reads the choice it evaluates) against the
/// golden master `g` (at least 7 decode steps): after the prompt, every one of the
/// reference's greedy tokens; stopped after five choices, the session holds the fifth
/// (its step was queued ahead) and the next step gives the reference's logits within
/// `tol`; in a context three tokens longer than the prompt, three choices and then a full
/// context; and [`crate::generate`] with a token of the reference's as its end of
/// generation stops at that token the same way whether it samples from the logits or lets
/// the backend choose. The first difference, or `Ok`.
pub fn check_pipelined_greedy(
    model: &std::sync::Arc<dyn crate::Model>,
    g: &Golden,
    tol: f64,
) -> Result<(), String> {
    use std::ops::ControlFlow;

    use crate::{GreedyEnd, Session};
    let e = |what: &str, err: crate::EngineError| format!("{what}: {err}");
    let n = g.decode.len() / g.vocab;
    let start = |n_ctx: usize| -> Result<(Session, u32), String> {
        let mut s = Session::new(model.clone(), n_ctx).map_err(|x| e("session", x))?;
        let first = argmax(
            s.prefill(&g.prompt, &mut |_, _| {})
                .map_err(|x| e("prefill", x))?,
        );
        Ok((s, first as u32))
    };
    let run = |s: &mut Session, first, max, stop_at: usize| {
        let mut picks = Vec::new();
        let end = s.decode_greedy(first, max, &mut |t| {
            picks.push(t);
            if picks.len() == stop_at {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        end.map(|end| (end, picks))
            .map_err(|x| e("decode_greedy", x))
    };
    let (mut s, first) = start(4096)?;
    let (end, picks) = run(&mut s, first, n, usize::MAX)?;
    if first != g.decode_tokens[0] || picks != g.decode_tokens[1..=n] || end != GreedyEnd::Max {
        return Err(format!(
            "{n} choices: {end:?}, {:?} against the reference's {:?}",
            [&[first][..], &picks].concat(),
            &g.decode_tokens[..=n]
        ));
    }
    let (mut s, first) = start(4096)?;
    let (end, _) = run(&mut s, first, n, 5)?;
    let held = [&g.prompt[..], &g.decode_tokens[..6]].concat();
    if end != GreedyEnd::Stopped || s.tokens() != held || s.logits().is_some() {
        return Err(format!(
            "stopped after 5 choices: {end:?}, {} tokens held ({} expected), logits known: {}",
            s.tokens().len(),
            held.len(),
            s.logits().is_some()
        ));
    }
    let row = s
        .decode(g.decode_tokens[6])
        .map_err(|x| e("the step after stopping", x))?;
    let err = row_err(row, &g.decode[6 * g.vocab..7 * g.vocab]);
    if err > tol {
        return Err(format!(
            "the step after stopping: error {err:.2e} > {tol:.2e}"
        ));
    }
    let (mut s, first) = start(g.prompt.len() + 3)?;
    let (end, picks) = run(&mut s, first, n, usize::MAX)?;
    if end != GreedyEnd::ContextFull || picks != g.decode_tokens[1..=3] {
        return Err(format!(
            "a context of 3 more tokens: {end:?} after {picks:?} ({:?} expected)",
            &g.decode_tokens[1..=3]
        ));
    }
    let eog = g.decode_tokens[4];
    let upto = g.decode_tokens.iter().position(|&t| t == eog).unwrap_or(4);
    for needs_logits in [true, false] {
        let mut s = Session::new(model.clone(), 4096).map_err(|x| e("session", x))?;
        let params = crate::generate::GenerateParams {
            max_tokens: n,
            sampler: crate::sampler::SamplerParams::GREEDY,
            seed: 0,
            needs_logits,
        };
        let mut got = Vec::new();
        let stats = crate::generate::generate(
            &mut s,
            &g.prompt,
            &params,
            &|t| t == eog,
            &mut |_, _| {},
            &mut |t, _| {
                got.push(t);
                ControlFlow::Continue(())
            },
        )
        .map_err(|x| e("generate", x))?;
        if got != g.decode_tokens[..=upto] || stats.stop != crate::generate::StopReason::Eog {
            return Err(format!(
                "generate (logits read: {needs_logits}): {:?} after {got:?} ({:?} expected)",
                stats.stop,
                &g.decode_tokens[..=upto]
            ));
        }
    }
    Ok(())
}
