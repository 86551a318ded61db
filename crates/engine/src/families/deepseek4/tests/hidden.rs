//! Per-layer comparison with the reference's hidden states (`hidden_*` fixture arrays:
//! embeddings, the streams after each layer, attention and MoE block outputs at prompt
//! positions 0..7, S/2, S−2, S−1), to locate a mismatch layer by layer, and the
//! lightning indexer's selections against the reference's, as sets, at every prefill
//! query and decode step.

use super::*;
use crate::families::deepseek4::Trace;

/// Max |a−b| / max(1, max|b|) over the fixture positions of one per-layer array.
fn cmp(ours: &[f32], theirs: &[f32], pos: &[usize], width: usize) -> f64 {
    let mut worst = 0f64;
    for (k, &p) in pos.iter().enumerate() {
        let a = &ours[p * width..(p + 1) * width];
        let b = &theirs[k * width..(k + 1) * width];
        let scale = b.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() as f64)
            .fold(0.0, f64::max);
        worst = worst.max(d / scale);
    }
    worst
}

/// Every layer's outputs of the one-call prefill against the reference's (f32: within
/// 1e-4 relative at every layer; bf16 (`bound` `None`): printed, with the f32
/// reference's distance to the bf16 one beside).
fn layers(name: &str, bound: Option<f64>) {
    let dir = dir(name);
    let m = if bound.is_some() {
        llamacpp_model(&dir)
    } else {
        load(ours_bytes(&dir, ds4_convert::OutType::Bf16))
    };
    let g = golden(&dir);
    let pos: Vec<usize> = npy_i32(&dir.join("hidden_positions.npy"))
        .into_iter()
        .map(|v| v as usize)
        .collect();
    let (_, streams) = npy(&dir.join("hidden_streams.npy"));
    let (_, attn) = npy(&dir.join("hidden_attn_out.npy"));
    let (_, mlp) = npy(&dir.join("hidden_mlp_out.npy"));
    let (_, embed) = npy(&dir.join("hidden_embed.npy"));
    let c = m.config();
    let (n, d, l) = (c.hc_mult, c.n_embd, c.n_layer());
    let mut cache = m.new_cache(4096).unwrap();
    let mut tr = Trace::default();
    m.forward_traced(&mut *cache, &g.prompt, &mut tr).unwrap();
    let e = cmp(&tr.embed, &embed, &pos, d);
    assert!(e <= 1e-6, "{name}: embeddings {e:.2e}");
    // The f32 reference's arrays, laid out as ours (for the bf16 report).
    let f32_dir = dir.to_string_lossy().replace("_bf16", "_f32");
    let f32_dir = std::path::Path::new(&f32_dir);
    let per_pos = |a: &[f32], w: usize| -> Vec<f32> {
        let mut v = vec![0f32; (pos.iter().max().unwrap() + 1) * w];
        for (k, &p) in pos.iter().enumerate() {
            v[p * w..(p + 1) * w].copy_from_slice(&a[k * w..(k + 1) * w]);
        }
        v
    };
    let per = pos.len();
    for i in 0..l {
        let es = cmp(
            &tr.streams[i],
            &streams[i * per * n * d..(i + 1) * per * n * d],
            &pos,
            n * d,
        );
        let ea = cmp(
            &tr.attn_out[i],
            &attn[i * per * d..(i + 1) * per * d],
            &pos,
            d,
        );
        let em = cmp(
            &tr.mlp_out[i],
            &mlp[i * per * d..(i + 1) * per * d],
            &pos,
            d,
        );
        eprintln!("{name} layer {i}: attn {ea:.2e}  moe {em:.2e}  streams {es:.2e}");
        match bound {
            Some(b) => assert!(
                es <= b && ea <= b && em <= b,
                "{name}: layer {i} differs from the reference"
            ),
            None => {
                let (_, fa) = npy(&f32_dir.join("hidden_attn_out.npy"));
                let (_, fs) = npy(&f32_dir.join("hidden_streams.npy"));
                let fa = per_pos(&fa[i * per * d..(i + 1) * per * d], d);
                let fs = per_pos(&fs[i * per * n * d..(i + 1) * per * n * d], n * d);
                eprintln!(
                    "{name} layer {i}: f32 reference: attn {:.2e}  streams {:.2e}",
                    cmp(&fa, &attn[i * per * d..(i + 1) * per * d], &pos, d),
                    cmp(
                        &fs,
                        &streams[i * per * n * d..(i + 1) * per * n * d],
                        &pos,
                        n * d
                    )
                );
                for (k, &p) in pos.iter().enumerate() {
                    let a = cmp(
                        &tr.attn_out[i][p * d..(p + 1) * d],
                        &attn[(i * per + k) * d..(i * per + k + 1) * d],
                        &[0],
                        d,
                    );
                    eprintln!("    pos {p}: attn {a:.2e}");
                }
            }
        }
    }
}

#[test]
fn hidden_states_small_rates() {
    layers("small_rates_f32", Some(1e-4));
}

#[test]
fn hidden_states_real_layout() {
    layers("real_layout_f32", Some(1e-4));
}

#[test]
fn hidden_states_bf16_report() {
    layers("small_rates_bf16", None);
    layers("real_layout_bf16", None);
}

/// The reference's indexer output of a CSA layer, per query row, as a sorted set.
fn reference_sets(path: &std::path::Path) -> Vec<Vec<usize>> {
    let (shape, v) = npy(path);
    v.chunks(shape[1])
        .map(|r| {
            let mut s: Vec<usize> = r
                .iter()
                .filter(|&&x| x >= 0.0)
                .map(|&x| x as usize)
                .collect();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect()
}

/// Every query's selected entries equal the reference's (as sets), in the one-call
/// prefill and in each decode step; returns how many queries really selected (saw more
/// entries than `index_topk`).
fn selections(name: &str) -> usize {
    let dir = dir(name);
    let m = llamacpp_model(&dir);
    let g = golden(&dir);
    let topk = m.config().index_topk;
    let mut cache = m.new_cache(4096).unwrap();
    let mut tr = Trace::default();
    m.forward_traced(&mut *cache, &g.prompt, &mut tr).unwrap();
    let mut dec: Vec<Trace> = Vec::new();
    for i in 0..32 {
        let mut t = Trace::default();
        m.forward_traced(&mut *cache, &[g.decode_tokens[i]], &mut t)
            .unwrap();
        dec.push(t);
    }
    let mut sparse = 0;
    for (li, sel) in &tr.selections {
        let want = reference_sets(&dir.join(format!("indexer_topk_layer{li}.npy")));
        assert_eq!(sel.len(), want.len());
        for (q, (ours, theirs)) in sel.iter().zip(&want).enumerate() {
            assert_eq!(ours, theirs, "{name}: layer {li}, prefill query {q}");
            sparse += usize::from(theirs.len() == topk && (q + 1) / 4 > topk);
        }
        let want_dec = reference_sets(&dir.join(format!("indexer_topk_layer{li}_decode.npy")));
        for (step, t) in dec.iter().enumerate() {
            let ours = &t.selections.iter().find(|(l, _)| l == li).unwrap().1[0];
            assert_eq!(
                ours, &want_dec[step],
                "{name}: layer {li}, decode step {step}"
            );
        }
    }
    assert_eq!(tr.selections.len(), 2, "{name}: two CSA layers expected");
    sparse
}

#[test]
fn indexer_selections_small_rates() {
    let sparse = selections("small_rates_f32");
    eprintln!("small_rates: {sparse} prefill queries select among more entries than top_k");
    assert!(sparse > 100);
}

#[test]
fn indexer_selections_real_layout() {
    let sparse = selections("real_layout_f32");
    eprintln!("real_layout: {sparse} prefill queries select among more entries than top_k");
    assert!(sparse > 100);
}
