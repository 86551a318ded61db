//! The dense MLP (`Glm5NextTextMLP`, `:85-103`), the router
//! (`Glm5NextTextTopkRouter`, `:144-182`) and the MoE with its shared expert
//! (`Glm5NextTextMoE`, `:185-206`); doc §7.
//!
//! SwiGLU with clamp: `gate = min(x·W_gᵀ, lim)`, `up = clamp(x·W_uᵀ, −lim, lim)`,
//! `y = (silu(gate)⊙up)·W_dᵀ`. Router, all f32: `s = sigmoid(x·W_rᵀ)`, choice scores
//! `s + bias`; with `n_group > 1` each group is scored by the sum of its two best
//! choice scores and only the `topk_group` best groups stay; the top-`k` experts by
//! choice score are weighted by their *unbiased* `s`, renormalised when
//! `norm_topk_prob` (`/(Σ + 1e-20)`), times `routed_scaling_factor`. Experts' outputs
//! (model dtype) are weighted and summed in f32, rounded once, then the shared expert's
//! output is added (the reference's default `grouped_mm` path).

use crate::Result;
use crate::backend::{Backend, Experts, Prec, Routing};

use super::Scratch;

/// A SwiGLU MLP: the dense layers' MLP and the shared expert.
pub struct Mlp<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
    /// Intermediate size.
    pub ff: usize,
}

/// The MoE block.
pub struct Moe<B: Backend> {
    /// Router weight `[E, D]`.
    pub router: B::Weight,
    /// `e_score_correction_bias [E]`, f32.
    pub bias: B::Weight,
    /// Stacked experts: gate and up `[E, I, D]`, down `[E, D, I]`.
    pub gate_exps: B::Weight,
    pub up_exps: B::Weight,
    pub down_exps: B::Weight,
    pub shared: Mlp<B>,
}

/// Per-call MoE settings.
pub(crate) struct MoeCall<'a, B: Backend> {
    pub step: &'a B::Step,
    pub s: usize,
    pub d: usize,
    pub routing: Routing,
    /// SwiGLU clamps of the routed and the shared experts.
    pub limit_exp: Option<f32>,
    pub limit_shexp: Option<f32>,
    pub p: Prec,
    /// The shared expert is added (off only for a test switch).
    pub shared: bool,
}

impl<B: Backend> Mlp<B> {
    /// `out [s, D]` for `x [s, D]`, through the intermediate buffers `[gate, up, act]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        b: &B,
        x: &B::Buf,
        s: usize,
        limit: Option<f32>,
        p: Prec,
        tmp: [&mut B::Buf; 3],
        out: &mut B::Buf,
    ) -> Result<()> {
        let [gate, up, act] = tmp;
        b.matmul(&self.gate, None, x, s, p, gate)?;
        b.matmul(&self.up, None, x, s, p, up)?;
        b.swiglu(gate, up, s * self.ff, limit, p, act)?;
        b.matmul(&self.down, None, act, s, p, out)
    }
}

impl<B: Backend> Moe<B> {
    /// `sc.y [s, D]` for `sc.hn [s, D]`.
    pub(crate) fn forward(&self, b: &B, sc: &mut Scratch<B>, call: &MoeCall<'_, B>) -> Result<()> {
        let (s, p) = (call.s, call.p);
        // The shared expert first (independent of the routed ones; it reads the input
        // right after its norm, which a backend may fuse).
        if call.shared {
            self.shared.forward(
                b,
                &sc.hn,
                s,
                call.limit_shexp,
                p,
                [&mut sc.ff_gate, &mut sc.ff_up, &mut sc.ff_act],
                &mut sc.y2,
            )?;
        }
        // The router is an f32 island.
        b.matmul(&self.router, None, &sc.hn, s, Prec::F32, &mut sc.router)?;
        b.moe_route(
            call.step,
            &sc.router,
            s,
            Some(&self.bias),
            None,
            &call.routing,
            Prec::F32,
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
            Prec::F32,
            p,
            &mut sc.y,
        )?;
        if call.shared {
            b.add(&mut sc.y, &sc.y2, s * call.d, p)?;
        }
        Ok(())
    }
}
