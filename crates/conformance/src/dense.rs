//! Memory operations and the dense operations: norms, products, RoPE, SwiGLU, adds.

use ds4_engine::backend::{Backend, Prec, Rope, Yarn};
use ds4_gguf::GgmlType;

use crate::data::{download, upload, weight, wide};
use crate::{FLOAT_TOL, QUANT_TOL, Report, rel_err};

pub fn checks<B: Backend>(r: &mut Report<'_, B>) {
    r.check(
        "copy",
        "4 × 4096 with offsets, fill, write/read",
        |b, rng| {
            let x = rng.normal(4 * 4096, 1.0);
            let src = upload(b, &x)?;
            let mut dst = b.buf(5 * 4096)?;
            b.fill(&mut dst, 0, 5 * 4096, 7.0)?;
            b.copy(&src, 100, &mut dst, 4096, 3 * 4096)?;
            let got = download(b, &dst, 5 * 4096)?;
            let mut want = vec![7.0f64; 5 * 4096];
            for i in 0..3 * 4096 {
                want[4096 + i] = x[100 + i] as f64;
            }
            Ok((rel_err(&got, &want), 0.0))
        },
    );
    r.check(
        "store_rows",
        "7 rows of 512 into a ring of 5 at pos 3",
        |b, rng| {
            let x = rng.normal(7 * 512, 1.0);
            let src = upload(b, &x)?;
            let mut ring = b.buf(5 * 512)?;
            let step = b.step(&[0; 5], 3)?;
            // 5 rows (one per step token) wrap around the ring of 5.
            b.store_rows(&step, &src, 5, 512, &mut ring, 5)?;
            let got = download(b, &ring, 5 * 512)?;
            let mut want = vec![0f64; 5 * 512];
            for i in 0..5 {
                let slot = (3 + i) % 5;
                for j in 0..512 {
                    want[slot * 512 + j] = x[i * 512 + j] as f64;
                }
            }
            Ok((rel_err(&got, &want), 0.0))
        },
    );
    for (ty, std) in [
        (GgmlType::F32, 1.0),
        (GgmlType::Q8_0, 1.0),
        (GgmlType::BF16, 1.0),
    ] {
        r.check(
            "embed",
            format!("{ty} table 1000 × 4096, 4 streams"),
            |b, rng| {
                let (table, held) = weight(b, rng, "token_embd.weight", &[4096, 1000], ty, std)?;
                let tokens = [3u32, 999, 0, 512];
                let step = b.step(&tokens, 10)?;
                let mut out = b.buf(4 * 4 * 4096)?;
                b.embed(&step, &table, 4, Prec::F32, &mut out)?;
                let got = download(b, &out, 4 * 4 * 4096)?;
                let mut want = Vec::new();
                for &t in &tokens {
                    for _ in 0..4 {
                        want.extend_from_slice(&held[t as usize * 4096..(t as usize + 1) * 4096]);
                    }
                }
                Ok((rel_err(&got, &want), 0.0))
            },
        );
    }
    norms(r);
    products(r);
    ropes(r);
    elementwise(r);
}

/// `x · rsqrt(mean(x²) + eps) · w` per row, in f64.
fn rms_reference(x: &[f32], w: Option<&[f64]>, cols: usize, eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / cols as f64;
        let r = 1.0 / (ms + eps).sqrt();
        for (j, &v) in row.iter().enumerate() {
            out.push(v as f64 * r * w.map_or(1.0, |w| w[j]));
        }
    }
    out
}

fn norms<B: Backend>(r: &mut Report<'_, B>) {
    for (p, tol) in [(Prec::Ggml, 1e-6), (Prec::F32, 1e-6), (Prec::Bf16, 8e-3)] {
        r.check(
            "rms_norm",
            format!("3 × 4096 (hidden), {p:?}"),
            |b, rng| {
                let x = rng.normal(3 * 4096, 2.0);
                let (w, wv) = weight(b, rng, "norm.weight", &[4096], GgmlType::F32, 1.0)?;
                let xb = upload(b, &x)?;
                let mut out = b.buf(3 * 4096)?;
                b.rms_norm(&xb, Some(&w), 3, 4096, 1e-5, p, &mut out)?;
                let want = rms_reference(&x, Some(&wv), 4096, 1e-5);
                Ok((rel_err(&download(b, &out, 3 * 4096)?, &want), tol))
            },
        );
    }
    r.check(
        "rms_norm",
        "unweighted, 64 heads × 512 (DeepSeek-V4 q)",
        |b, rng| {
            let x = rng.normal(64 * 512, 1.0);
            let xb = upload(b, &x)?;
            let mut out = b.buf(64 * 512)?;
            b.rms_norm(&xb, None, 64, 512, 1e-6, Prec::F32, &mut out)?;
            let want = rms_reference(&x, None, 512, 1e-6);
            Ok((rel_err(&download(b, &out, 64 * 512)?, &want), 1e-6))
        },
    );
    // DeepSeek-V4's norms: weighted (hidden, q_a, kv) and unweighted per head (q).
    for (p, tol) in [(Prec::F32, 1e-6), (Prec::Bf16, 8e-3)] {
        for (what, rows, cols, weighted) in [
            ("3 × 4096 (hidden)", 3, 4096, true),
            ("unweighted, 2 × 64 heads × 512 (q)", 128, 512, false),
        ] {
            r.check("rms_norm_cast_once", format!("{what}, {p:?}"), |b, rng| {
                let x = rng.normal(rows * cols, 2.0);
                let (w, wv) = weight(b, rng, "norm.weight", &[cols], GgmlType::F32, 1.0)?;
                let xb = upload(b, &x)?;
                let mut out = b.buf(rows * cols)?;
                let w = weighted.then_some(&w);
                b.rms_norm_cast_once(&xb, w, rows, cols, 1e-6, p, &mut out)?;
                let want = rms_reference(&x, weighted.then_some(&wv[..]), cols, 1e-6);
                Ok((rel_err(&download(b, &out, rows * cols)?, &want), tol))
            });
        }
    }
    r.check("layer_norm", "5 × 128 (GLM-5.3 indexer keys)", |b, rng| {
        let x: Vec<f32> = rng.normal(5 * 128, 1.5).iter().map(|v| v + 0.3).collect();
        let (w, wv) = weight(b, rng, "k_norm.weight", &[128], GgmlType::F32, 1.0)?;
        let (bias, bv) = weight(b, rng, "k_norm.bias", &[128], GgmlType::F32, 0.2)?;
        let xb = upload(b, &x)?;
        let mut out = b.buf(5 * 128)?;
        b.layer_norm(&xb, &w, &bias, 5, 128, 1e-6, Prec::F32, &mut out)?;
        let mut want = Vec::new();
        for row in x.chunks(128) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / 128.0;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 128.0;
            for (j, &v) in row.iter().enumerate() {
                want.push((v as f64 - mean) / (var + 1e-6).sqrt() * wv[j] + bv[j]);
            }
        }
        Ok((rel_err(&download(b, &out, 5 * 128)?, &want), 1e-6))
    });
}

/// `out[t, r] = Σ_c w[r, c] · x[t, c]` in f64.
pub(crate) fn product(w: &[f64], x: &[f32], rows: usize, n_out: usize, n_in: usize) -> Vec<f64> {
    let mut out = vec![0f64; rows * n_out];
    for t in 0..rows {
        let xt = &x[t * n_in..(t + 1) * n_in];
        for o in 0..n_out {
            let wr = &w[o * n_in..(o + 1) * n_in];
            out[t * n_out + o] = wr.iter().zip(xt).map(|(a, &b)| a * b as f64).sum();
        }
    }
    out
}

fn products<B: Backend>(r: &mut Report<'_, B>) {
    // (type, n_out, n_in, what, tolerance): float weights are exact products in f32;
    // quantized ones quantize the activations (8-bit blocks) as ggml does.
    let cases: &[(GgmlType, usize, usize, &str, f64)] = &[
        (GgmlType::F32, 1024, 4096, "F32 (router-like)", FLOAT_TOL),
        (GgmlType::BF16, 512, 4096, "BF16 (GLM kv_a)", FLOAT_TOL),
        (GgmlType::F16, 128, 4096, "F16", FLOAT_TOL),
        (GgmlType::Q8_0, 1536, 4096, "Q8_0 (GLM q_a)", QUANT_TOL),
        (GgmlType::Q4_K, 512, 4096, "Q4_K", QUANT_TOL),
        (GgmlType::Q2_K, 256, 2048, "Q2_K (expert down)", QUANT_TOL),
        (
            GgmlType::IQ2_XXS,
            512,
            4096,
            "IQ2_XXS (expert gate/up)",
            QUANT_TOL,
        ),
    ];
    for &(ty, n_out, n_in, what, tol) in cases {
        for rows in [1usize, 5] {
            r.check(
                "matmul",
                format!("{what} {n_out}×{n_in}, {rows} rows"),
                |b, rng| {
                    let (w, wv) = weight(b, rng, "w.weight", &[n_in, n_out], ty, 0.02)?;
                    let x = rng.normal(rows * n_in, 1.0);
                    let xb = upload(b, &x)?;
                    let mut out = b.buf(rows * n_out)?;
                    b.matmul(&w, None, &xb, rows, Prec::F32, &mut out)?;
                    let want = product(&wv, &x, rows, n_out, n_in);
                    Ok((rel_err(&download(b, &out, rows * n_out)?, &want), tol))
                },
            );
        }
    }
    r.check(
        "matmul",
        "Q8_0 896×896 + bias (qwen2), 3 rows, Ggml",
        |b, rng| {
            let (w, wv) = weight(b, rng, "w.weight", &[896, 896], GgmlType::Q8_0, 0.03)?;
            let (bias, bv) = weight(b, rng, "w.bias", &[896], GgmlType::F32, 0.5)?;
            let x = rng.normal(3 * 896, 1.0);
            let xb = upload(b, &x)?;
            let mut out = b.buf(3 * 896)?;
            b.matmul(&w, Some(&bias), &xb, 3, Prec::Ggml, &mut out)?;
            let mut want = product(&wv, &x, 3, 896, 896);
            for (i, v) in want.iter_mut().enumerate() {
                *v += bv[i % 896];
            }
            Ok((rel_err(&download(b, &out, 3 * 896)?, &want), QUANT_TOL))
        },
    );
    // A bf16 model's quantized products: the product rounded to bf16.
    for rows in [1usize, 5] {
        r.check(
            "matmul",
            format!("Q8_0 1024×4096, {rows} rows, Bf16"),
            |b, rng| {
                let (w, wv) = weight(b, rng, "w.weight", &[4096, 1024], GgmlType::Q8_0, 0.02)?;
                let x = rng.normal(rows * 4096, 1.0);
                let xb = upload(b, &x)?;
                let mut out = b.buf(rows * 1024)?;
                b.matmul(&w, None, &xb, rows, Prec::Bf16, &mut out)?;
                let want = product(&wv, &x, rows, 1024, 4096);
                Ok((rel_err(&download(b, &out, rows * 1024)?, &want), QUANT_TOL))
            },
        );
    }
    // DeepSeek-V4's grouped output projection `o_a`: BF16 in the checkpoint's files,
    // Q8_0 in the q2 mix.
    for (ty, rows, p, tol) in [
        (GgmlType::BF16, 2usize, Prec::F32, FLOAT_TOL),
        (GgmlType::Q8_0, 1, Prec::F32, QUANT_TOL),
        (GgmlType::Q8_0, 5, Prec::F32, QUANT_TOL),
        (GgmlType::Q8_0, 2, Prec::Bf16, QUANT_TOL),
    ] {
        r.check(
            "matmul_grouped",
            format!("{ty} 8 groups 4096→1024, {rows} rows (DeepSeek-V4 o_a), {p:?}"),
            |b, rng| {
                let (g, n_in, n_out) = (8, 4096, 1024);
                let (w, wv) = weight(b, rng, "o_a.weight", &[n_in, n_out, g], ty, 0.02)?;
                let x = rng.normal(rows * g * n_in, 1.0);
                let xb = upload(b, &x)?;
                let mut out = b.buf(rows * g * n_out)?;
                b.matmul_grouped(&w, &xb, rows, p, &mut out)?;
                let mut want = Vec::new();
                for t in 0..rows {
                    for gi in 0..g {
                        let xs = &x[(t * g + gi) * n_in..(t * g + gi + 1) * n_in];
                        let ws = &wv[gi * n_out * n_in..(gi + 1) * n_out * n_in];
                        want.extend(product(ws, xs, 1, n_out, n_in));
                    }
                }
                Ok((rel_err(&download(b, &out, rows * g * n_out)?, &want), tol))
            },
        );
    }
}

/// The reference's inverse frequencies: `1 / base^(2i/d)` in f32, YaRN-blended.
fn inv_freq(rope: &Rope) -> Vec<f32> {
    let d = rope.n_dims;
    let base = rope.freq_base;
    let pos_freqs: Vec<f32> = (0..d / 2)
        .map(|i| base.powf((2 * i) as f32 / d as f32))
        .collect();
    let Some(y) = rope.yarn else {
        return pos_freqs.iter().map(|p| 1.0 / p).collect();
    };
    let corr = |rot: f64| {
        d as f64 * (y.original_max_position as f64 / (rot * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (base as f64).ln())
    };
    let (mut lo, mut hi) = (corr(y.beta_fast as f64), corr(y.beta_slow as f64));
    if y.truncate {
        lo = lo.floor();
        hi = hi.ceil();
    }
    let lo = lo.max(0.0);
    let mut hi = hi.min(d as f64 - 1.0);
    if lo == hi {
        hi += 0.001;
    }
    pos_freqs
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let ramp = ((i as f32 - lo as f32) / (hi as f32 - lo as f32)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            (1.0 / (y.factor * p)) * (1.0 - keep) + (1.0 / p) * keep
        })
        .collect()
}

/// `x·cos + rotate(x)·sin` of the rope dims of every head at position `pos0 + row`.
fn rope_reference(
    rope: &Rope,
    x: &[f32],
    heads: usize,
    hd: usize,
    pos0: usize,
    ggml: bool,
) -> Vec<f64> {
    let d = rope.n_dims;
    let half = d / 2;
    let inv = inv_freq(rope);
    let factor = rope.yarn.map_or(1.0, |y| y.mscale as f64);
    let sign = if rope.inverse { -1.0 } else { 1.0 };
    let mut out = wide(x);
    for (t, row) in out.chunks_mut(heads * hd).enumerate() {
        let pos = pos0 + t;
        // ggml advances the angle by repeated f32 products.
        let mut theta = pos as f32;
        let scale = rope.freq_base.powf(-2.0 / d as f32);
        let angles: Vec<f64> = (0..half)
            .map(|i| {
                if ggml {
                    let a = theta;
                    theta *= scale;
                    a as f64
                } else {
                    (pos as f32 * inv[i]) as f64
                }
            })
            .collect();
        for h in row.chunks_mut(hd) {
            let start = if rope.trailing { hd - d } else { 0 };
            let seg = &mut h[start..start + d];
            for (i, &a) in angles.iter().enumerate() {
                let (c, s) = (a.cos() * factor, a.sin() * factor * sign);
                let (ia, ib) = if rope.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (seg[ia], seg[ib]);
                seg[ia] = x0 * c - x1 * s;
                seg[ib] = x1 * c + x0 * s;
            }
        }
    }
    out
}

fn ropes<B: Backend>(r: &mut Report<'_, B>) {
    let ds4_main = Rope {
        trailing: true,
        ..Rope::plain(64, 10000.0, false)
    };
    let ds4_compress = Rope {
        trailing: true,
        yarn: Some(Yarn {
            factor: 16.0,
            original_max_position: 65536,
            beta_fast: 32.0,
            beta_slow: 1.0,
            mscale: 1.0,
            truncate: true,
        }),
        ..Rope::plain(64, 160000.0, false)
    };
    let cases: Vec<(Rope, usize, usize, Prec, &str)> = vec![
        (
            ds4_main,
            64,
            512,
            Prec::F32,
            "DeepSeek-V4 main: 64 of 512 trailing, interleaved",
        ),
        (
            Rope {
                inverse: true,
                ..ds4_compress
            },
            64,
            512,
            Prec::Bf16,
            "DeepSeek-V4 compress inverse, bf16",
        ),
        (
            ds4_compress,
            64,
            512,
            Prec::F32,
            "DeepSeek-V4 compress: YaRN ×16",
        ),
        (
            Rope {
                inverse: true,
                ..ds4_main
            },
            64,
            512,
            Prec::F32,
            "DeepSeek-V4 inverse (attention output)",
        ),
        (
            Rope::plain(64, 1e7, true),
            16,
            256,
            Prec::F32,
            "Qwen3.5: 64 of 256 leading, NEOX",
        ),
        (
            Rope::plain(128, 500000.0, false),
            32,
            128,
            Prec::Ggml,
            "llama3 (ggml), interleaved",
        ),
        (
            Rope::plain(64, 1e6, true),
            14,
            64,
            Prec::Ggml,
            "qwen2 (ggml), NEOX",
        ),
    ];
    for (rope, heads, hd, p, what) in cases {
        r.check("rope", format!("{what}, 3 rows at 4000"), |b, rng| {
            let x = rng.normal(3 * heads * hd, 1.0);
            let mut xb = upload(b, &x)?;
            let step = b.step(&[1, 2, 3], 4000)?;
            b.rope(&step, &rope, heads, hd, p, &mut xb)?;
            let want = rope_reference(&rope, &x, heads, hd, 4000, p == Prec::Ggml);
            let tol = if p == Prec::Bf16 { 8e-3 } else { 1e-5 };
            Ok((rel_err(&download(b, &xb, 3 * heads * hd)?, &want), tol))
        });
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn elementwise<B: Backend>(r: &mut Report<'_, B>) {
    for (limit, p, what) in [
        (Some(10.0f32), Prec::F32, "clamped at 10 (GLM-5.3)"),
        (Some(2.0), Prec::F32, "clamped at 2"),
        (None, Prec::Ggml, "ggml, no clamp"),
    ] {
        r.check("swiglu", format!("2 × 2048, {what}"), |b, rng| {
            let (g, u) = (rng.normal(4096, 6.0), rng.normal(4096, 6.0));
            let (gb, ub) = (upload(b, &g)?, upload(b, &u)?);
            let mut out = b.buf(4096)?;
            b.swiglu(&gb, &ub, 4096, limit, p, &mut out)?;
            let lim = limit.map_or(f64::INFINITY, f64::from);
            let want: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&g, &u)| {
                    let g = (g as f64).min(lim);
                    g * sigmoid(g) * (u as f64).clamp(-lim, lim)
                })
                .collect();
            Ok((rel_err(&download(b, &out, 4096)?, &want), 1e-6))
        });
    }
    r.check("add", "3 × 4096", |b, rng| {
        let (x, y) = (rng.normal(3 * 4096, 1.0), rng.normal(3 * 4096, 1.0));
        let (mut xb, yb) = (upload(b, &x)?, upload(b, &y)?);
        b.add(&mut xb, &yb, 3 * 4096, Prec::F32)?;
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(a, b)| *a as f64 + *b as f64)
            .collect();
        Ok((rel_err(&download(b, &xb, 3 * 4096)?, &want), 1e-7))
    });
    for gate_cols in [1usize, 2048] {
        r.check(
            "scale_sigmoid",
            format!("3 × 2048, gates of {gate_cols}"),
            |b, rng| {
                let (x, g) = (rng.normal(3 * 2048, 1.0), rng.normal(3 * gate_cols, 2.0));
                let (mut xb, gb) = (upload(b, &x)?, upload(b, &g)?);
                b.scale_sigmoid(&mut xb, &gb, 3, 2048, gate_cols, Prec::F32)?;
                let want: Vec<f64> = x
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let (row, col) = (i / 2048, i % 2048);
                        let gi = if gate_cols == 1 {
                            row
                        } else {
                            row * 2048 + col
                        };
                        v as f64 * sigmoid(g[gi] as f64)
                    })
                    .collect();
                Ok((rel_err(&download(b, &xb, 3 * 2048)?, &want), 1e-6))
            },
        );
    }
}
