//! MoE routing and the routed experts.

use ds4_engine::backend::{Backend, Experts, Prec, Routing, Scoring};
use ds4_gguf::GgmlType;

use crate::data::{download, download_ids, upload, weight, weight_of};
use crate::dense::product;
use crate::{EXPERT_TOL, FLOAT_TOL, Report, rel_err};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// The reference router for one token: `(experts, weights)`.
fn route_reference(
    logits: &[f32],
    bias: Option<&[f64]>,
    hashed: Option<&[f64]>,
    r: &Routing,
) -> (Vec<usize>, Vec<f64>) {
    let l: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    let scores: Vec<f64> = match r.scoring {
        Scoring::Sigmoid => l.iter().map(|&x| sigmoid(x)).collect(),
        Scoring::SqrtSoftplus => l.iter().map(|&x| softplus(x).sqrt()).collect(),
        Scoring::Softmax => {
            let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = l.iter().map(|x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|x| x / s).collect()
        }
    };
    let chosen: Vec<usize> = match hashed {
        Some(h) => h.iter().map(|&x| x as usize).collect(),
        None => {
            let mut choice: Vec<f64> = (0..scores.len())
                .map(|i| scores[i] + bias.map_or(0.0, |b| b[i]))
                .collect();
            if r.n_group > 1 {
                let per = scores.len() / r.n_group;
                let mut groups: Vec<(usize, f64)> = (0..r.n_group)
                    .map(|g| {
                        let mut v = choice[g * per..(g + 1) * per].to_vec();
                        v.sort_by(|a, b| b.total_cmp(a));
                        (g, v[0] + v[1])
                    })
                    .collect();
                groups.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                for &(g, _) in &groups[r.topk_group..] {
                    choice[g * per..(g + 1) * per].fill(f64::NEG_INFINITY);
                }
            }
            let mut idx: Vec<usize> = (0..scores.len()).collect();
            idx.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
            idx.truncate(r.n_used);
            idx
        }
    };
    let mut w: Vec<f64> = chosen.iter().map(|&i| scores[i]).collect();
    if r.norm {
        let s: f64 = w.iter().sum::<f64>() + 1e-20;
        w.iter_mut().for_each(|v| *v /= s);
    }
    (chosen, w.iter().map(|v| v * r.scale as f64).collect())
}

/// (label, D, I, experts, k, gate/up type, down type, clamp, rows, tolerance)
/// (what, D, I, experts, k, gate/up type, down type, clamp, rows, tolerance, routing
/// weights' and products' precision).
type ExpertCase = (
    &'static str,
    usize,
    usize,
    usize,
    usize,
    GgmlType,
    GgmlType,
    Option<f32>,
    usize,
    f64,
    Prec,
);

pub fn checks<B: Backend>(r: &mut Report<'_, B>) {
    let glm = Routing {
        scoring: Scoring::Sigmoid,
        n_expert: 288,
        n_used: 8,
        n_group: 1,
        topk_group: 1,
        norm: true,
        scale: 2.5,
    };
    let grouped = Routing {
        n_expert: 256,
        n_group: 8,
        topk_group: 4,
        ..glm
    };
    let ds4 = Routing {
        scoring: Scoring::SqrtSoftplus,
        n_expert: 256,
        n_used: 6,
        n_group: 1,
        topk_group: 1,
        norm: true,
        scale: 1.5,
    };
    let qwen = Routing {
        scoring: Scoring::Softmax,
        n_expert: 256,
        n_used: 8,
        n_group: 1,
        topk_group: 1,
        norm: true,
        scale: 1.0,
    };
    // (routing, bias, hashed, router dtype, weights' tolerance, what): the bf16 router
    // rounds scores, sum and quotients (a few bf16 ulps of the weights); its case is
    // hash-routed, as bf16 scores can reorder near-tied experts against the f64 reference.
    let cases = [
        (
            glm,
            true,
            false,
            Prec::F32,
            1e-6,
            "GLM-5.3: sigmoid, bias, 288 → 8",
        ),
        (
            grouped,
            true,
            false,
            Prec::F32,
            1e-6,
            "sigmoid, bias, 8 groups keep 4, 256 → 8",
        ),
        (
            ds4,
            true,
            false,
            Prec::F32,
            1e-6,
            "DeepSeek-V4: sqrt-softplus, bias, 256 → 6",
        ),
        (
            ds4,
            false,
            true,
            Prec::F32,
            1e-6,
            "DeepSeek-V4: hash routing, 256 → 6",
        ),
        (
            ds4,
            false,
            true,
            Prec::Bf16,
            1.5e-2,
            "DeepSeek-V4: hash routing, bf16 router, 256 → 6",
        ),
        (
            qwen,
            false,
            false,
            Prec::F32,
            1e-6,
            "Qwen3.5: softmax, 256 → 8",
        ),
    ];
    for (routing, with_bias, hashed, p, tol, what) in cases {
        r.check("moe_route", format!("{what}, 4 rows"), |b, rng| {
            let (e, k) = (routing.n_expert, routing.n_used);
            let logits = rng.normal(4 * e, 1.5);
            let (bias, bv) = weight(b, rng, "exp_probs_b.bias", &[e], GgmlType::F32, 0.3)?;
            // tid2eid: distinct experts per token.
            let vocab = 1000;
            let mut table = Vec::with_capacity(vocab * k);
            for _ in 0..vocab {
                let mut row: Vec<f32> = Vec::new();
                while row.len() < k {
                    let x = rng.below(e) as f32;
                    if !row.contains(&x) {
                        row.push(x);
                    }
                }
                table.extend(row);
            }
            let (hash, hv) = weight_of(b, rng, "tid2eid", &[k, vocab], GgmlType::I32, &table)?;
            let tokens = [5u32, 999, 0, 321];
            let step = b.step(&tokens, 7)?;
            let lb = upload(b, &logits)?;
            let mut ids = b.ids(4 * k)?;
            let mut w = b.buf(4 * k)?;
            b.moe_route(
                &step,
                &lb,
                4,
                with_bias.then_some(&bias),
                hashed.then_some(&hash),
                &routing,
                p,
                &mut ids,
                &mut w,
            )?;
            let (got_ids, got_w) = (download_ids(b, &ids, 4 * k)?, download(b, &w, 4 * k)?);
            let mut mismatched = 0usize;
            let mut want_w = Vec::new();
            for t in 0..4 {
                let h = hashed.then(|| &hv[tokens[t] as usize * k..(tokens[t] as usize + 1) * k]);
                let (ids_t, w_t) = route_reference(
                    &logits[t * e..(t + 1) * e],
                    with_bias.then_some(&bv[..]),
                    h,
                    &routing,
                );
                mismatched += ids_t
                    .iter()
                    .zip(&got_ids[t * k..(t + 1) * k])
                    .filter(|(a, b)| **a as i32 != **b)
                    .count();
                want_w.extend(w_t);
            }
            Ok((mismatched as f64 + rel_err(&got_w, &want_w), tol))
        });
    }
    // Steps of many rows take a backend's multi-token path (grouped by expert on CUDA).
    let experts: &[ExpertCase] = &[
        (
            "GLM-5.3 q2 mix",
            4096,
            2048,
            6,
            3,
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            Some(10.0),
            2,
            EXPERT_TOL,
            Prec::F32,
        ),
        (
            "DeepSeek-V4 Q4_K",
            4096,
            2048,
            6,
            3,
            GgmlType::Q4_K,
            GgmlType::Q4_K,
            Some(10.0),
            2,
            EXPERT_TOL,
            Prec::F32,
        ),
        (
            "Qwen3.5 Q8_0",
            2048,
            512,
            16,
            8,
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            None,
            2,
            EXPERT_TOL,
            Prec::F32,
        ),
        (
            "F32",
            256,
            128,
            8,
            2,
            GgmlType::F32,
            GgmlType::F32,
            Some(1.0),
            2,
            FLOAT_TOL,
            Prec::F32,
        ),
        (
            "GLM-5.3 q2 mix",
            1024,
            512,
            16,
            4,
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            Some(10.0),
            48,
            EXPERT_TOL,
            Prec::F32,
        ),
        (
            "DeepSeek-V4 Q4_K",
            1024,
            512,
            16,
            6,
            GgmlType::Q4_K,
            GgmlType::Q4_K,
            Some(10.0),
            40,
            EXPERT_TOL,
            Prec::F32,
        ),
        (
            "Qwen3.5 Q8_0",
            1024,
            256,
            32,
            8,
            GgmlType::Q8_0,
            GgmlType::Q8_0,
            None,
            33,
            EXPERT_TOL,
            Prec::F32,
        ),
        // DeepSeek-V4's bf16 model: bf16 routing weights round each weighted expert
        // output (one token: the fused down + sum; 40: the grouped tensor-core path).
        (
            "DeepSeek-V4 q2 mix, bf16",
            4096,
            2048,
            6,
            3,
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            Some(10.0),
            1,
            EXPERT_TOL,
            Prec::Bf16,
        ),
        (
            "DeepSeek-V4 q2 mix, bf16",
            1024,
            512,
            16,
            6,
            GgmlType::IQ2_XXS,
            GgmlType::Q2_K,
            Some(10.0),
            40,
            EXPERT_TOL,
            Prec::Bf16,
        ),
    ];
    for &(what, d, ff, n_exp, k, gu_ty, down_ty, limit, rows, tol, wp) in experts {
        r.check(
            "moe_experts",
            format!("{what}: {n_exp} experts {ff}×{d}, top-{k}, {rows} rows"),
            |b, rng| {
                let (gate, gv) =
                    weight(b, rng, "ffn_gate_exps.weight", &[d, ff, n_exp], gu_ty, 0.03)?;
                let (up, uv) = weight(b, rng, "ffn_up_exps.weight", &[d, ff, n_exp], gu_ty, 0.03)?;
                let (down, dv) = weight(
                    b,
                    rng,
                    "ffn_down_exps.weight",
                    &[ff, d, n_exp],
                    down_ty,
                    0.03,
                )?;
                let x = rng.normal(rows * d, 1.0);
                let mut ids = Vec::new();
                for _ in 0..rows {
                    let mut row: Vec<i32> = Vec::new();
                    while row.len() < k {
                        let e = rng.below(n_exp) as i32;
                        if !row.contains(&e) {
                            row.push(e);
                        }
                    }
                    ids.extend(row);
                }
                let wts: Vec<f32> = (0..rows * k).map(|_| rng.uniform(0.05, 0.6)).collect();
                // Ids go through a routing call so both backends fill them their way: a
                // hash table routes token t to the experts chosen above.
                let table: Vec<f32> = ids.iter().map(|&e| e as f32).collect();
                let (hash, _) = weight_of(b, rng, "tid2eid", &[k, rows], GgmlType::I32, &table)?;
                let routing = Routing {
                    scoring: Scoring::Sigmoid,
                    n_expert: n_exp,
                    n_used: k,
                    n_group: 1,
                    topk_group: 1,
                    norm: false,
                    scale: 1.0,
                };
                // Logits whose sigmoid scores are the chosen weights.
                let mut logits = vec![0f32; rows * n_exp];
                for t in 0..rows {
                    for j in 0..k {
                        let w = wts[t * k + j];
                        logits[t * n_exp + ids[t * k + j] as usize] = (w / (1.0 - w)).ln();
                    }
                }
                let tokens: Vec<u32> = (0..rows as u32).collect();
                let step = b.step(&tokens, 0)?;
                let mut idb = b.ids(rows * k)?;
                let mut wb = b.buf(rows * k)?;
                b.moe_route(
                    &step,
                    &upload(b, &logits)?,
                    rows,
                    None,
                    Some(&hash),
                    &routing,
                    wp,
                    &mut idb,
                    &mut wb,
                )?;
                let routed_w = download(b, &wb, rows * k)?;
                let xb = upload(b, &x)?;
                let mut out = b.buf(rows * d)?;
                let ex = Experts {
                    gate: &gate,
                    up: &up,
                    down: &down,
                };
                b.moe_experts(&xb, rows, &idb, &wb, k, &ex, limit, wp, wp, &mut out)?;
                let lim = limit.map_or(f64::INFINITY, f64::from);
                let mut want = vec![0f64; rows * d];
                for t in 0..rows {
                    let xt = &x[t * d..(t + 1) * d];
                    for j in 0..k {
                        let e = ids[t * k + j] as usize;
                        let g = product(&gv[e * ff * d..(e + 1) * ff * d], xt, 1, ff, d);
                        let u = product(&uv[e * ff * d..(e + 1) * ff * d], xt, 1, ff, d);
                        let h: Vec<f32> = g
                            .iter()
                            .zip(&u)
                            .map(|(&g, &u)| {
                                let g = g.min(lim);
                                (g * sigmoid(g) * u.clamp(-lim, lim)) as f32
                            })
                            .collect();
                        let y = product(&dv[e * d * ff..(e + 1) * d * ff], &h, 1, d, ff);
                        for (o, v) in want[t * d..(t + 1) * d].iter_mut().zip(y) {
                            *o += routed_w[t * k + j] as f64 * v;
                        }
                    }
                }
                Ok((rel_err(&download(b, &out, rows * d)?, &want), tol))
            },
        );
    }
}
