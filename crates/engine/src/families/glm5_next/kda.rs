//! Kimi delta attention (`Glm5NextTextLinearAttention`, `modeling_glm5_next.py`
//! `:663-770`; doc §4): q/k/v projections, a causal depthwise conv with SiLU, a
//! per-channel forget gate (`Glm5NextTextForgetGate`, `:339-369`), beta, L2-normalised
//! q/k, the delta-rule recurrence in its chunked (prefill) or recurrent (decode) form,
//! and the gated output norm (`Glm5NextTextRMSNormGated`, `:373-393`).
//!
//! Shapes: input `x [S, D]`; `qkv = Hk·dk` channels per projection, head-major; the
//! recurrent state is `[Hk, dk, dv]` (`dv = dk`), the conv state the last `Kc − 1`
//! pre-conv rows `[Kc − 1, 3·qkv]` (the reference stores `Kc` columns, of which only
//! these reach an output, doc §4.2).
//!
//! Which form runs follows the reference: one token with a cache state → recurrent;
//! anything else → chunked in 64-token chunks counted from the start of the call. The
//! two agree to float rounding, so splitting a prompt differently only moves the
//! logits by rounding (fixture check `kda_chunk_32`, doc §4.6).

use rayon::prelude::*;

use super::ablation::{Ablation, Switches};
use super::config::Gate;
use super::linear::{Acts, Linear};
use super::ops::{Prec, sigmoid, silu, softplus};
use super::state::{Journal, KdaState};

/// The reference's fixed chunk size (`chunk_kimi_delta_attention`, `chunk_size=64`).
pub const CHUNK: usize = 64;

/// One KDA layer's parameters (GGUF names in `docs/glm5_next_gguf.md`).
pub struct LinearAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    /// Depthwise conv weight `[3·qkv, Kc]` (q, k, v channels), kept f32.
    pub conv: Vec<f32>,
    pub f_a_proj: Linear,
    pub f_b_proj: Linear,
    /// `[qkv]`, f32.
    pub dt_bias: Vec<f32>,
    /// `exp(A_log)` per head `[Hk]` (the decay rate), f32.
    pub decay_rate: Vec<f32>,
    pub b_proj: Linear,
    pub g_a_proj: Linear,
    pub g_b_proj: Linear,
    /// `[dk]`.
    pub o_norm: Vec<f32>,
    pub o_proj: Linear,
}

/// Layer settings that do not live in the weights.
#[derive(Clone, Copy)]
pub struct KdaParams {
    pub heads: usize,
    pub head_dim: usize,
    pub kernel: usize,
    pub gate: Gate,
    pub rms_eps: f32,
    pub prec: Prec,
    pub sw: Switches,
}

/// Where the call's tokens sit relative to the cache's rewind journal.
pub struct Capture<'a> {
    /// Capture the state after this many tokens of the call into `base` (a multiple of
    /// [`CHUNK`] or the call length), if any.
    pub at: Option<usize>,
    pub base: &'a mut KdaState,
    /// Record tokens `from..` of the call (relative index) in `journal`.
    pub from: usize,
    pub journal: &'a mut Journal,
}

/// Per-token kernel inputs after the conv, gate and normalisation, all f32: `q` (L2-
/// normalised and scaled by `dk^-½`), `k` (L2-normalised), `v`, `g` (log decay), each
/// `[S, Hk, dk]`, and `beta [S, Hk]`.
pub struct KernelInputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
}

impl LinearAttention {
    /// Runs the layer on `x [s, D]` from state `st`, which it advances. `decode` is true
    /// for a one-token call continuing a cache (the reference's recurrent path).
    pub fn forward(
        &self,
        x: &[f32],
        s: usize,
        st: &mut KdaState,
        decode: bool,
        cap: Capture,
        p: &KdaParams,
    ) -> Vec<f32> {
        let (h, dk) = (p.heads, p.head_dim);
        let qkv = h * dk;
        let d = self.q_proj.cols;
        let acts = Acts::new(x, s, d);
        // q, k, v projections, concatenated channel-wise in the order q, k, v.
        let mut pre = vec![0f32; s * 3 * qkv];
        {
            let mut tmp = vec![0f32; s * qkv];
            for (i, w) in [&self.q_proj, &self.k_proj, &self.v_proj]
                .into_iter()
                .enumerate()
            {
                w.forward_acts(&acts, &mut tmp);
                for t in 0..s {
                    pre[t * 3 * qkv + i * qkv..t * 3 * qkv + (i + 1) * qkv]
                        .copy_from_slice(&tmp[t * qkv..(t + 1) * qkv]);
                }
            }
            p.prec.cast(&mut pre);
        }
        if decode && p.sw.on(Ablation::KdaDecodeConvStateZeroed) {
            st.conv.iter_mut().for_each(|v| *v = 0.0);
        }
        if decode && p.sw.on(Ablation::KdaDecodeStateZeroed) {
            st.s.iter_mut().for_each(|v| *v = 0.0);
        }
        let base_conv = st.conv.clone();
        let mixed = self.conv(&pre, s, &mut st.conv, p);
        let ki = self.kernel_inputs(&acts, &mixed, s, p);
        for t in cap.from..s {
            cap.journal
                .push(&pre[t * 3 * qkv..(t + 1) * 3 * qkv], &ki, t, qkv, h);
        }
        // The kernel, f32; output cast to the model dtype (`:612`).
        let mut o = if decode {
            recurrent(&ki, st, p)
        } else {
            chunked(&ki, s, st, &pre, &base_conv, cap.at, cap.base, p)
        };
        if decode && cap.at == Some(1) {
            cap.base.copy_from(st);
        }
        p.prec.cast(&mut o);
        // Gated output norm per head over dv, f32, cast (`Glm5NextTextRMSNormGated`).
        let mut ga = vec![0f32; s * dk];
        self.g_a_proj.forward_acts(&acts, &mut ga);
        p.prec.cast(&mut ga);
        let mut gate = vec![0f32; s * qkv];
        self.g_b_proj.forward(&ga, s, &mut gate);
        p.prec.cast(&mut gate);
        let ones = vec![1f32; dk];
        let w = if p.sw.on(Ablation::KdaONormWeightOnes) {
            &ones
        } else {
            &self.o_norm
        };
        for (row, grow) in o.chunks_exact_mut(dk).zip(gate.chunks_exact(dk)) {
            let r = super::ops::rms_scale(row, p.rms_eps);
            for ((v, w), g) in row.iter_mut().zip(w).zip(grow) {
                let gated = if p.sw.on(Ablation::KdaOutputGateOff) {
                    1.0
                } else {
                    sigmoid(*g)
                };
                *v = p.prec.one(w * (*v * r) * gated);
            }
        }
        let mut y = vec![0f32; s * d];
        self.o_proj.forward(&o, s, &mut y);
        p.prec.cast(&mut y);
        y
    }

    /// Causal depthwise conv + SiLU over `pre [s, 3·qkv]` continuing `conv_state`
    /// (`[Kc−1, 3·qkv]`, updated), in f32, cast to the model dtype (doc §4.1/4.2).
    fn conv(&self, pre: &[f32], s: usize, conv_state: &mut [f32], p: &KdaParams) -> Vec<f32> {
        let c = pre.len() / s.max(1);
        let kc = p.kernel;
        let hist = kc - 1;
        // full = concat(state, pre): rows 0..hist are the state.
        let mut full = Vec::with_capacity((hist + s) * c);
        full.extend_from_slice(conv_state);
        full.extend_from_slice(pre);
        let mut out = vec![0f32; s * c];
        for t in 0..s {
            let o = &mut out[t * c..(t + 1) * c];
            if p.sw.on(Ablation::KdaConvIdentity) {
                o.copy_from_slice(&full[(t + hist) * c..(t + hist + 1) * c]);
            } else {
                for (ch, ov) in o.iter_mut().enumerate() {
                    let w = &self.conv[ch * kc..(ch + 1) * kc];
                    let mut acc = 0f32;
                    for (sidx, wv) in w.iter().enumerate() {
                        acc += wv * full[(t + sidx) * c + ch];
                    }
                    *ov = acc;
                }
            }
            if !p.sw.on(Ablation::KdaConvNoSilu) {
                o.iter_mut().for_each(|v| *v = silu(*v));
            }
        }
        let total = hist + s;
        conv_state.copy_from_slice(&full[(total - hist) * c..total * c]);
        p.prec.cast(&mut out);
        out
    }

    /// Forget gate, beta and the normalised q/k/v (doc §4.3/4.4).
    fn kernel_inputs(&self, acts: &Acts, mixed: &[f32], s: usize, p: &KdaParams) -> KernelInputs {
        let (h, dk) = (p.heads, p.head_dim);
        let qkv = h * dk;
        let mut q = vec![0f32; s * qkv];
        let mut k = vec![0f32; s * qkv];
        let mut v = vec![0f32; s * qkv];
        for t in 0..s {
            let row = &mixed[t * 3 * qkv..(t + 1) * 3 * qkv];
            q[t * qkv..(t + 1) * qkv].copy_from_slice(&row[..qkv]);
            k[t * qkv..(t + 1) * qkv].copy_from_slice(&row[qkv..2 * qkv]);
            v[t * qkv..(t + 1) * qkv].copy_from_slice(&row[2 * qkv..]);
        }
        // l2norm (+1e-6 inside the square root, `:451-459`), then q · dk^-½, in f32.
        let scale = 1.0 / (dk as f32).sqrt();
        if !p.sw.on(Ablation::KdaQkL2normOff) {
            for (qh, kh) in q.chunks_exact_mut(dk).zip(k.chunks_exact_mut(dk)) {
                for x in [qh, kh] {
                    let n = (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
                    x.iter_mut().for_each(|v| *v /= n);
                }
            }
        }
        q.iter_mut().for_each(|v| *v *= scale);
        // g₀ = f32(f_b(f_a(x))) + dt_bias.
        let mut fa = vec![0f32; s * dk];
        self.f_a_proj.forward_acts(acts, &mut fa);
        p.prec.cast(&mut fa);
        let mut g = vec![0f32; s * qkv];
        self.f_b_proj.forward(&fa, s, &mut g);
        p.prec.cast(&mut g);
        let zero_dt = p.sw.on(Ablation::KdaDtBiasZero);
        let gate = match (p.gate, p.sw.on(Ablation::KdaGateOtherForm)) {
            (Gate::LowerBound(_), true) => Gate::Softplus,
            (Gate::Softplus, true) => Gate::LowerBound(-5.0),
            (gate, false) => gate,
        };
        for t in 0..s {
            for hh in 0..h {
                let a = if p.sw.on(Ablation::KdaALogZero) {
                    1.0
                } else {
                    self.decay_rate[hh]
                };
                for j in 0..dk {
                    let c = hh * dk + j;
                    let g0 = g[t * qkv + c] + if zero_dt { 0.0 } else { self.dt_bias[c] };
                    g[t * qkv + c] = match gate {
                        Gate::LowerBound(lb) => lb * sigmoid(a * g0),
                        Gate::Softplus => -a * softplus(g0),
                    };
                }
            }
        }
        // beta = sigmoid(b_proj x) in the model dtype.
        let mut beta = vec![0f32; s * h];
        self.b_proj.forward_acts(acts, &mut beta);
        p.prec.cast(&mut beta);
        for b in beta.iter_mut() {
            *b = if p.sw.on(Ablation::KdaBetaOne) {
                1.0
            } else {
                p.prec.one(sigmoid(*b))
            };
        }
        KernelInputs { q, k, v, g, beta }
    }
}

/// One step of the delta rule on one head's state `s [dk, dv]` (doc §4.5):
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

/// The recurrent form for one token (`recurrent_kimi_delta_attention`): per head, the
/// delta step then `o = qᵀS`.
fn recurrent(ki: &KernelInputs, st: &mut KdaState, p: &KdaParams) -> Vec<f32> {
    let (h, dk) = (p.heads, p.head_dim);
    let mut o = vec![0f32; h * dk];
    st.s.par_chunks_mut(dk * dk)
        .zip(o.par_chunks_mut(dk))
        .enumerate()
        .for_each(|(hh, (sh, oh))| {
            let r = hh * dk..(hh + 1) * dk;
            delta_step(
                sh,
                &ki.k[r.clone()],
                &ki.v[r.clone()],
                &ki.g[r.clone()],
                ki.beta[hh],
            );
            let q = &ki.q[r];
            for (i, row) in sh.chunks_exact(dk).enumerate() {
                for (oj, sj) in oh.iter_mut().zip(row) {
                    *oj += q[i] * sj;
                }
            }
        });
    o
}

/// The chunked form (`chunk_kimi_delta_attention`, doc §4.6) over `s` tokens from
/// state `st` (updated), chunks of 64 from the start of the call. When `capture_at`
/// is set, the state after that many tokens is copied into `base` (with the conv
/// state at that position, rebuilt from the call's pre-conv rows).
#[allow(clippy::too_many_arguments)]
fn chunked(
    ki: &KernelInputs,
    s: usize,
    st: &mut KdaState,
    pre: &[f32],
    start_conv: &[f32],
    capture_at: Option<usize>,
    base: &mut KdaState,
    p: &KdaParams,
) -> Vec<f32> {
    let (h, dk) = (p.heads, p.head_dim);
    let qkv = h * dk;
    let mut o = vec![0f32; s * qkv];
    let reset = p.sw.on(Ablation::KdaChunkStateReset);
    // Per head, independent: chunk loop carrying the head's state.
    let mut captured = vec![0f32; if capture_at.is_some() { h * dk * dk } else { 0 }];
    let cap_chunks = capture_at.map(|a| a.div_ceil(CHUNK));
    let heads: Vec<(usize, Vec<f32>, Vec<f32>)> =
        st.s.par_chunks_mut(dk * dk)
            .enumerate()
            .map(|(hh, sh)| {
                let mut out = vec![0f32; s * dk];
                let mut cap = Vec::new();
                for (ci, c0) in (0..s).step_by(CHUNK).enumerate() {
                    let n = CHUNK.min(s - c0);
                    if reset && ci > 0 {
                        sh.iter_mut().for_each(|v| *v = 0.0);
                    }
                    chunk_head(ki, hh, c0, n, sh, &mut out, p);
                    if cap_chunks == Some(ci + 1) {
                        cap = sh.to_vec();
                    }
                }
                (hh, out, cap)
            })
            .collect();
    for (hh, out, cap) in heads {
        for t in 0..s {
            o[t * qkv + hh * dk..t * qkv + (hh + 1) * dk]
                .copy_from_slice(&out[t * dk..(t + 1) * dk]);
        }
        if !cap.is_empty() {
            captured[hh * dk * dk..(hh + 1) * dk * dk].copy_from_slice(&cap);
        }
    }
    if let Some(at) = capture_at {
        base.s.copy_from_slice(&captured);
        // Conv state at `at`: the last Kc−1 pre-conv rows before it.
        let c = 3 * qkv;
        let hist = p.kernel - 1;
        let mut full = Vec::with_capacity((hist + at) * c);
        full.extend_from_slice(start_conv);
        full.extend_from_slice(&pre[..at * c]);
        base.conv.copy_from_slice(&full[at * c..(at + hist) * c]);
    }
    o
}

/// One chunk of `n ≤ 64` rows (starting at token `c0`) of head `hh`, padded rows
/// implicit (the reference pads with zeros, which changes nothing for real rows).
fn chunk_head(
    ki: &KernelInputs,
    hh: usize,
    c0: usize,
    n: usize,
    sh: &mut [f32],
    out: &mut [f32],
    p: &KdaParams,
) {
    let dk = p.head_dim;
    let qkv = p.heads * dk;
    let row = |v: &[f32], t: usize| -> Vec<f32> {
        v[(c0 + t) * qkv + hh * dk..(c0 + t) * qkv + (hh + 1) * dk].to_vec()
    };
    let q: Vec<Vec<f32>> = (0..n).map(|t| row(&ki.q, t)).collect();
    let k: Vec<Vec<f32>> = (0..n).map(|t| row(&ki.k, t)).collect();
    let v: Vec<Vec<f32>> = (0..n).map(|t| row(&ki.v, t)).collect();
    let beta: Vec<f32> = (0..n).map(|t| ki.beta[(c0 + t) * p.heads + hh]).collect();
    // G = cumsum of g within the chunk, per channel.
    let mut gc = vec![vec![0f32; dk]; n];
    for t in 0..n {
        let g = row(&ki.g, t);
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
    let mut u = vec![vec![0f32; dk]; n];
    let mut w = vec![vec![0f32; dk]; n];
    for i in 0..n {
        for d in 0..dk {
            u[i][d] = beta[i] * v[i][d];
            w[i][d] = beta[i] * k[i][d] * gc[i][d].exp();
        }
        for j in 0..i {
            let lij = l[i * n + j];
            if lij != 0.0 {
                for d in 0..dk {
                    u[i][d] -= lij * u[j][d];
                    w[i][d] -= lij * w[j][d];
                }
            }
        }
    }
    // Vn = U − W·S ;  O = (q ⊙ exp(G))·S + A·Vn.
    let dv = dk;
    let mut vn = vec![vec![0f32; dv]; n];
    for i in 0..n {
        let mut ws = vec![0f32; dv];
        let mut qs = vec![0f32; dv];
        for (d, srow) in sh.chunks_exact(dv).enumerate() {
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
        let o = &mut out[(c0 + i) * dk..(c0 + i + 1) * dk];
        o.copy_from_slice(&qs);
    }
    for i in 0..n {
        let o = &mut out[(c0 + i) * dk..(c0 + i + 1) * dk];
        for j in 0..=i {
            let aij = a[i * n + j];
            for e in 0..dv {
                o[e] += aij * vn[j][e];
            }
        }
    }
    // S ← S ⊙ exp(G_last)[:, None] + (k ⊙ exp(G_last − G))ᵀ · Vn.
    let last = &gc[n - 1];
    for (d, srow) in sh.chunks_exact_mut(dv).enumerate() {
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
