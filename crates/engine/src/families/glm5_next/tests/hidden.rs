//! Per-layer comparison with the reference's hidden states (`hidden_*` fixture arrays:
//! embeddings, the streams after each layer, attention and MLP block outputs at
//! prompt positions 0..7, S−2, S−1), to locate a mismatch layer by layer. f32 fixtures
//! must agree to 1e-4 relative at every layer; bf16 differences are printed.

use ds4_convert::OutType;

use super::*;
use crate::families::glm5_next::Trace;

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

fn layers(name: &str, outtype: OutType, bound: Option<f64>) {
    let dir = dir(name);
    let m = model(&dir, outtype);
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
    eprintln!("{name} embed {e:.2e}");
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
        eprintln!("{name} layer {i}: attn {ea:.2e}  mlp {em:.2e}  streams {es:.2e}");
        if std::env::var_os("GLM_DEBUG").is_some() {
            for (k, &p) in pos.iter().enumerate() {
                let e1 = cmp(
                    &tr.attn_out[i][p * d..(p + 1) * d],
                    &attn[(i * per + k) * d..(i * per + k + 1) * d],
                    &[0],
                    d,
                );
                eprintln!("   pos {p}: attn {e1:.2e}");
            }
        }
        if let Some(b) = bound {
            assert!(
                es <= b && ea <= b && em <= b,
                "{name}: layer {i} differs from the reference"
            );
        }
    }
}

#[test]
fn hidden_states_f32() {
    layers("lowerbound_sparse_f32", OutType::F32, Some(1e-4));
    layers("softplus_dense_f32", OutType::F32, Some(1e-4));
    layers("real_layout_f32", OutType::F32, Some(1e-4));
}

#[test]
fn hidden_states_bf16_report() {
    layers("lowerbound_sparse_bf16", OutType::Bf16, None);
    layers("softplus_dense_bf16", OutType::Bf16, None);
    layers("real_layout_bf16", OutType::Bf16, None);
}

/// The reference's indexer output of a `full` layer, per query row, as a sorted set.
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

/// Every query's selected tokens equal the reference's (as sets), in the one-call
/// prefill and in each decode step.
fn selections(name: &str) {
    let dir = dir(name);
    let m = model(&dir, OutType::F32);
    let g = golden(&dir);
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
    let mut checked = 0;
    for (li, sel) in &tr.selections {
        let want = reference_sets(&dir.join(format!("indexer_topk_layer{li}.npy")));
        for (q, (ours, theirs)) in sel.iter().zip(&want).enumerate() {
            assert_eq!(ours, theirs, "{name}: layer {li}, prefill query {q}");
        }
        let want_dec = reference_sets(&dir.join(format!("indexer_topk_layer{li}_decode.npy")));
        for (step, t) in dec.iter().enumerate() {
            let ours = &t.selections.iter().find(|(l, _)| l == li).unwrap().1[0];
            assert_eq!(
                ours, &want_dec[step],
                "{name}: layer {li}, decode step {step}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "{name}: two full indexer layers expected");
}

#[test]
fn indexer_selections_lowerbound_sparse() {
    selections("lowerbound_sparse_f32");
}

#[test]
fn indexer_selections_softplus_dense() {
    selections("softplus_dense_f32");
}

#[test]
fn indexer_selections_real_layout() {
    selections("real_layout_f32");
}
