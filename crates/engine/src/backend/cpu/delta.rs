//! Delta-rule linear attention on the CPU ([`crate::backend::Backend::delta_net`],
//! [`delta_replay`](crate::backend::Backend::delta_replay),
//! [`gated_norm`](crate::backend::Backend::gated_norm)), following GLM-5.3's
//! `Glm5NextTextLinearAttention` (Kimi delta attention: per-channel forget gate,
//! `recurrent_kimi_delta_attention` / `chunk_kimi_delta_attention` with 64-token
//! chunks, `Glm5NextTextRMSNormGated`) and Qwen3.5's gated delta net (one decay per
//! head, `silu` output gate).
//!
//! Shapes: q, k rows `[Hk, dk]`, v rows `[Hv, dv]`; value head `h` reads query/key
//! head `h / (Hv/Hk)`; the recurrent state `[Hv, dk, dv]`; log decays per value head
//! `dk` channels (KDA) or one broadcast to all (gated delta net). The recurrent and
//! chunked forms agree to float rounding.

use std::ops::Range;

use rayon::prelude::*;

use super::CpuBackend;
use super::torch_math::{rms_scale, sigmoid, silu, softplus};
use crate::backend::{DeltaForm, DeltaShape, Gate, OutGate, Prec};
use crate::{EngineError, Result};

/// Per-token kernel inputs after the conv, gates and normalisation, f32: `q` (L2-
/// normalised, times `dk^-½`), `k` (L2-normalised) `[n, Hk·dk]`, `v` `[n, Hv·dv]`, `g`
/// (log decay) `[n, Hv·gc]`, `beta` `[n, Hv]`.
pub struct Kernel {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
}

/// Causal depthwise conv + SiLU of `pre [n, C]` (rows of q|k|v channels) continuing
/// `state [Kc−1, C]` (updated), rounded; `w` the q, k, v kernels `[Cx, Kc]`.
pub fn conv(
    b: &CpuBackend,
    pre: &[f32],
    n: usize,
    w: [&[f32]; 3],
    state: &mut [f32],
    sh: &DeltaShape,
    p: Prec,
) -> Vec<f32> {
    let c = pre.len() / n.max(1);
    let kc = sh.kernel;
    let hist = kc - 1;
    let (cq, ck) = (sh.qk_len(), sh.qk_len());
    let kernel_of = |ch: usize| -> &[f32] {
        if ch < cq {
            &w[0][ch * kc..(ch + 1) * kc]
        } else if ch < cq + ck {
            &w[1][(ch - cq) * kc..(ch - cq + 1) * kc]
        } else {
            &w[2][(ch - cq - ck) * kc..(ch - cq - ck + 1) * kc]
        }
    };
    // full = concat(state, pre): rows 0..hist are the state.
    let mut full = Vec::with_capacity((hist + n) * c);
    full.extend_from_slice(state);
    full.extend_from_slice(pre);
    let mut out = vec![0f32; n * c];
    let identity = crate::ablated!(b, KdaConvIdentity);
    let no_silu = crate::ablated!(b, KdaConvNoSilu);
    for t in 0..n {
        let o = &mut out[t * c..(t + 1) * c];
        if identity {
            o.copy_from_slice(&full[(t + hist) * c..(t + hist + 1) * c]);
        } else {
            for (ch, ov) in o.iter_mut().enumerate() {
                let wk = kernel_of(ch);
                let mut acc = 0f32;
                for (sidx, wv) in wk.iter().enumerate() {
                    acc += wv * full[(t + sidx) * c + ch];
                }
                *ov = acc;
            }
        }
        if !no_silu {
            o.iter_mut().for_each(|v| *v = silu(*v));
        }
    }
    let total = hist + n;
    state.copy_from_slice(&full[(total - hist) * c..total * c]);
    p.round_all(&mut out);
    out
}

/// The forget gate, beta and normalised q/k/v of `n` tokens from the conv output
/// `mixed [n, C]`, the gate projection `g0 [n, Hv·gc]` and beta logits `b [n, Hv]`.
#[allow(clippy::too_many_arguments)]
pub fn kernel_inputs(
    b: &CpuBackend,
    mixed: &[f32],
    g0: &[f32],
    beta_logits: &[f32],
    n: usize,
    dt_bias: &[f32],
    decay: &[f32],
    sh: &DeltaShape,
    p: Prec,
) -> Kernel {
    let (qk, vl) = (sh.qk_len(), sh.v_len());
    let c = 2 * qk + vl;
    let mut q = vec![0f32; n * qk];
    let mut k = vec![0f32; n * qk];
    let mut v = vec![0f32; n * vl];
    for t in 0..n {
        let row = &mixed[t * c..(t + 1) * c];
        q[t * qk..(t + 1) * qk].copy_from_slice(&row[..qk]);
        k[t * qk..(t + 1) * qk].copy_from_slice(&row[qk..2 * qk]);
        v[t * vl..(t + 1) * vl].copy_from_slice(&row[2 * qk..]);
    }
    // l2norm (+1e-6 inside the square root), then q · dk^-½, in f32.
    let dk = sh.k_dim;
    let scale = 1.0 / (dk as f32).sqrt();
    if !crate::ablated!(b, KdaQkL2normOff) {
        for (qh, kh) in q.chunks_exact_mut(dk).zip(k.chunks_exact_mut(dk)) {
            for x in [qh, kh] {
                let norm = (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
                x.iter_mut().for_each(|v| *v /= norm);
            }
        }
    }
    q.iter_mut().for_each(|v| *v *= scale);
    let gate = match (sh.gate, crate::ablated!(b, KdaGateOtherForm)) {
        (Gate::LowerBound(_), true) => Gate::Softplus,
        (Gate::Softplus, true) => Gate::LowerBound(-5.0),
        (gate, false) => gate,
    };
    let zero_dt = crate::ablated!(b, KdaDtBiasZero);
    let unit_decay = crate::ablated!(b, KdaALogZero);
    let (hv, gc) = (sh.v_heads, sh.gate_channels);
    let gl = hv * gc;
    let mut g = vec![0f32; n * gl];
    for t in 0..n {
        for (h, &rate) in decay.iter().enumerate().take(hv) {
            let a = if unit_decay { 1.0 } else { rate };
            for j in 0..gc {
                let ch = h * gc + j;
                let x = g0[t * gl + ch] + if zero_dt { 0.0 } else { dt_bias[ch] };
                g[t * gl + ch] = match gate {
                    Gate::LowerBound(lb) => lb * sigmoid(a * x),
                    Gate::Softplus => -a * softplus(x),
                };
            }
        }
    }
    let one = crate::ablated!(b, KdaBetaOne);
    let beta = beta_logits[..n * hv]
        .iter()
        .map(|&x| if one { 1.0 } else { p.round(sigmoid(x)) })
        .collect();
    Kernel { q, k, v, g, beta }
}

/// One head's log decays `[dk]` of token `t` (broadcast when one per head).
fn head_g<'a>(
    ki: &'a Kernel,
    t: usize,
    h: usize,
    sh: &DeltaShape,
    buf: &'a mut Vec<f32>,
) -> &'a [f32] {
    let gc = sh.gate_channels;
    let row = &ki.g[(t * sh.v_heads + h) * gc..(t * sh.v_heads + h + 1) * gc];
    if gc == sh.k_dim {
        row
    } else {
        buf.clear();
        buf.resize(sh.k_dim, row[0]);
        buf
    }
}

/// One step of the delta rule on one head's state `s [dk, dv]`:
/// `S ← S ⊙ exp(g)[:, None]; δ = (v − kᵀS)·β; S ← S + k ⊗ δ`.
#[inline]
pub fn delta_step(s: &mut [f32], k: &[f32], v: &[f32], g: &[f32], beta: f32) {
    let dv = v.len();
    let mut u = vec![0f32; dv];
    for (i, (row, gi)) in s.chunks_exact_mut(dv).zip(g).enumerate() {
        let e = gi.exp();
        let ki = k[i];
        for (r, uj) in row.iter_mut().zip(u.iter_mut()) {
            *r *= e;
            *uj += ki * *r;
        }
    }
    for (uj, vj) in u.iter_mut().zip(v) {
        *uj = (vj - *uj) * beta;
    }
    for (row, ki) in s.chunks_exact_mut(dv).zip(k) {
        for (r, dj) in row.iter_mut().zip(&u) {
            *r += ki * dj;
        }
    }
}

/// The recurrent form over the `n` tokens of `ki` (one step after another): per head,
/// the delta step then `o = qᵀS`. Returns `o [n, Hv·dv]`.
fn recurrent(ki: &Kernel, n: usize, s: &mut [f32], sh: &DeltaShape) -> Vec<f32> {
    let (dk, dv, hv) = (sh.k_dim, sh.v_dim, sh.v_heads);
    let group = hv / sh.k_heads;
    let mut o = vec![0f32; n * hv * dv];
    for t in 0..n {
        s.par_chunks_mut(dk * dv)
            .zip(o[t * hv * dv..(t + 1) * hv * dv].par_chunks_mut(dv))
            .enumerate()
            .for_each(|(h, (sh_, oh))| {
                let kh = h / group;
                let qk = (t * sh.k_heads + kh) * dk..(t * sh.k_heads + kh + 1) * dk;
                let mut gbuf = Vec::new();
                let g = head_g(ki, t, h, sh, &mut gbuf);
                delta_step(
                    sh_,
                    &ki.k[qk.clone()],
                    &ki.v[(t * hv + h) * dv..(t * hv + h + 1) * dv],
                    g,
                    ki.beta[t * hv + h],
                );
                let q = &ki.q[qk];
                for (i, row) in sh_.chunks_exact(dv).enumerate() {
                    for (oj, sj) in oh.iter_mut().zip(row) {
                        *oj += q[i] * sj;
                    }
                }
            });
    }
    o
}

/// The chunked form over `n` tokens in chunks of `chunk` from the first, per head
/// independently. Returns `o [n, Hv·dv]`.
fn chunked(
    b: &CpuBackend,
    ki: &Kernel,
    n: usize,
    s: &mut [f32],
    sh: &DeltaShape,
    chunk: usize,
) -> Vec<f32> {
    let (dk, dv, hv) = (sh.k_dim, sh.v_dim, sh.v_heads);
    let reset = crate::ablated!(b, KdaChunkStateReset);
    let heads: Vec<Vec<f32>> = s
        .par_chunks_mut(dk * dv)
        .enumerate()
        .map(|(h, sh_)| {
            let mut out = vec![0f32; n * dv];
            for (ci, c0) in (0..n).step_by(chunk).enumerate() {
                if reset && ci > 0 {
                    sh_.iter_mut().for_each(|v| *v = 0.0);
                }
                chunk_head(ki, h, c0, chunk.min(n - c0), sh_, &mut out, sh);
            }
            out
        })
        .collect();
    let mut o = vec![0f32; n * hv * dv];
    for (h, out) in heads.into_iter().enumerate() {
        for t in 0..n {
            o[(t * hv + h) * dv..(t * hv + h + 1) * dv].copy_from_slice(&out[t * dv..(t + 1) * dv]);
        }
    }
    o
}

/// One chunk of `n` rows (starting at token `c0`) of value head `h`
/// (`chunk_kimi_delta_attention`; padded rows are implicit: the reference pads with
/// zeros, which changes nothing for real rows).
fn chunk_head(
    ki: &Kernel,
    h: usize,
    c0: usize,
    n: usize,
    s: &mut [f32],
    out: &mut [f32],
    sh: &DeltaShape,
) {
    let (dk, dv, hv) = (sh.k_dim, sh.v_dim, sh.v_heads);
    let kh = h / (hv / sh.k_heads);
    let qk_row = |v: &[f32], t: usize| -> Vec<f32> {
        let base = ((c0 + t) * sh.k_heads + kh) * dk;
        v[base..base + dk].to_vec()
    };
    let q: Vec<Vec<f32>> = (0..n).map(|t| qk_row(&ki.q, t)).collect();
    let k: Vec<Vec<f32>> = (0..n).map(|t| qk_row(&ki.k, t)).collect();
    let v: Vec<Vec<f32>> = (0..n)
        .map(|t| ki.v[((c0 + t) * hv + h) * dv..((c0 + t) * hv + h + 1) * dv].to_vec())
        .collect();
    let beta: Vec<f32> = (0..n).map(|t| ki.beta[(c0 + t) * hv + h]).collect();
    // G = cumsum of g within the chunk, per channel.
    let mut gc = vec![vec![0f32; dk]; n];
    let mut gbuf = Vec::new();
    for t in 0..n {
        let g = head_g(ki, c0 + t, h, sh, &mut gbuf);
        for j in 0..dk {
            gc[t][j] = g[j] + if t > 0 { gc[t - 1][j] } else { 0.0 };
        }
    }
    // L[i][j] = βᵢ Σ_d kᵢ kⱼ exp(Gᵢ − Gⱼ) (j < i);  A[i][j] = Σ_d qᵢ kⱼ exp(Gᵢ − Gⱼ) (j ≤ i).
    let mut l = vec![0f32; n * n];
    let mut a = vec![0f32; n * n];
    for i in 0..n {
        for j in 0..=i {
            let (mut sl, mut sa) = (0f32, 0f32);
            for d in 0..dk {
                let e = (gc[i][d] - gc[j][d]).exp();
                sl += k[i][d] * k[j][d] * e;
                sa += q[i][d] * k[j][d] * e;
            }
            if j < i {
                l[i * n + j] = beta[i] * sl;
            }
            a[i * n + j] = sa;
        }
    }
    // T = (I + L)⁻¹ applied by forward substitution: U = T·(β⊙v), W = T·(β⊙k⊙exp(G)).
    let mut u = vec![vec![0f32; dv]; n];
    let mut w = vec![vec![0f32; dk]; n];
    for i in 0..n {
        for e in 0..dv {
            u[i][e] = beta[i] * v[i][e];
        }
        for d in 0..dk {
            w[i][d] = beta[i] * k[i][d] * gc[i][d].exp();
        }
        for j in 0..i {
            let lij = l[i * n + j];
            if lij != 0.0 {
                let (done, rest) = u.split_at_mut(i);
                for (ui, uj) in rest[0].iter_mut().zip(&done[j]) {
                    *ui -= lij * uj;
                }
                let (done, rest) = w.split_at_mut(i);
                for (wi, wj) in rest[0].iter_mut().zip(&done[j]) {
                    *wi -= lij * wj;
                }
            }
        }
    }
    // Vn = U − W·S ;  O = (q ⊙ exp(G))·S + A·Vn.
    let mut vn = vec![vec![0f32; dv]; n];
    for i in 0..n {
        let mut ws = vec![0f32; dv];
        let mut qs = vec![0f32; dv];
        for (d, srow) in s.chunks_exact(dv).enumerate() {
            let wd = w[i][d];
            let qd = q[i][d] * gc[i][d].exp();
            for e in 0..dv {
                ws[e] += wd * srow[e];
                qs[e] += qd * srow[e];
            }
        }
        for e in 0..dv {
            vn[i][e] = u[i][e] - ws[e];
        }
        out[(c0 + i) * dv..(c0 + i + 1) * dv].copy_from_slice(&qs);
    }
    for i in 0..n {
        let o = &mut out[(c0 + i) * dv..(c0 + i + 1) * dv];
        for j in 0..=i {
            let aij = a[i * n + j];
            for e in 0..dv {
                o[e] += aij * vn[j][e];
            }
        }
    }
    // S ← S ⊙ exp(G_last)[:, None] + (k ⊙ exp(G_last − G))ᵀ · Vn.
    let last = &gc[n - 1];
    for (d, srow) in s.chunks_exact_mut(dv).enumerate() {
        let e_last = last[d].exp();
        for x in srow.iter_mut() {
            *x *= e_last;
        }
        for i in 0..n {
            let kd = k[i][d] * (last[d] - gc[i][d]).exp();
            for e in 0..dv {
                srow[e] += kd * vn[i][e];
            }
        }
    }
}

/// The state and journal of [`run`], as plain slices.
pub struct Io<'a> {
    pub conv_state: &'a mut [f32],
    pub s: &'a mut [f32],
    /// `(cap, pre, k, v, g, beta)` of the journal.
    pub journal: Option<(usize, [&'a mut [f32]; 5])>,
}

/// [`crate::backend::Backend::delta_net`] over rows `rows` of the inputs, the first at
/// position `pos`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    b: &CpuBackend,
    pos: usize,
    rows: Range<usize>,
    x: [&[f32]; 5],
    conv_w: [&[f32]; 3],
    dt_bias: &[f32],
    decay: &[f32],
    io: Io<'_>,
    sh: &DeltaShape,
    form: DeltaForm,
    p: Prec,
    out: &mut [f32],
) -> Result<()> {
    let (qk, vl, hv) = (sh.qk_len(), sh.v_len(), sh.v_heads);
    let c = 2 * qk + vl;
    let n = rows.len();
    let [q, k, v, g0, bl] = x;
    let need = |buf: &[f32], w: usize, what: &str| -> Result<()> {
        if buf.len() < rows.end * w {
            return Err(EngineError::Backend(format!(
                "delta_net {what}: {} values for {} rows of {w}",
                buf.len(),
                rows.end
            )));
        }
        Ok(())
    };
    need(q, qk, "q")?;
    need(k, qk, "k")?;
    need(v, vl, "v")?;
    need(g0, sh.g_len(), "g")?;
    need(bl, hv, "beta")?;
    need(out, vl, "out")?;
    if io.conv_state.len() != sh.conv_len() || io.s.len() != sh.state_len() {
        return Err(EngineError::Backend(
            "delta_net: state buffers of the wrong size".into(),
        ));
    }
    let recurrent_form = form == DeltaForm::Recurrent;
    if recurrent_form && crate::ablated!(b, KdaDecodeConvStateZeroed) {
        io.conv_state.iter_mut().for_each(|v| *v = 0.0);
    }
    if recurrent_form && crate::ablated!(b, KdaDecodeStateZeroed) {
        io.s.iter_mut().for_each(|v| *v = 0.0);
    }
    // Pre-conv rows q|k|v.
    let mut pre = vec![0f32; n * c];
    for (i, t) in rows.clone().enumerate() {
        let r = &mut pre[i * c..(i + 1) * c];
        r[..qk].copy_from_slice(&q[t * qk..(t + 1) * qk]);
        r[qk..2 * qk].copy_from_slice(&k[t * qk..(t + 1) * qk]);
        r[2 * qk..].copy_from_slice(&v[t * vl..(t + 1) * vl]);
    }
    let mixed = conv(b, &pre, n, conv_w, io.conv_state, sh, p);
    let gl = sh.g_len();
    let ki = kernel_inputs(
        b,
        &mixed,
        &g0[rows.start * gl..rows.end * gl],
        &bl[rows.start * hv..rows.end * hv],
        n,
        dt_bias,
        decay,
        sh,
        p,
    );
    if let Some((cap, [jp, jk, jv, jg, jb])) = io.journal {
        for i in 0..n {
            let slot = (pos + i) % cap;
            jp[slot * c..(slot + 1) * c].copy_from_slice(&pre[i * c..(i + 1) * c]);
            jk[slot * qk..(slot + 1) * qk].copy_from_slice(&ki.k[i * qk..(i + 1) * qk]);
            jv[slot * vl..(slot + 1) * vl].copy_from_slice(&ki.v[i * vl..(i + 1) * vl]);
            jg[slot * gl..(slot + 1) * gl].copy_from_slice(&ki.g[i * gl..(i + 1) * gl]);
            jb[slot * hv..(slot + 1) * hv].copy_from_slice(&ki.beta[i * hv..(i + 1) * hv]);
        }
    }
    let mut o = match form {
        DeltaForm::Recurrent => recurrent(&ki, n, io.s, sh),
        DeltaForm::Chunked(ch) => chunked(b, &ki, n, io.s, sh, ch.max(1)),
    };
    p.round_all(&mut o);
    out[rows.start * vl..rows.end * vl].copy_from_slice(&o);
    Ok(())
}

/// [`crate::backend::Backend::delta_replay`] from journal slices
/// `(cap, pre, k, v, g, beta)`.
pub fn replay(
    journal: (usize, [&[f32]; 5]),
    range: Range<usize>,
    sh: &DeltaShape,
    conv_state: &mut [f32],
    s: &mut [f32],
) {
    let (cap, [jp, jk, jv, jg, jb]) = journal;
    let (qk, vl, hv, dk, dv) = (sh.qk_len(), sh.v_len(), sh.v_heads, sh.k_dim, sh.v_dim);
    let c = 2 * qk + vl;
    let gl = sh.g_len();
    let group = hv / sh.k_heads;
    for pos in range {
        let slot = pos % cap;
        if !conv_state.is_empty() {
            conv_state.rotate_left(c);
            let n = conv_state.len();
            conv_state[n - c..].copy_from_slice(&jp[slot * c..(slot + 1) * c]);
        }
        let mut gbuf = vec![0f32; dk];
        for h in 0..hv {
            let kh = h / group;
            let g = &jg[slot * gl + h * sh.gate_channels..slot * gl + (h + 1) * sh.gate_channels];
            let g = if sh.gate_channels == dk {
                g
            } else {
                gbuf.iter_mut().for_each(|x| *x = g[0]);
                &gbuf[..]
            };
            delta_step(
                &mut s[h * dk * dv..(h + 1) * dk * dv],
                &jk[slot * qk + kh * dk..slot * qk + (kh + 1) * dk],
                &jv[slot * vl + h * dv..slot * vl + (h + 1) * dv],
                g,
                jb[slot * hv + h],
            );
        }
    }
}

/// [`crate::backend::Backend::gated_norm`] over `rows` rows of `[Hv, dv]`.
#[allow(clippy::too_many_arguments)]
pub fn gated_norm(
    b: &CpuBackend,
    o: &[f32],
    z: &[f32],
    w: &[f32],
    rows: usize,
    sh: &DeltaShape,
    p: Prec,
    out: &mut [f32],
) {
    let dv = sh.v_dim;
    let n = rows * sh.v_heads * dv;
    let ones = vec![1f32; dv];
    let w = if crate::ablated!(b, KdaONormWeightOnes) {
        &ones[..]
    } else {
        w
    };
    let gate_off = crate::ablated!(b, KdaOutputGateOff);
    for ((orow, zrow), dst) in o[..n]
        .chunks_exact(dv)
        .zip(z[..n].chunks_exact(dv))
        .zip(out[..n].chunks_exact_mut(dv))
    {
        let r = rms_scale(orow, sh.eps);
        for (((d, &ov), &wv), &zv) in dst.iter_mut().zip(orow).zip(w).zip(zrow) {
            *d = match sh.out_gate {
                OutGate::Sigmoid => {
                    let gated = if gate_off { 1.0 } else { sigmoid(zv) };
                    p.round(wv * (ov * r) * gated)
                }
                // Qwen3.5 `RMSNormGated`: weight · round(x·r), times silu(f32 gate).
                OutGate::Silu => p.round(wv * p.round(ov * r) * silu(zv)),
            };
        }
    }
}
