//! Kimi delta attention (`Glm5NextTextLinearAttention`, `modeling_glm5_next.py`
//! `:663-770`; doc §4): q/k/v projections, the forget-gate projections
//! (`Glm5NextTextForgetGate`, `:339-369`), beta, the delta-rule core
//! ([`crate::backend::Backend::delta_net`]: causal conv + SiLU, L2-normalised q/k, the
//! recurrence), the gated output norm (`Glm5NextTextRMSNormGated`, `:373-393`) and the
//! output projection.
//!
//! Shapes: input `x [S, D]`; `qkv = Hk·dk` channels per projection, head-major; the
//! recurrent state `[Hk, dk, dv]` (`dv = dk`), the conv state the last `Kc − 1` pre-conv
//! rows `[Kc − 1, 3·qkv]` (the reference stores `Kc` columns, of which only these reach an
//! output, doc §4.2).
//!
//! Which form runs follows the reference: one token with a cache state → recurrent;
//! anything else → chunked in 64-token chunks counted from the start of the call. The
//! two agree to float rounding, so splitting a prompt differently only moves the
//! logits by rounding (fixture check `kda_chunk_32`, doc §4.6).

use crate::Result;
use crate::backend::{Backend, DeltaForm, DeltaIn, DeltaShape, DeltaWeights, Prec};

use super::Scratch;
use super::state::{KdaLayer, Plan};

/// The reference's fixed chunk size (`chunk_kimi_delta_attention`, `chunk_size=64`).
pub const CHUNK: usize = 64;

/// One KDA layer's weights (GGUF names in `docs/glm5_next_gguf.md`).
pub struct LinearAttention<B: Backend> {
    pub q_proj: B::Weight,
    pub k_proj: B::Weight,
    pub v_proj: B::Weight,
    /// Depthwise conv kernels `[qkv, Kc]` of the q, k and v channels.
    pub conv: [B::Weight; 3],
    pub f_a_proj: B::Weight,
    pub f_b_proj: B::Weight,
    /// `[qkv]`.
    pub dt_bias: B::Weight,
    /// `exp(A_log)` per head `[Hk]` (the decay rate).
    pub decay: B::Weight,
    pub b_proj: B::Weight,
    pub g_a_proj: B::Weight,
    pub g_b_proj: B::Weight,
    /// `[dk]`.
    pub o_norm: B::Weight,
    pub o_proj: B::Weight,
}

/// What a KDA call needs besides weights and state.
pub(crate) struct KdaCall<'a, B: Backend> {
    pub step: &'a B::Step,
    /// Tokens of the call.
    pub s: usize,
    /// One token continuing a cache: the recurrent form.
    pub decode: bool,
    /// Where the rewind base goes (see [`super::state::Plan`]).
    pub plan: Plan,
    pub shape: &'a DeltaShape,
    pub p: Prec,
}

impl<B: Backend> LinearAttention<B> {
    /// Runs the layer on `sc.hn [s, D]` from the layer's state, which it advances,
    /// writing `sc.y [s, D]`.
    pub(crate) fn forward(
        &self,
        b: &B,
        sc: &mut Scratch<B>,
        st: &mut KdaLayer<B>,
        call: &KdaCall<'_, B>,
    ) -> Result<()> {
        let (s, p, sh) = (call.s, call.p, call.shape);
        // Every product of the input first, then the low-rank second halves: independent
        // products side by side, which a backend may run together.
        b.matmul(&self.q_proj, None, &sc.hn, s, p, &mut sc.q)?;
        b.matmul(&self.k_proj, None, &sc.hn, s, p, &mut sc.k)?;
        b.matmul(&self.v_proj, None, &sc.hn, s, p, &mut sc.v)?;
        b.matmul(&self.f_a_proj, None, &sc.hn, s, p, &mut sc.fa)?;
        b.matmul(&self.b_proj, None, &sc.hn, s, p, &mut sc.beta)?;
        b.matmul(&self.g_a_proj, None, &sc.hn, s, p, &mut sc.ga)?;
        // g₀ = f_b(f_a(x)) (+ dt_bias inside the core); the output gate z = g_b(g_a(x)).
        b.matmul(&self.f_b_proj, None, &sc.fa, s, p, &mut sc.g)?;
        b.matmul(&self.g_b_proj, None, &sc.ga, s, p, &mut sc.z)?;
        let x = DeltaIn {
            q: &sc.q,
            k: &sc.k,
            v: &sc.v,
            g: &sc.g,
            beta: &sc.beta,
        };
        let w = DeltaWeights {
            conv: [&self.conv[0], &self.conv[1], &self.conv[2]],
            dt_bias: &self.dt_bias,
            decay: &self.decay,
        };
        let form = if call.decode {
            DeltaForm::Recurrent
        } else {
            DeltaForm::Chunked(CHUNK)
        };
        match call.plan {
            // The base is taken after `r` tokens: the core runs in two parts (at a chunk
            // boundary, so the chunked form computes the same), journaling only the second.
            Plan::Capture(r) => {
                b.delta_net(
                    call.step,
                    0..r,
                    &x,
                    &w,
                    &mut st.live.as_delta(),
                    None,
                    sh,
                    form,
                    p,
                    &mut sc.o,
                )?;
                b.copy(&st.live.conv, 0, &mut st.base.conv, 0, sh.conv_len())?;
                b.copy(&st.live.s, 0, &mut st.base.s, 0, sh.state_len())?;
                if r < s {
                    b.delta_net(
                        call.step,
                        r..s,
                        &x,
                        &w,
                        &mut st.live.as_delta(),
                        Some(&mut st.journal),
                        sh,
                        form,
                        p,
                        &mut sc.o,
                    )?;
                }
            }
            Plan::Keep | Plan::Fold(_) => b.delta_net(
                call.step,
                0..s,
                &x,
                &w,
                &mut st.live.as_delta(),
                Some(&mut st.journal),
                sh,
                form,
                p,
                &mut sc.o,
            )?,
        }
        // Gated output norm per head over dv, then the output projection.
        b.gated_norm(&sc.o, &sc.z, &self.o_norm, s, sh, p, &mut sc.o2)?;
        b.matmul(&self.o_proj, None, &sc.o2, s, p, &mut sc.y)
    }
}
