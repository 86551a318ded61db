//! DeepSeek-V4's MoE (`DeepseekV4SparseMoeBlock`, `modeling_deepseek_v4.py:1131-1148`;
//! doc §7): the router (`DeepseekV4TopKRouter` `:1079-1097`, or `DeepseekV4HashRouter`
//! `:1100-1128` in the leading `hash_moe` layers), the routed experts (`grouped_mm`
//! path) and the shared expert (`DeepseekV4MLP` `:1020-1035`).
//!
//! ```text
//! logits = x·gateᵀ;  s = sqrt(softplus(logits))              router in the model dtype
//! moe:      idx = top-k(s + e_score_correction_bias)         hash: idx = tid2eid[token]
//! w = s[idx] / (Σ s[idx] + 1e-20) · routed_scaling_factor    always renormalised
//! y = Σ_k w_k · expert_k(x) + shared(x)                      SwiGLU clamped: gate ≤ lim, |up| ≤ lim
//! ```

use crate::Result;
use crate::backend::{Backend, Experts, Prec, Routing};

use super::Scratch;

/// A SwiGLU MLP (the shared expert).
pub struct Mlp<B: Backend> {
    pub gate_proj: B::Weight,
    pub up_proj: B::Weight,
    pub down_proj: B::Weight,
    pub ff: usize,
}

/// One layer's MoE block.
pub struct Moe<B: Backend> {
    /// Router weight `gate.weight [E, D]` (model dtype).
    pub gate: B::Weight,
    /// `e_score_correction_bias [E]` (kept f32) of a score-routed layer.
    pub bias: Option<B::Weight>,
    /// `tid2eid [V, k]` of a hash-routed layer.
    pub tid2eid: Option<B::Weight>,
    /// Stacked experts: gate and up `[E, I, D]`, down `[E, D, I]`.
    pub gate_exps: B::Weight,
    pub up_exps: B::Weight,
    pub down_exps: B::Weight,
    pub shared: Mlp<B>,
}

/// Per-call settings.
pub(crate) struct MoeCall<'a, B: Backend> {
    pub step: &'a B::Step,
    pub s: usize,
    pub d: usize,
    pub routing: Routing,
    pub limit_exp: Option<f32>,
    pub limit_shexp: Option<f32>,
    pub p: Prec,
    /// Test switches.
    pub hash: bool,
    pub shared: bool,
}

impl<B: Backend> Mlp<B> {
    /// The activation `act = swiglu(gate·x, up·x) [s, ff]` for `x [s, D]`.
    fn act(
        &self,
        b: &B,
        x: &B::Buf,
        s: usize,
        limit: Option<f32>,
        p: Prec,
        tmp: [&mut B::Buf; 3],
    ) -> Result<()> {
        let [gate, up, act] = tmp;
        b.matmul(&self.gate_proj, None, x, s, p, gate)?;
        b.matmul(&self.up_proj, None, x, s, p, up)?;
        b.swiglu(gate, up, s * self.ff, limit, p, act)
    }
}

impl<B: Backend> Moe<B> {
    /// `sc.y [s, D]` for `sc.hn [s, D]`. The shared expert runs first (the order of
    /// independent products does not change a value): its gate/up products follow the
    /// norm, and its down product comes before the router, which touches none of its
    /// buffers (a backend may run the router beside it); the routed experts' sum is then
    /// followed by the add of the shared output, which a backend may take into the sum's
    /// launch.
    pub(crate) fn forward(&self, b: &B, sc: &mut Scratch<B>, call: &MoeCall<'_, B>) -> Result<()> {
        let (s, p) = (call.s, call.p);
        if call.shared {
            self.shared.act(
                b,
                &sc.hn,
                s,
                call.limit_shexp,
                p,
                [&mut sc.ff_gate, &mut sc.ff_up, &mut sc.ff_act],
            )?;
            b.matmul(&self.shared.down_proj, None, &sc.ff_act, s, p, &mut sc.y2)?;
        }
        // The router runs in the model dtype (unlike GLM-5.3's f32 router): its logits,
        // scores and weights are bf16 tensors in the bf16 model.
        b.matmul(&self.gate, None, &sc.hn, s, p, &mut sc.router)?;
        let hash = self.tid2eid.as_ref().filter(|_| call.hash);
        b.moe_route(
            call.step,
            &sc.router,
            s,
            self.bias.as_ref(),
            hash,
            &call.routing,
            p,
            &mut sc.expert_ids,
            &mut sc.expert_w,
        )?;
        let experts = Experts {
            gate: &self.gate_exps,
            up: &self.up_exps,
            down: &self.down_exps,
        };
        b.moe_experts(
            &sc.hn,
            s,
            &sc.expert_ids,
            &sc.expert_w,
            call.routing.n_used,
            &experts,
            call.limit_exp,
            p,
            p,
            &mut sc.y,
        )?;
        if call.shared {
            b.add(&mut sc.y, &sc.y2, s * call.d, p)?;
        }
        Ok(())
    }
}
