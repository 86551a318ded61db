//! An f64 reference forward pass of the dense `llama`/`qwen2` graph, written
//! independently of the engine's family and backends, for parity tests: weights are
//! dequantized with `ds4_quant::dequantize_row` and kept in f32, every product and sum
//! is f64, RoPE angles are `pos · base^(-2i/n_dims)` and softmax is exact. Both
//! backends' logits are measured against it (docs/parity.md), so that the CPU's own
//! int8-activation error sets the yardstick for the GPU's.
//!
//! Follows `transformers`' `LlamaForCausalLM`/`Qwen2ForCausalLM` over GGUF tensor
//! names (llama files: Q/K rows permuted for interleaved RoPE, as llama.cpp writes them).

use ds4_gguf::{GgufFile, Value};
use rayon::prelude::*;

use crate::error::{CudaError, Result};

struct Mat {
    w: Vec<f32>,
    rows: usize,
    cols: usize,
}

impl Mat {
    fn mv(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows)
            .into_par_iter()
            .map(|r| {
                self.w[r * self.cols..(r + 1) * self.cols]
                    .iter()
                    .zip(x)
                    .map(|(&a, &b)| a as f64 * b)
                    .sum()
            })
            .collect()
    }
}

fn tensor(f: &GgufFile, name: &str) -> Result<Mat> {
    let t = f
        .tensor(name)
        .ok_or_else(|| CudaError::Unsupported(format!("reference: tensor '{name}' is missing")))?;
    let cols = t.dims[0] as usize;
    let rows = t.n_elements() as usize / cols.max(1);
    let mut w = vec![0f32; rows * cols];
    ds4_quant::dequantize_row(t.dtype, f.tensor_data(t), &mut w)
        .map_err(|e| CudaError::Unsupported(format!("reference: tensor '{name}': {e}")))?;
    Ok(Mat { w, rows, cols })
}

fn vec64(f: &GgufFile, name: &str) -> Result<Vec<f64>> {
    Ok(tensor(f, name)?.w.into_iter().map(f64::from).collect())
}

fn meta(f: &GgufFile, key: &str) -> Result<f64> {
    match f.get(key) {
        Some(Value::U32(v)) => Ok(*v as f64),
        Some(Value::U64(v)) => Ok(*v as f64),
        Some(Value::I32(v)) => Ok(*v as f64),
        Some(Value::F32(v)) => Ok(*v as f64),
        Some(Value::F64(v)) => Ok(*v),
        _ => Err(CudaError::Unsupported(format!(
            "reference: metadata '{key}' is missing"
        ))),
    }
}

fn rms(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let s = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(w).map(|(a, b)| a * s * b).collect()
}

/// Logits after each of `tokens` (one row of `n_vocab` per token).
pub fn logits(f: &GgufFile, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
    let arch = f.architecture()?.to_string();
    let neox = arch == "qwen2";
    let k = |s: &str| format!("{arch}.{s}");
    let n_embd = meta(f, &k("embedding_length"))? as usize;
    let n_layer = meta(f, &k("block_count"))? as usize;
    let n_head = meta(f, &k("attention.head_count"))? as usize;
    let n_head_kv = meta(f, &k("attention.head_count_kv")).unwrap_or(n_head as f64) as usize;
    let hd = n_embd / n_head;
    let n_dims = meta(f, &k("rope.dimension_count")).unwrap_or(hd as f64) as usize;
    let base = meta(f, &k("rope.freq_base")).unwrap_or(10000.0);
    let eps = meta(f, &k("attention.layer_norm_rms_epsilon"))?;
    let emb = tensor(f, "token_embd.weight")?;
    let out = if f.tensor("output.weight").is_some() {
        tensor(f, "output.weight")?
    } else {
        tensor(f, "token_embd.weight")?
    };
    let onorm = vec64(f, "output_norm.weight")?;
    let bias = |name: String| -> Result<Option<Vec<f64>>> {
        if f.tensor(&name).is_some() {
            vec64(f, &name).map(Some)
        } else {
            Ok(None)
        }
    };
    let mut kc = vec![Vec::<Vec<f64>>::new(); n_layer];
    let mut vc = vec![Vec::<Vec<f64>>::new(); n_layer];
    let group = n_head / n_head_kv;
    let mut rows = Vec::with_capacity(tokens.len());
    let layers = (0..n_layer)
        .map(|i| {
            let n = |s: &str| format!("blk.{i}.{s}");
            Ok([
                tensor(f, &n("attn_q.weight"))?,
                tensor(f, &n("attn_k.weight"))?,
                tensor(f, &n("attn_v.weight"))?,
                tensor(f, &n("attn_output.weight"))?,
                tensor(f, &n("ffn_gate.weight"))?,
                tensor(f, &n("ffn_up.weight"))?,
                tensor(f, &n("ffn_down.weight"))?,
            ])
        })
        .collect::<Result<Vec<_>>>()?;
    for (pos, &t) in tokens.iter().enumerate() {
        let t = t as usize;
        let mut x: Vec<f64> = emb.w[t * n_embd..(t + 1) * n_embd]
            .iter()
            .map(|&v| v as f64)
            .collect();
        for (il, [wq, wk, wv, wo, wg, wu, wd]) in layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{il}.{s}");
            let h = rms(&x, &vec64(f, &n("attn_norm.weight"))?, eps);
            let with_bias = |v: Vec<f64>, b: Option<Vec<f64>>| match b {
                Some(b) => v.iter().zip(&b).map(|(a, c)| a + c).collect(),
                None => v,
            };
            let mut q = with_bias(wq.mv(&h), bias(n("attn_q.bias"))?);
            let mut kk = with_bias(wk.mv(&h), bias(n("attn_k.bias"))?);
            let v = with_bias(wv.mv(&h), bias(n("attn_v.bias"))?);
            for x in [&mut q, &mut kk] {
                for head in x.chunks_mut(hd) {
                    for i in 0..n_dims / 2 {
                        let th = pos as f64 * base.powf(-2.0 * i as f64 / n_dims as f64);
                        let (a, b) = if neox {
                            (i, i + n_dims / 2)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0 * th.cos() - x1 * th.sin();
                        head[b] = x0 * th.sin() + x1 * th.cos();
                    }
                }
            }
            kc[il].push(kk);
            vc[il].push(v);
            let mut att = vec![0f64; n_head * hd];
            for (hh, o) in att.chunks_mut(hd).enumerate() {
                let g = hh / group;
                let qh = &q[hh * hd..(hh + 1) * hd];
                let sc: Vec<f64> = kc[il]
                    .iter()
                    .map(|kr| {
                        kr[g * hd..(g + 1) * hd]
                            .iter()
                            .zip(qh)
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for (p, vr) in e.iter().zip(&vc[il]) {
                    for (d, od) in o.iter_mut().enumerate() {
                        *od += p / z * vr[g * hd + d];
                    }
                }
            }
            for (a, b) in x.iter_mut().zip(wo.mv(&att)) {
                *a += b;
            }
            let h = rms(&x, &vec64(f, &n("ffn_norm.weight"))?, eps);
            let (g, u) = (wg.mv(&h), wu.mv(&h));
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (a, b) in x.iter_mut().zip(wd.mv(&act)) {
                *a += b;
            }
        }
        rows.push(
            out.mv(&rms(&x, &onorm, eps))
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        );
    }
    Ok(rows)
}
