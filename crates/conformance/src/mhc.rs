//! Manifold hyper-connections: `hc_pre` (mixing weights, Sinkhorn, collapse),
//! `hc_post` (write-back) and `hc_head` (final collapse).

use ds4_engine::backend::{Backend, HcShape, HcWeights, Prec};
use ds4_gguf::GgmlType;

use crate::data::{download, upload, weight, weight_of};
use crate::{Report, rel_err};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `fn · (x / rms(x))` per token over its `N·D` streams.
fn mixes(x: &[f32], f: &[f64], m: usize, nd: usize, eps: f64) -> Vec<Vec<f64>> {
    x.chunks(nd)
        .map(|xt| {
            let ms = xt.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / nd as f64;
            let r = 1.0 / (ms + eps).sqrt();
            (0..m)
                .map(|i| {
                    f[i * nd..(i + 1) * nd]
                        .iter()
                        .zip(xt)
                        .map(|(w, &v)| w * v as f64 * r)
                        .sum()
                })
                .collect()
        })
        .collect()
}

/// `(collapsed [D], post [N], comb [N, N])` of one token (the reference's formulas).
fn pre_reference(
    mt: &[f64],
    xt: &[f32],
    base: &[f64],
    scale: &[f64],
    s: &HcShape,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, d, eps) = (s.n, s.d, s.eps as f64);
    let pre: Vec<f64> = (0..n)
        .map(|i| sigmoid(mt[i] * scale[0] + base[i]) + eps)
        .collect();
    let post: Vec<f64> = (0..n)
        .map(|i| 2.0 * sigmoid(mt[n + i] * scale[1] + base[n + i]))
        .collect();
    let mut c: Vec<f64> = (0..n * n)
        .map(|k| mt[2 * n + k] * scale[2] + base[2 * n + k])
        .collect();
    for row in c.chunks_mut(n) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        row.iter_mut().for_each(|v| *v = (*v - m).exp());
        let s: f64 = row.iter().sum();
        row.iter_mut().for_each(|v| *v = *v / s + eps);
    }
    let cols = |c: &mut Vec<f64>| {
        for j in 0..n {
            let s: f64 = (0..n).map(|i| c[i * n + j]).sum::<f64>() + eps;
            for i in 0..n {
                c[i * n + j] /= s;
            }
        }
    };
    cols(&mut c);
    for _ in 1..s.iters {
        for row in c.chunks_mut(n) {
            let s: f64 = row.iter().sum::<f64>() + eps;
            row.iter_mut().for_each(|v| *v /= s);
        }
        cols(&mut c);
    }
    let collapsed = (0..d)
        .map(|k| (0..n).map(|i| pre[i] * xt[i * d + k] as f64).sum())
        .collect();
    (collapsed, post, c)
}

pub fn checks<B: Backend>(r: &mut Report<'_, B>) {
    let s = HcShape {
        n: 4,
        d: 4096,
        iters: 20,
        eps: 1e-6,
        norm_eps: 1e-6,
    };
    // Three rows, and one (decode: one launch on CUDA); 37 rows span three of the CUDA
    // mix kernel's 16-token tiles; 3 streams of 1001 (13 mix rows, a row length that is
    // not a multiple of 4) take its unvectorised loads.
    for (n, d, rows) in [(4, 4096, 3), (4, 4096, 1), (4, 4096, 37), (3, 1001, 20)] {
        let s = HcShape { n, d, ..s };
        let (m, nd, ml) = ((2 + n) * n, n * d, s.mix_len());
        r.check(
            "hc_pre",
            format!("{n} streams × {d}, 20 Sinkhorn iterations, {rows} rows"),
            |b, rng| {
                let x = rng.normal(rows * nd, 1.0);
                let (f, fv) = weight(b, rng, "hc_attn_fn.weight", &[nd, m], GgmlType::F32, 0.02)?;
                let (base, bv) = weight(b, rng, "hc_attn_base.weight", &[m], GgmlType::F32, 0.5)?;
                let sc = [0.7f32, 1.3, 2.0];
                let (scale, sv) =
                    weight_of(b, rng, "hc_attn_scale.weight", &[3], GgmlType::F32, &sc)?;
                let w = HcWeights {
                    fn_: &f,
                    base: &base,
                    scale: &scale,
                };
                let mut out = b.buf(rows * d)?;
                let mut mix = b.buf(rows * ml)?;
                b.hc_pre(&upload(b, &x)?, rows, &w, &s, Prec::F32, &mut out, &mut mix)?;
                let mut want_out = Vec::new();
                let mut want_mix = Vec::new();
                for (t, mt) in mixes(&x, &fv, m, nd, s.norm_eps as f64).iter().enumerate() {
                    let (c, post, comb) = pre_reference(mt, &x[t * nd..(t + 1) * nd], &bv, &sv, &s);
                    want_out.extend(c);
                    want_mix.extend(post);
                    want_mix.extend(comb);
                }
                let e1 = rel_err(&download(b, &out, rows * d)?, &want_out);
                let e2 = rel_err(&download(b, &mix, rows * ml)?, &want_mix);
                Ok((e1.max(e2), 1e-5))
            },
        );
    }
    let (n, d) = (s.n, s.d);
    let (nd, ml) = (n * d, s.mix_len());
    r.check("hc_post", "4 streams × 4096, 3 rows", |b, rng| {
        let x = rng.normal(3 * nd, 1.0);
        let y = rng.normal(3 * d, 1.0);
        let mix: Vec<f32> = (0..3 * ml).map(|_| rng.uniform(0.0, 1.0)).collect();
        let mut xb = upload(b, &x)?;
        b.hc_post(
            &mut xb,
            &upload(b, &y)?,
            &upload(b, &mix)?,
            3,
            &s,
            Prec::F32,
        )?;
        let mut want = Vec::new();
        for t in 0..3 {
            let (post, comb) = mix[t * ml..(t + 1) * ml].split_at(n);
            for j in 0..n {
                for k in 0..d {
                    let acc: f64 = (0..n)
                        .map(|i| comb[i * n + j] as f64 * x[t * nd + i * d + k] as f64)
                        .sum();
                    want.push(post[j] as f64 * y[t * d + k] as f64 + acc);
                }
            }
        }
        Ok((rel_err(&download(b, &xb, 3 * nd)?, &want), 1e-6))
    });
    r.check(
        "hc_head",
        "mean of 4 streams × 4096 (GLM-5.3), 2 rows",
        |b, rng| {
            let x = rng.normal(2 * nd, 1.0);
            let mut out = b.buf(2 * d)?;
            b.hc_head(&upload(b, &x)?, 2, None, &s, Prec::F32, &mut out)?;
            let want: Vec<f64> = (0..2 * d)
                .map(|i| {
                    let (t, k) = (i / d, i % d);
                    (0..n).map(|j| x[t * nd + j * d + k] as f64).sum::<f64>() / n as f64
                })
                .collect();
            Ok((rel_err(&download(b, &out, 2 * d)?, &want), 1e-6))
        },
    );
    r.check(
        "hc_head",
        "learned pre (DeepSeek-V4), 4 streams × 4096, 2 rows",
        |b, rng| {
            let x = rng.normal(2 * nd, 1.0);
            let (f, fv) = weight(b, rng, "hc_head_fn", &[nd, n], GgmlType::F32, 0.02)?;
            let (base, bv) = weight(b, rng, "hc_head_base", &[n], GgmlType::F32, 0.5)?;
            let (scale, sv) = weight_of(b, rng, "hc_head_scale", &[1], GgmlType::F32, &[1.4])?;
            let w = HcWeights {
                fn_: &f,
                base: &base,
                scale: &scale,
            };
            let mut out = b.buf(2 * d)?;
            b.hc_head(&upload(b, &x)?, 2, Some(&w), &s, Prec::F32, &mut out)?;
            let mut want = Vec::new();
            for (t, mt) in mixes(&x, &fv, n, nd, s.norm_eps as f64).iter().enumerate() {
                let pre: Vec<f64> = (0..n)
                    .map(|i| sigmoid(mt[i] * sv[0] + bv[i]) + s.eps as f64)
                    .collect();
                for k in 0..d {
                    want.push(
                        (0..n)
                            .map(|i| pre[i] * x[t * nd + i * d + k] as f64)
                            .sum::<f64>(),
                    );
                }
            }
            Ok((rel_err(&download(b, &out, 2 * d)?, &want), 1e-5))
        },
    );
}
