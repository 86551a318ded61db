//! DeepSeek-V4's attention (`DeepseekV4Attention`, `modeling_deepseek_v4.py:766-884`;
//! doc §5) with its compressors (`DeepseekV4HCACompressor` `:373-454`,
//! `DeepseekV4CSACompressor` `:600-713`; doc §6.1-6.2) and the lightning indexer
//! (`DeepseekV4Indexer` `:473-597`; doc §6.3).
//!
//! ```text
//! qr = RMSNorm_q(x·q_a_projᵀ)                        [S, rq]  (also the indexer's query input)
//! q  = rope(unweighted_rms_per_head(qr·q_b_projᵀ))   [S, H, hd]
//! kv = rope(RMSNorm_kv(x·kv_projᵀ))                  [S, hd]  the shared key = value
//! CSA/HCA: source rows c = x·compressor.kv_projᵀ, g = x·compressor.gate_projᵀ into the
//!   compressor's ring; every window closed by this step becomes an entry (compress)
//! CSA: the indexer's own compressor likewise; its query rope(qr·q_b_projᵀ) [S, Hi, di]
//!   and head weights x·weights_projᵀ pick the top-k visible entries (dsa_select)
//! o  = sink_attention(q; window of raw kv, entries (all, or the selection), sinks)
//! y  = o_b_proj · o_a_proj_grouped(rope⁻¹(o))         rotated back by the query's angle
//! ```
//!
//! Rope tables: sliding layers use `main`; CSA/HCA layers use `compress` for their
//! queries, raw keys, entries and the indexer.

use crate::Result;
use crate::backend::{Backend, CompressShape, Prec, Rope, SelectShape, SinkAttnShape};

use super::Scratch;
use super::state::{CompState, LayerState};

/// A window compressor (CSA: `overlap`, source rows `2c` wide; HCA: `c` wide).
pub struct Compressor<B: Backend> {
    /// `[row_len, D]` each.
    pub kv_proj: B::Weight,
    pub gate_proj: B::Weight,
    /// `position_bias [m, row_len]` (kept f32).
    pub ape: B::Weight,
    /// `kv_norm [c]` (kept f32).
    pub norm: B::Weight,
    pub shape: CompressShape,
}

/// The lightning indexer of a CSA layer.
pub struct Indexer<B: Backend> {
    /// Its compressor (width `di`, overlapping windows).
    pub compressor: Compressor<B>,
    /// `[Hi·di, rq]`.
    pub q_b_proj: B::Weight,
    /// `[Hi, D]`.
    pub weights_proj: B::Weight,
}

/// One layer's attention weights (GGUF names in `docs/deepseek4_gguf.md`).
pub struct Attention<B: Backend> {
    pub q_a_proj: B::Weight,
    pub q_a_norm: B::Weight,
    pub q_b_proj: B::Weight,
    pub kv_proj: B::Weight,
    pub kv_norm: B::Weight,
    /// Stacked per group `[G, ro, H·hd/G]`.
    pub o_a_proj: B::Weight,
    pub o_b_proj: B::Weight,
    /// `[H]`, kept f32.
    pub sinks: B::Weight,
    pub compressor: Option<Compressor<B>>,
    pub indexer: Option<Indexer<B>>,
}

/// The settings of one layer's call (the forward pass and its test switches).
pub(crate) struct AttnCall<'a, B: Backend> {
    pub step: &'a B::Step,
    pub s: usize,
    pub rms_eps: f32,
    /// This layer's rope table and its inverse.
    pub rope: Rope,
    pub rope_inv: Rope,
    /// The compress rope (entries and the indexer).
    pub compress_rope: Rope,
    pub shape: SinkAttnShape,
    pub select: SelectShape,
    pub o_groups: usize,
    pub p: Prec,
    /// Test switches (all true outside ablation tests).
    pub q_b_norm: bool,
    pub kv_norm: bool,
    pub inverse_rope: bool,
    pub use_entries: bool,
    pub compressor_norm: bool,
    pub indexer_select: bool,
    pub indexer_rope: bool,
    pub indexer_norm: bool,
    pub groups_swapped: bool,
}

impl<B: Backend> Compressor<B> {
    /// The source rows of the step's `s` tokens of `x`: `kv_proj` into `rows[0]`,
    /// `gate_proj` into `rows[1]`.
    fn project(&self, b: &B, x: &B::Buf, s: usize, p: Prec, rows: [&mut B::Buf; 2]) -> Result<()> {
        let [c, g] = rows;
        b.matmul(&self.kv_proj, None, x, s, p, c)?;
        b.matmul(&self.gate_proj, None, x, s, p, g)
    }

    /// Appends the source rows (from [`Self::project`]) to the ring of `st` and writes
    /// the entries of the windows they close.
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        b: &B,
        step: &B::Step,
        rows: [&B::Buf; 2],
        rope: Option<&Rope>,
        norm: bool,
        p: Prec,
        st: &mut CompState<B>,
    ) -> Result<()> {
        b.compress(
            step,
            rows,
            [&mut st.kv, &mut st.gate],
            st.cap,
            &self.ape,
            norm.then_some(&self.norm),
            rope,
            &self.shape,
            p,
            &mut st.entries,
        )
    }
}

impl<B: Backend> Attention<B> {
    /// Runs the layer on `sc.hn [s, D]` at the step's positions, appending to `st`,
    /// writing `sc.y [s, D]` (and the indexer's choice to `sc.sel` for a CSA layer).
    pub(crate) fn forward(
        &self,
        b: &B,
        sc: &mut Scratch<B>,
        st: &mut LayerState<B>,
        call: &AttnCall<'_, B>,
    ) -> Result<()> {
        let (s, p, eps) = (call.s, call.p, call.rms_eps);
        let sh = &call.shape;
        let (h, hd) = (sh.heads, sh.head_dim);
        let rq = sc.rq;
        // The two products of the normalised input first (one launch on a backend that
        // fuses products of one input), then the queries.
        b.matmul(&self.q_a_proj, None, &sc.hn, s, p, &mut sc.qa)?;
        b.matmul(&self.kv_proj, None, &sc.hn, s, p, &mut sc.kv0)?;
        b.rms_norm_cast_once(&sc.qa, Some(&self.q_a_norm), s, rq, eps, p, &mut sc.qr)?;
        b.matmul(&self.q_b_proj, None, &sc.qr, s, p, &mut sc.q0)?;
        if call.q_b_norm {
            b.rms_norm_cast_once(&sc.q0, None, s * h, hd, eps, p, &mut sc.q)?;
        } else {
            b.copy(&sc.q0, 0, &mut sc.q, 0, s * h * hd)?;
        }
        b.rope(call.step, &call.rope, h, hd, p, &mut sc.q)?;
        // The shared key/value.
        if call.kv_norm {
            b.rms_norm_cast_once(&sc.kv0, Some(&self.kv_norm), s, hd, eps, p, &mut sc.kv)?;
        } else {
            b.copy(&sc.kv0, 0, &mut sc.kv, 0, s * hd)?;
        }
        b.rope(call.step, &call.rope, 1, hd, p, &mut sc.kv)?;
        // The step's keys enter the window now (a backend may store them in the rope's
        // launch): its `s` slots held positions `wcap ≥ W − 1 + s` back (pieces are at
        // most the rewind reach R), older than any key the step's queries read.
        debug_assert!(
            st.wcap + 1 >= sh.window + s,
            "a piece longer than the rewind reach"
        );
        b.store_rows(call.step, &sc.kv, s, hd, &mut st.window, st.wcap)?;
        // Compressed entries and the indexer's choice. The compressors' and the indexer's
        // products first (one launch on a backend that groups float products).
        let comp = self.compressor.as_ref().zip(st.comp.as_mut());
        let index = self.indexer.as_ref().zip(st.index.as_mut());
        if let Some((c, _)) = &comp {
            c.project(b, &sc.hn, s, p, [&mut sc.cc, &mut sc.cg])?;
        }
        if let Some((ix, _)) = &index {
            ix.compressor
                .project(b, &sc.hn, s, p, [&mut sc.ic, &mut sc.ig])?;
            if call.indexer_select {
                b.matmul(&ix.q_b_proj, None, &sc.qr, s, p, &mut sc.iq)?;
                b.matmul(&ix.weights_proj, None, &sc.hn, s, p, &mut sc.iw)?;
            }
        }
        if let Some((c, cs)) = comp {
            c.compress(
                b,
                call.step,
                [&sc.cc, &sc.cg],
                Some(&call.compress_rope),
                call.compressor_norm,
                p,
                cs,
            )?;
        }
        let mut selected = false;
        if let Some((ix, is)) = index {
            let sel = &call.select;
            ix.compressor.compress(
                b,
                call.step,
                [&sc.ic, &sc.ig],
                call.indexer_rope.then_some(&call.compress_rope),
                call.indexer_norm,
                p,
                is,
            )?;
            if call.indexer_select {
                if call.indexer_rope {
                    b.rope(
                        call.step,
                        &call.compress_rope,
                        sel.heads,
                        sel.dim,
                        p,
                        &mut sc.iq,
                    )?;
                }
                b.dsa_select(call.step, &sc.iq, &sc.iw, &is.entries, s, sel, &mut sc.sel)?;
                selected = true;
            }
        }
        let entries = match (&st.comp, call.use_entries) {
            (Some(cs), true) => Some((&cs.entries, selected.then_some(&sc.sel))),
            _ => None,
        };
        let mut shape = *sh;
        if entries.is_none() {
            shape.rate = 0;
        }
        b.sink_attention(
            call.step,
            &sc.q,
            &sc.kv,
            &st.window,
            st.wcap,
            entries,
            &self.sinks,
            s,
            &shape,
            p,
            &mut sc.o,
        )?;
        // Right after the sums (a backend may rotate them in the same launch).
        if call.inverse_rope {
            b.rope(call.step, &call.rope_inv, h, hd, p, &mut sc.o)?;
        }
        let o = if call.groups_swapped {
            // Test switch: the head groups enter the grouped projection in reverse order.
            let gw = h * hd / call.o_groups;
            for t in 0..s {
                for g in 0..call.o_groups {
                    let src = (t * call.o_groups + g) * gw;
                    let dst = (t * call.o_groups + call.o_groups - 1 - g) * gw;
                    b.copy(&sc.o, src, &mut sc.q0, dst, gw)?;
                }
            }
            &sc.q0
        } else {
            &sc.o
        };
        b.matmul_grouped(&self.o_a_proj, o, s, p, &mut sc.og)?;
        b.matmul(&self.o_b_proj, None, &sc.og, s, p, &mut sc.y)
    }
}
