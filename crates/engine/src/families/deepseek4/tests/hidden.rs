//! Per-layer comparison with the reference's hidden states (`hidden_*` fixture arrays:
//! embeddings, the streams after each layer, attention and MoE block outputs at prompt
//! positions 0..7, S/2, S−2, S−1), to locate a mismatch layer by layer, and the
//! lightning indexer's selections against the reference's, as sets, at every prefill
//! query and decode step. Hidden-state bounds ([`PinnedHidden`]): the embeddings exact,
//! every layer within a margin of its error measured (f32 3×, bf16 2×; layers that
//! matched bit for bit stay exact); each check shows its bounds reject our error grown
//! 10× and our values scaled by 1.01. bf16 also prints the f32 reference's distance to
//! the bf16 one per layer, and asserts that ours is smaller at every layer.

use super::*;
use crate::families::bounds::{HiddenRef, Perturb, PinnedHidden, hidden_err};
use crate::families::deepseek4::Trace;

/// Per layer, the worst of its attention and MoE outputs and streams, measured 2026-12-02
/// (docs/parity.md, DeepSeek-V4 hidden states; 0: equal to the reference's bit for bit).
fn pinned(name: &str) -> PinnedHidden {
    let (layers, margin): (&[f64], f64) = match name {
        "small_rates_f32" => (&[5.57e-7, 8.38e-7, 9.48e-7, 1.19e-6, 1.52e-6], 3.0),
        "real_layout_f32" => (&[8.87e-7, 1.17e-6, 1.40e-6, 2.93e-6, 2.00e-6], 3.0),
        "small_rates_bf16" => (&[3.65e-6, 1.88e-2, 1.27e-2, 2.18e-2, 2.93e-2], 2.0),
        "real_layout_bf16" => (&[0.0, 1.13e-2, 1.24e-2, 1.86e-2, 2.84e-2], 2.0),
        _ => panic!("{name}: no hidden-state measurement pinned"),
    };
    PinnedHidden { layers, margin }
}

/// Every layer's outputs of the one-call prefill against the reference's: f32 from
/// llama.cpp's file, bf16 from our converter's BF16 file.
fn layers(name: &str) {
    let dir = dir(name);
    let bf16 = name.ends_with("_bf16");
    let m = if bf16 {
        load(ours_bytes(&dir, ds4_convert::OutType::Bf16))
    } else {
        llamacpp_model(&dir)
    };
    let g = golden(&dir);
    let h = HiddenRef::load(&dir);
    let c = m.config();
    let (n, d) = (c.hc_mult, c.n_embd);
    let mut cache = m.new_cache(4096).unwrap();
    let mut tr = Trace::default();
    m.forward_traced(&mut *cache, &g.prompt, &mut tr).unwrap();
    let e = hidden_err(&tr.embed, &h.embed, &h.pos, d, Perturb::Off);
    assert!(e == 0.0, "{name}: embeddings {e:.2e}");
    let ours = [&tr.streams[..], &tr.attn_out[..], &tr.mlp_out[..]];
    let errs = |p: Perturb| h.layer_errs(name, "moe", ours, (n, d), p);
    pinned(name).check(name, errs);
    if !bf16 {
        return;
    }
    // The f32 reference's arrays, laid out as ours, against the bf16 reference.
    let f32_dir = dir.to_string_lossy().replace("_bf16", "_f32");
    let f32_dir = std::path::Path::new(&f32_dir);
    let (_, fa) = npy(&f32_dir.join("hidden_attn_out.npy"));
    let (_, fs) = npy(&f32_dir.join("hidden_streams.npy"));
    let per_pos = |a: &[f32], w: usize| -> Vec<f32> {
        let mut v = vec![0f32; (h.pos.iter().max().unwrap() + 1) * w];
        for (k, &p) in h.pos.iter().enumerate() {
            v[p * w..(p + 1) * w].copy_from_slice(&a[k * w..(k + 1) * w]);
        }
        v
    };
    for i in 0..tr.streams.len() {
        let f32_attn = hidden_err(
            &per_pos(&fa[h.at(i, d)], d),
            &h.attn[h.at(i, d)],
            &h.pos,
            d,
            Perturb::Off,
        );
        let f32_streams = hidden_err(
            &per_pos(&fs[h.at(i, n * d)], n * d),
            &h.streams[h.at(i, n * d)],
            &h.pos,
            n * d,
            Perturb::Off,
        );
        let ours_attn = hidden_err(
            &tr.attn_out[i],
            &h.attn[h.at(i, d)],
            &h.pos,
            d,
            Perturb::Off,
        );
        let ours_streams = hidden_err(
            &tr.streams[i],
            &h.streams[h.at(i, n * d)],
            &h.pos,
            n * d,
            Perturb::Off,
        );
        eprintln!(
            "{name} layer {i}: f32 reference: attn {f32_attn:.2e}  streams {f32_streams:.2e}"
        );
        assert!(
            ours_attn < f32_attn && ours_streams < f32_streams,
            "{name} layer {i}: the f32 reference is as close to the bf16 one as ours"
        );
    }
}

#[test]
fn hidden_states_small_rates() {
    layers("small_rates_f32");
}

#[test]
fn hidden_states_real_layout() {
    layers("real_layout_f32");
}

#[test]
fn hidden_states_bf16() {
    layers("small_rates_bf16");
    layers("real_layout_bf16");
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
