//! The multi-GPU partition plan (issue 16, `docs/multi_gpu.md`): how a MoE model's
//! weights are spread over N GPUs of one host, what each GPU holds and reads per decode
//! token, and what the GPUs exchange per token. Pure arithmetic over a GGUF tensor
//! directory; no device is touched.
//!
//! - **Routed experts: expert parallel.** Every GPU holds a contiguous share of every
//!   MoE layer's experts (`blk.N.ffn_{gate,up,down}_exps`), counts balanced per layer;
//!   when the experts do not divide evenly, a layer's extra experts go to the GPUs
//!   holding the fewest bytes so far, so totals balance across layers.
//! - **Shared expert and dense FFN: tensor parallel** by the intermediate dimension
//!   (gate/up by output rows, down by input columns): each GPU's partial output joins the
//!   routed experts' partial sum, so the split costs no extra exchange.
//! - **Attention: replicated**, or **head parallel** when the replicated plan does not
//!   fit: the tensors indexed by head ([`HEAD_SPLIT`]) are split, the rest (latent and
//!   indexer projections, norms, mHC, router) stays whole on every GPU.
//! - **Output head: vocabulary parallel** (rows split, logits all-gathered); the token
//!   embedding is replicated (one row read per token).
//!
//! Per decode token the GPUs exchange the hidden state ([`Exchange`]): the plan gives
//! the cost of both choices, an all-reduce (reduce-scatter + all-gather) of the hidden
//! state per layer, or an all-to-all of the rows routed to other GPUs' experts.
//!
//! Names follow llama.cpp's (`docs/glm5_next_gguf.md`, `docs/deepseek4_gguf.md`); the
//! families with a plan are [`PLANNED_ARCHITECTURES`].

use std::ops::Range;

use ds4_gguf::{GgufFile, Metadata, TensorInfo, Value};

use crate::human_bytes;

/// Architectures (`general.architecture`) that have a multi-GPU plan.
pub const PLANNED_ARCHITECTURES: &[&str] = &["glm5-next", "glm5next", "deepseek4"];

/// Per-layer tensors indexed by attention head (suffixes after `blk.N.`), split under
/// head parallelism: KDA's q/k/v, convolutions, gate up-projections, beta, `A`, `dt`
/// bias (GLM-5.3); MLA's `q_b`, `k_b`, `v_b` (GLM-5.3); DeepSeek-V4's `q_b`, sinks and
/// grouped output; every family's output projection.
pub const HEAD_SPLIT: &[&str] = &[
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ssm_conv1d_q.weight",
    "ssm_conv1d_k.weight",
    "ssm_conv1d_v.weight",
    "ssm_f_b.weight",
    "ssm_g_b.weight",
    "ssm_beta.weight",
    "ssm_a",
    "ssm_dt.bias",
    "attn_q_b.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
    "attn_sinks.weight",
    "attn_output_a.weight",
    "attn_output_b.weight",
];

/// Bytes of one hidden-state element on the wire: the f32 residual stream.
const HIDDEN_ELT: u64 = 4;

/// Why there is no plan.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "the {arch} family has no multi-GPU plan (plans exist for {})",
        PLANNED_ARCHITECTURES.join(", ")
    )]
    NoPlan { arch: String },
    #[error("{0}")]
    Layout(String),
    #[error("a plan needs at least one GPU")]
    NoGpus,
    #[error(
        "{} of {} each: the model does not fit (the fullest GPU needs {} of weights plus {} reserved for caches and activations{note})",
        gpus(*n_gpus),
        human_bytes(*have),
        human_bytes(*weights),
        human_bytes(*reserve)
    )]
    DoesNotFit {
        n_gpus: usize,
        have: u64,
        weights: u64,
        reserve: u64,
        /// How attention was placed in the plan that came closest.
        note: String,
    },
}

/// `1 GPU`, `2 GPUs`.
pub fn gpus(n: usize) -> String {
    if n == 1 {
        "1 GPU".into()
    } else {
        format!("{n} GPUs")
    }
}

/// Bytes of one layer by how they are placed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerBytes {
    /// All routed experts (0 in a dense layer); every expert the same size.
    pub experts: u64,
    /// Shared expert or dense FFN: split by the intermediate dimension.
    pub ffn: u64,
    /// Attention tensors indexed by head ([`HEAD_SPLIT`]).
    pub heads: u64,
    /// Everything else (latent and indexer projections, router, norms, mHC): on every GPU.
    pub replicated: u64,
    /// Of `replicated`, the bytes read per decode token (token-indexed tables such as
    /// `ffn_gate_tid2eid` are read one row at a time).
    pub replicated_read: u64,
}

/// A model's weights as the plan sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub arch: String,
    /// Hidden size `D` and vocabulary size `V`.
    pub n_embd: usize,
    pub n_vocab: usize,
    /// Attention heads, and DeepSeek-V4's output groups (which head parallelism must also
    /// divide); 0 when absent.
    pub n_head: usize,
    pub n_group: usize,
    /// Routed experts per MoE layer and experts selected per token.
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub layers: Vec<LayerBytes>,
    /// `token_embd.weight` (replicated; one row read per token) and its row.
    pub embedding: u64,
    pub embedding_row: u64,
    /// `output.weight`: split by vocabulary rows (0 when the embedding is the head).
    pub head: u64,
    /// Other tensors outside the layers (final norm, mHC head): replicated.
    pub other: u64,
}

impl Layout {
    /// The layout of a model file.
    pub fn from_gguf(file: &GgufFile) -> Result<Layout, PlanError> {
        Layout::from_directory(file.metadata(), file.tensors())
    }

    /// The layout from a GGUF metadata table and tensor directory.
    ///
    /// Errors: [`PlanError::NoPlan`] for an architecture outside
    /// [`PLANNED_ARCHITECTURES`]; [`PlanError::Layout`] naming a missing key or tensor,
    /// or experts of unequal sizes.
    pub fn from_directory(md: &Metadata, tensors: &[TensorInfo]) -> Result<Layout, PlanError> {
        let arch = match md.get("general.architecture") {
            Some(Value::String(a)) => a.clone(),
            _ => return Err(PlanError::Layout("no general.architecture".into())),
        };
        if !PLANNED_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(PlanError::NoPlan { arch });
        }
        let key = |k: &str| md.get(&format!("{arch}.{k}")).and_then(Value::as_u64);
        let need = |k: &str| {
            key(k)
                .map(|v| v as usize)
                .ok_or_else(|| PlanError::Layout(format!("metadata key {arch}.{k} is missing")))
        };
        let n_layer = need("block_count")?;
        let embd = tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .ok_or_else(|| PlanError::Layout("tensor token_embd.weight is missing".into()))?;
        let mut l = Layout {
            n_embd: need("embedding_length")?,
            n_vocab: embd.dims.get(1).copied().unwrap_or(0) as usize,
            n_head: need("attention.head_count")?,
            n_group: key("attention.output_group_count").unwrap_or(0) as usize,
            n_expert: need("expert_count")?,
            n_expert_used: need("expert_used_count")?,
            layers: vec![LayerBytes::default(); n_layer],
            embedding: 0,
            embedding_row: 0,
            head: 0,
            other: 0,
            arch,
        };
        for t in tensors {
            let bytes = t.try_n_bytes().ok_or_else(|| {
                PlanError::Layout(format!("tensor {} has an invalid shape", t.name))
            })?;
            let Some((i, part)) = layer_part(&t.name) else {
                match t.name.as_str() {
                    "token_embd.weight" => {
                        l.embedding = bytes;
                        l.embedding_row = bytes / t.n_rows().max(1);
                    }
                    "output.weight" => l.head = bytes,
                    _ => l.other += bytes,
                }
                continue;
            };
            let layer = l.layers.get_mut(i).ok_or_else(|| {
                PlanError::Layout(format!("tensor {} is past block_count {n_layer}", t.name))
            })?;
            match part {
                Part::Experts => {
                    if t.dims.last() != Some(&(l.n_expert as u64)) {
                        return Err(PlanError::Layout(format!(
                            "tensor {} has dims {:?}: the last is not expert_count {}",
                            t.name, t.dims, l.n_expert
                        )));
                    }
                    layer.experts += bytes;
                }
                Part::Ffn => layer.ffn += bytes,
                Part::Heads => layer.heads += bytes,
                Part::Replicated => {
                    layer.replicated += bytes;
                    layer.replicated_read += bytes;
                }
                Part::Lookup => {
                    layer.replicated += bytes;
                    layer.replicated_read += bytes / t.n_rows().max(1);
                }
            }
        }
        Ok(l)
    }

    /// Bytes of every weight.
    pub fn total_bytes(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|b| b.experts + b.ffn + b.heads + b.replicated)
            .sum();
        layers + self.embedding + self.other + self.head
    }

    /// Bytes of the output matrix read per token on one GPU: its share of the vocabulary
    /// (of the embedding when the head is tied).
    fn head_read(&self, n_gpus: u64) -> u64 {
        match self.head {
            0 => self.embedding,
            h => h,
        }
        .div_ceil(n_gpus)
    }
}

/// Where a per-layer tensor goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Experts,
    Ffn,
    Heads,
    Replicated,
    Lookup,
}

/// The layer and part of a `blk.N.…` tensor; `None` outside the layers.
fn layer_part(name: &str) -> Option<(usize, Part)> {
    let rest = name.strip_prefix("blk.")?;
    let (i, suffix) = rest.split_once('.')?;
    let i = i.parse().ok()?;
    let part = if suffix.contains("_exps.") {
        Part::Experts
    } else if suffix == "ffn_gate_tid2eid.weight" {
        Part::Lookup
    } else if ["ffn_gate", "ffn_up", "ffn_down"].iter().any(|p| {
        [".weight", "_shexp.weight"]
            .iter()
            .any(|s| suffix == format!("{p}{s}"))
    }) {
        Part::Ffn
    } else if HEAD_SPLIT.contains(&suffix) {
        Part::Heads
    } else {
        Part::Replicated
    };
    Some((i, part))
}

/// How attention is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// Whole on every GPU: no exchange for attention.
    Replicated,
    /// Head-indexed tensors split by heads: one more all-reduce per layer.
    Heads,
}

/// How the GPUs exchange the hidden state around the routed experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// The hidden state is on every GPU; partial outputs are summed by an all-reduce
    /// (reduce-scatter + all-gather) per layer.
    AllReduce,
    /// The hidden state lives on one GPU; its row goes to each GPU holding one of its
    /// selected experts and one partial row comes back (two all-to-alls per MoE layer).
    AllToAll,
}

/// What one exchange choice costs per decode token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExchangeCost {
    pub exchange: Exchange,
    /// Collective calls per token.
    pub collectives: usize,
    /// Bytes sent per token by all GPUs together (expected for uniform routing).
    pub bytes: f64,
}

/// One GPU's share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuShare {
    /// Weight bytes it holds.
    pub weights: u64,
    /// Weight bytes it reads per decode token, expected for uniform routing and at most
    /// (every selected expert of every layer on this GPU).
    pub read_expected: f64,
    pub read_max: u64,
}

/// Memory of each GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes of memory per GPU.
    pub mem_per_gpu: u64,
    /// Bytes per GPU kept for caches, activations and graphs.
    pub reserve: u64,
}

/// The plan for N GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub n_gpus: usize,
    pub attention: Attention,
    /// Per layer, per GPU: the routed experts it holds (empty ranges in dense layers).
    pub experts: Vec<Vec<Range<usize>>>,
    pub gpus: Vec<GpuShare>,
    /// Both exchange choices, [`Exchange::AllReduce`] first.
    pub exchanges: [ExchangeCost; 2],
    pub budget: Budget,
}

/// The plan for `layout` on `n_gpus` GPUs of `budget`, with attention placed as
/// `prefer` says when that fits and is possible, else the other way.
///
/// Errors: [`PlanError::NoGpus`]; [`PlanError::DoesNotFit`] with the fullest GPU's need
/// in the placement that came closest.
pub fn plan(
    layout: &Layout,
    n_gpus: usize,
    budget: Budget,
    prefer: Attention,
) -> Result<Plan, PlanError> {
    if n_gpus == 0 {
        return Err(PlanError::NoGpus);
    }
    let fits = |p: &Plan| p.max_weights() + budget.reserve <= budget.mem_per_gpu;
    let splittable =
        n_gpus > 1 && layout.n_head.is_multiple_of(n_gpus) && layout.n_group.is_multiple_of(n_gpus);
    let order = match (splittable, prefer) {
        (false, _) => vec![Attention::Replicated],
        (true, Attention::Replicated) => vec![Attention::Replicated, Attention::Heads],
        (true, Attention::Heads) => vec![Attention::Heads, Attention::Replicated],
    };
    let plans: Vec<Plan> = order
        .into_iter()
        .map(|a| place(layout, n_gpus, a, budget))
        .collect();
    if let Some(p) = plans.iter().find(|p| fits(p)) {
        return Ok(p.clone());
    }
    let best = plans
        .iter()
        .min_by_key(|p| p.max_weights())
        .expect("at least one placement");
    let note = if n_gpus == 1 {
        String::new()
    } else if splittable {
        ", attention split by heads".into()
    } else {
        let groups = match layout.n_group {
            0 => String::new(),
            g => format!(" and {g} output groups"),
        };
        format!(
            "; attention stays whole: {} heads{groups} do not split over {n_gpus} GPUs",
            layout.n_head
        )
    };
    Err(PlanError::DoesNotFit {
        n_gpus,
        have: budget.mem_per_gpu,
        weights: best.max_weights(),
        reserve: budget.reserve,
        note,
    })
}

/// The latency of one all-reduce of the hidden state below which head-parallel
/// attention decodes faster than replicated attention on `n_gpus` GPUs whose memory
/// reads `bytes_per_s`: the read time it saves per token over the all-reduces it adds.
/// `None` when attention cannot be split over `n_gpus`.
pub fn attention_break_even(layout: &Layout, n_gpus: usize, bytes_per_s: f64) -> Option<f64> {
    if n_gpus < 2 || !layout.n_head.is_multiple_of(n_gpus) || !layout.n_group.is_multiple_of(n_gpus)
    {
        return None;
    }
    let any = Budget {
        mem_per_gpu: u64::MAX,
        reserve: 0,
    };
    let [r, h] = [Attention::Replicated, Attention::Heads].map(|a| place(layout, n_gpus, a, any));
    let saved = (r.gpus[0].read_expected - h.gpus[0].read_expected) / bytes_per_s;
    let added = h.exchanges[0].collectives - r.exchanges[0].collectives;
    Some(saved / added as f64)
}

impl Plan {
    /// The fullest GPU's weight bytes.
    pub fn max_weights(&self) -> u64 {
        self.gpus.iter().map(|g| g.weights).max().unwrap_or(0)
    }

    /// The exchange with fewer collectives per token, then fewer bytes (a model of the
    /// choice; the measurement on two GPUs decides, `docs/multi_gpu.md`).
    pub fn preferred_exchange(&self) -> ExchangeCost {
        let [a, b] = self.exchanges;
        if (b.collectives, b.bytes) < (a.collectives, a.bytes) {
            b
        } else {
            a
        }
    }
}

/// The placement with attention as given (no memory check).
fn place(layout: &Layout, n: usize, attention: Attention, budget: Budget) -> Plan {
    let nf = n as u64;
    // What every GPU holds and reads alike, then each GPU's experts.
    let mut dense = layout.embedding + layout.other + layout.head.div_ceil(nf);
    let mut dense_read = layout.embedding_row + layout.other + layout.head_read(nf);
    let mut weights = vec![0u64; n];
    let mut read_max = vec![0u64; n];
    let mut read_expected = vec![0f64; n];
    let mut experts = Vec::with_capacity(layout.layers.len());
    let (e, k) = (layout.n_expert, layout.n_expert_used);
    for b in &layout.layers {
        let heads = match attention {
            Attention::Replicated => b.heads,
            Attention::Heads => b.heads.div_ceil(nf),
        };
        dense += b.replicated + b.ffn.div_ceil(nf) + heads;
        dense_read += b.replicated_read + b.ffn.div_ceil(nf) + heads;
        if b.experts == 0 || e == 0 {
            experts.push(vec![0..0; n]);
            continue;
        }
        let per_expert = b.experts / e as u64;
        let counts = split_counts(e, &weights);
        let mut start = 0;
        let mut ranges = Vec::with_capacity(n);
        for (g, &c) in counts.iter().enumerate() {
            ranges.push(start..start + c);
            start += c;
            weights[g] += c as u64 * per_expert;
            read_max[g] += k.min(c) as u64 * per_expert;
            read_expected[g] += (k * c) as f64 / e as f64 * per_expert as f64;
        }
        experts.push(ranges);
    }
    let gpus = (0..n)
        .map(|g| GpuShare {
            weights: dense + weights[g],
            read_expected: dense_read as f64 + read_expected[g],
            read_max: dense_read + read_max[g],
        })
        .collect();
    let exchanges = exchange_costs(layout, n, attention, &experts);
    Plan {
        n_gpus: n,
        attention,
        experts,
        gpus,
        exchanges,
        budget,
    }
}

/// Experts per GPU for one layer: equal counts, the remainder to the GPUs with the
/// fewest `bytes` so far (lowest rank first among equals).
fn split_counts(n_expert: usize, bytes: &[u64]) -> Vec<usize> {
    let n = bytes.len();
    let mut counts = vec![n_expert / n; n];
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&g| (bytes[g], g));
    for &g in order.iter().take(n_expert % n) {
        counts[g] += 1;
    }
    counts
}

/// Per-token costs of both exchanges. All-reduce: one per MoE or dense-FFN layer (two
/// with head-parallel attention) and the logits' all-gather; a ring all-reduce of `D`
/// values sends `2(N-1)/N · D` per GPU. All-to-all: two per MoE layer, `D` values to and
/// from each GPU other than the token's own that holds one of its experts (expected
/// count under uniform routing), the logits computed on the token's GPU.
fn exchange_costs(
    layout: &Layout,
    n: usize,
    attention: Attention,
    experts: &[Vec<Range<usize>>],
) -> [ExchangeCost; 2] {
    let d = (layout.n_embd as u64 * HIDDEN_ELT) as f64;
    let nf = n as f64;
    if n == 1 {
        return [Exchange::AllReduce, Exchange::AllToAll].map(|exchange| ExchangeCost {
            exchange,
            collectives: 0,
            bytes: 0.0,
        });
    }
    let per_layer = match attention {
        Attention::Replicated => 1,
        Attention::Heads => 2,
    };
    let ffn_layers = layout
        .layers
        .iter()
        .filter(|b| b.experts > 0 || b.ffn > 0)
        .count();
    let moe_layers: Vec<&Vec<Range<usize>>> = experts
        .iter()
        .filter(|r| r.iter().any(|r| !r.is_empty()))
        .collect();
    let logits = (n - 1) as f64 * (layout.n_vocab as u64 * HIDDEN_ELT) as f64;
    let all_reduce = ExchangeCost {
        exchange: Exchange::AllReduce,
        collectives: ffn_layers * per_layer + 1,
        bytes: ffn_layers as f64 * per_layer as f64 * 2.0 * (nf - 1.0) * d + logits,
    };
    let remote: f64 = moe_layers
        .iter()
        .map(|ranges| {
            // Hit GPUs other than the token's own, averaged over which GPU that is.
            let hit: f64 = ranges
                .iter()
                .map(|r| 1.0 - miss(layout.n_expert, r.len(), layout.n_expert_used))
                .sum();
            hit * (nf - 1.0) / nf
        })
        .sum();
    let all_to_all = ExchangeCost {
        exchange: Exchange::AllToAll,
        collectives: 2 * moe_layers.len(),
        bytes: 2.0 * d * remote,
    };
    [all_reduce, all_to_all]
}

/// The chance that none of `k` experts drawn without replacement from `e` is among a
/// GPU's `held`.
fn miss(e: usize, held: usize, k: usize) -> f64 {
    (0..k)
        .map(|i| (e.saturating_sub(held + i)) as f64 / (e - i) as f64)
        .product()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_gguf::GgmlType::{self, F32, I32, MXFP4, Q8_0};

    const GIB: u64 = 1 << 30;

    fn info(name: String, dims: &[u64], dtype: GgmlType) -> TensorInfo {
        TensorInfo {
            name,
            dims: dims.to_vec(),
            dtype,
            offset: 0,
        }
    }

    fn metadata(arch: &str, keys: &[(&str, u32)]) -> Metadata {
        let mut md = Metadata::new();
        md.insert("general.architecture", Value::String(arch.into()));
        for (k, v) in keys {
            md.insert(format!("{arch}.{k}"), Value::U32(*v));
        }
        md
    }

    /// DeepSeek-V4-Flash's published configuration (`docs/deepseek4.md` notation table)
    /// in llama.cpp's layout (`docs/deepseek4_gguf.md`), as `ds4-server convert
    /// --outtype q8_0` writes it: matrices Q8_0, routed experts MXFP4, vectors, mHC,
    /// compressor position biases F32, `tid2eid` I32. 43 layers: sliding, sliding, then
    /// CSA (rate 4) and HCA (rate 128) alternating, ending with CSA; 3 hash layers.
    fn deepseek_v4_flash() -> (Metadata, Vec<TensorInfo>) {
        let (d, v, l, n_hc) = (4096u64, 129280u64, 43usize, 4u64);
        let (h, hd, rq, g, ro) = (64u64, 512u64, 1024u64, 8u64, 1024u64);
        let (hi, di, e, k, ff) = (64u64, 128u64, 256u64, 6u64, 2048u64);
        let md = metadata(
            "deepseek4",
            &[
                ("block_count", l as u32),
                ("embedding_length", d as u32),
                ("attention.head_count", h as u32),
                ("attention.output_group_count", g as u32),
                ("expert_count", e as u32),
                ("expert_used_count", k as u32),
            ],
        );
        let mut t = vec![
            info("token_embd.weight".into(), &[d, v], Q8_0),
            info("output.weight".into(), &[d, v], Q8_0),
            info("output_norm.weight".into(), &[d], F32),
            info("output_hc_fn.weight".into(), &[n_hc * d, n_hc], F32),
            info("output_hc_base.weight".into(), &[n_hc], F32),
            info("output_hc_scale.weight".into(), &[1], F32),
        ];
        for i in 0..l {
            let mut add =
                |x: &str, dims: &[u64], ty| t.push(info(format!("blk.{i}.{x}"), dims, ty));
            add("attn_norm.weight", &[d], F32);
            add("ffn_norm.weight", &[d], F32);
            for p in ["attn", "ffn"] {
                add(
                    &format!("hc_{p}_fn.weight"),
                    &[n_hc * d, (2 + n_hc) * n_hc],
                    F32,
                );
                add(&format!("hc_{p}_base.weight"), &[(2 + n_hc) * n_hc], F32);
                add(&format!("hc_{p}_scale.weight"), &[3], F32);
            }
            add("attn_sinks.weight", &[h], F32);
            add("attn_q_a.weight", &[d, rq], Q8_0);
            add("attn_q_a_norm.weight", &[rq], F32);
            add("attn_q_b.weight", &[rq, h * hd], Q8_0);
            add("attn_kv.weight", &[d, hd], Q8_0);
            add("attn_kv_a_norm.weight", &[hd], F32);
            add("attn_output_a.weight", &[h * hd / g, g * ro], Q8_0);
            add("attn_output_b.weight", &[g * ro, d], Q8_0);
            let rate = match i {
                0 | 1 => 0,
                _ if i % 2 == 0 => 4,
                _ => 128,
            };
            if rate > 0 {
                let c = if rate == 4 { 2 } else { 1 };
                add("attn_compressor_kv.weight", &[d, c * hd], Q8_0);
                add("attn_compressor_gate.weight", &[d, c * hd], Q8_0);
                add("attn_compressor_ape.weight", &[c * hd, rate], F32);
                add("attn_compressor_norm.weight", &[hd], F32);
            }
            if rate == 4 {
                add("indexer_compressor_kv.weight", &[d, 2 * di], Q8_0);
                add("indexer_compressor_gate.weight", &[d, 2 * di], Q8_0);
                add("indexer_compressor_ape.weight", &[2 * di, 4], F32);
                add("indexer_compressor_norm.weight", &[di], F32);
                add("indexer.attn_q_b.weight", &[rq, hi * di], Q8_0);
                add("indexer.proj.weight", &[d, hi], Q8_0);
            }
            add("ffn_gate_inp.weight", &[d, e], F32);
            if i < 3 {
                add("ffn_gate_tid2eid.weight", &[k, v], I32);
            } else {
                add("exp_probs_b.bias", &[e], F32);
            }
            add("ffn_gate_exps.weight", &[d, ff, e], MXFP4);
            add("ffn_up_exps.weight", &[d, ff, e], MXFP4);
            add("ffn_down_exps.weight", &[ff, d, e], MXFP4);
            add("ffn_gate_shexp.weight", &[d, ff], Q8_0);
            add("ffn_up_shexp.weight", &[d, ff], Q8_0);
            add("ffn_down_shexp.weight", &[ff, d], Q8_0);
        }
        (md, t)
    }

    fn h200(reserve: u64) -> Budget {
        Budget {
            mem_per_gpu: 141 * 1_000_000_000,
            reserve,
        }
    }

    #[test]
    fn deepseek_v4_flash_layout_counts_every_byte() {
        let (md, t) = deepseek_v4_flash();
        let l = Layout::from_directory(&md, &t).unwrap();
        let total: u64 = t.iter().map(|t| t.n_bytes()).sum();
        assert_eq!(l.total_bytes(), total);
        assert_eq!((l.n_expert, l.n_expert_used, l.n_vocab), (256, 6, 129280));
        // One layer's experts: 3 matrices of 4096 × 2048 × 256 in MXFP4 (17 bytes per 32).
        assert_eq!(l.layers[5].experts, 3 * 4096 * 2048 * 256 / 32 * 17);
        // Shared expert in Q8_0 (34 bytes per 32).
        assert_eq!(l.layers[5].ffn, 3 * 4096 * 2048 / 32 * 34);
        // Hash layers read one tid2eid row (6 × 4 bytes) per token, not the table.
        let b = l.layers[0];
        assert_eq!(b.replicated - b.replicated_read, 6 * 129280 * 4 - 6 * 4);
        assert_eq!(l.layers[5].replicated, l.layers[5].replicated_read);
        // 144.5 GiB (155.2 GB), 95 % of it routed experts: more than one H200.
        assert!(total > 144 * GIB && total < 145 * GIB, "{total}");
        let one = plan(&l, 1, h200(8 * GIB), Attention::Replicated).unwrap_err();
        assert!(
            matches!(one, PlanError::DoesNotFit { n_gpus: 1, .. }),
            "{one}"
        );
        assert!(
            one.to_string().starts_with(
                "1 GPU of 131.3 GiB each: the model does not fit (the fullest GPU needs 144.5 GiB"
            ),
            "{one}"
        );
        assert!(
            one.to_string()
                .ends_with("plus 8.0 GiB reserved for caches and activations)"),
            "{one}"
        );
    }

    #[test]
    fn deepseek_v4_flash_on_two_gpus_splits_experts_evenly() {
        let (md, t) = deepseek_v4_flash();
        let l = Layout::from_directory(&md, &t).unwrap();
        let p = plan(&l, 2, h200(8 * GIB), Attention::Replicated).unwrap();
        assert_eq!(p.attention, Attention::Replicated);
        assert!(p.experts.iter().all(|r| r == &vec![0..128, 128..256]));
        assert_eq!(p.gpus[0].weights, p.gpus[1].weights);
        let total = l.total_bytes();
        // Experts and shared expert halve; attention, router, embedding stay whole; the
        // head halves.
        let halved: u64 = l.layers.iter().map(|b| b.experts + b.ffn).sum::<u64>() + l.head;
        assert_eq!(p.gpus[0].weights, total - halved / 2);
        // Each GPU reads half the selected experts' bytes on average, all 6 at most.
        let per_expert = l.layers[5].experts / 256;
        let moe_read_max = 43 * 6 * per_expert;
        let dense_read = p.gpus[0].read_max - moe_read_max;
        let expected = dense_read as f64 + moe_read_max as f64 / 2.0;
        assert!((p.gpus[0].read_expected - expected).abs() < 1.0);
        // All-reduce: 43 layers + the logits' all-gather; a ring all-reduce of D f32
        // sends 2·(N-1)/N·16 KiB per GPU, 32 KiB in all.
        let [ar, a2a] = p.exchanges;
        assert_eq!(ar.collectives, 44);
        assert_eq!(ar.bytes, 43.0 * 32768.0 + 129280.0 * 4.0);
        // All-to-all: 2 per layer; the other GPU holds one of 6 of 256 experts with
        // chance 1 - C(128,6)/C(256,6), and is remote for half the tokens.
        assert_eq!(a2a.collectives, 86);
        let hit = 1.0 - miss(256, 128, 6);
        assert!((hit - 0.9852).abs() < 1e-3, "{hit}");
        // Each GPU is remote for half the tokens: 2 rows of 16 KiB per layer times `hit`.
        assert!((a2a.bytes - 43.0 * 2.0 * 16384.0 * hit).abs() < 1.0);
        assert_eq!(p.preferred_exchange().exchange, Exchange::AllReduce);
        // The head-indexed attention matrices (q_b, grouped output: 107 MB a layer in
        // Q8_0) outweigh the 6 selected MXFP4 experts (80 MB): splitting them pays at
        // 4.1 TB/s while an all-reduce takes less than 13 µs.
        let even = attention_break_even(&l, 2, 4.1e12).unwrap();
        assert!((even - 13.0e-6).abs() < 0.1e-6, "{even}");
        assert_eq!(attention_break_even(&l, 3, 4.1e12), None);
    }

    #[test]
    fn uneven_experts_balance_across_layers() {
        let (md, t) = deepseek_v4_flash();
        let l = Layout::from_directory(&md, &t).unwrap();
        // 256 experts over 3 GPUs: one extra per layer, given to the emptiest GPU.
        let p = plan(&l, 3, h200(8 * GIB), Attention::Replicated).unwrap();
        for ranges in &p.experts {
            let counts: Vec<usize> = ranges.iter().map(ExactSizeIterator::len).collect();
            assert_eq!(counts.iter().sum::<usize>(), 256);
            assert!(counts.iter().all(|&c| c == 85 || c == 86), "{counts:?}");
            assert_eq!(ranges[0].start, 0);
            assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
        }
        let per_expert = l.layers[5].experts / 256;
        let w: Vec<u64> = p.gpus.iter().map(|g| g.weights).collect();
        let spread = w.iter().max().unwrap() - w.iter().min().unwrap();
        assert!(spread <= per_expert, "{w:?}");
    }

    #[test]
    fn attention_is_split_only_when_replication_does_not_fit() {
        let (md, t) = deepseek_v4_flash();
        let l = Layout::from_directory(&md, &t).unwrap();
        let need = plan(&l, 2, h200(0), Attention::Replicated)
            .unwrap()
            .max_weights();
        let tight = Budget {
            mem_per_gpu: need - 1,
            reserve: 0,
        };
        let p = plan(&l, 2, tight, Attention::Replicated).unwrap();
        assert_eq!(
            plan(&l, 2, h200(0), Attention::Heads).unwrap().attention,
            Attention::Heads
        );
        assert_eq!(p.attention, Attention::Heads);
        let heads: u64 = l.layers.iter().map(|b| b.heads).sum();
        assert_eq!(p.max_weights(), need - heads / 2);
        // One more all-reduce per layer.
        assert_eq!(p.exchanges[0].collectives, 2 * 43 + 1);
        let e = plan(
            &l,
            2,
            Budget {
                mem_per_gpu: 40 * GIB,
                reserve: 0,
            },
            Attention::Replicated,
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with(
                "2 GPUs of 40.0 GiB each: the model does not fit (the fullest GPU needs"
            ),
            "{e}"
        );
        assert!(e.to_string().ends_with("attention split by heads)"), "{e}");
        // 64 heads and 8 groups do not split over 3 GPUs.
        assert!(
            plan(
                &l,
                3,
                Budget {
                    mem_per_gpu: 40 * GIB,
                    reserve: 0
                },
                Attention::Heads,
            )
            .unwrap_err()
            .to_string()
            .contains("64 heads and 8 output groups do not split over 3 GPUs")
        );
    }

    #[test]
    fn families_without_a_plan_and_broken_layouts_are_named() {
        let md = metadata("llama", &[("block_count", 2)]);
        assert_eq!(
            Layout::from_directory(&md, &[]).unwrap_err().to_string(),
            "the llama family has no multi-GPU plan (plans exist for glm5-next, glm5next, deepseek4)"
        );
        let (mut md, t) = deepseek_v4_flash();
        md.insert("deepseek4.expert_count", Value::U32(128));
        assert!(
            Layout::from_directory(&md, &t)
                .unwrap_err()
                .to_string()
                .contains("the last is not expert_count 128")
        );
        let md = metadata("deepseek4", &[("embedding_length", 8)]);
        assert_eq!(
            Layout::from_directory(&md, &t).unwrap_err().to_string(),
            "metadata key deepseek4.block_count is missing"
        );
        let (md, t) = deepseek_v4_flash();
        let l = Layout::from_directory(&md, &t).unwrap();
        assert_eq!(
            plan(&l, 0, h200(0), Attention::Replicated).unwrap_err(),
            PlanError::NoGpus
        );
    }

    #[test]
    fn names_go_to_their_parts() {
        let cases = [
            ("blk.3.ffn_gate_exps.weight", Some((3, Part::Experts))),
            ("blk.3.ffn_down_shexp.weight", Some((3, Part::Ffn))),
            ("blk.0.ffn_up.weight", Some((0, Part::Ffn))),
            ("blk.0.ffn_gate_inp.weight", Some((0, Part::Replicated))),
            ("blk.1.ffn_gate_tid2eid.weight", Some((1, Part::Lookup))),
            ("blk.7.attn_q_b.weight", Some((7, Part::Heads))),
            ("blk.7.indexer.attn_q_b.weight", Some((7, Part::Replicated))),
            ("blk.7.attn_kv_a_mqa.weight", Some((7, Part::Replicated))),
            ("blk.2.ssm_a", Some((2, Part::Heads))),
            ("output.weight", None),
        ];
        for (name, want) in cases {
            assert_eq!(layer_part(name), want, "{name}");
        }
    }

    #[test]
    fn one_gpu_holds_everything_and_exchanges_nothing() {
        let (md, t) = deepseek_v4_flash();
        let l = Layout::from_directory(&md, &t).unwrap();
        let p = plan(
            &l,
            1,
            Budget {
                mem_per_gpu: 200 * GIB,
                reserve: 0,
            },
            Attention::Heads,
        )
        .unwrap();
        assert_eq!(p.max_weights(), l.total_bytes());
        assert!(
            p.exchanges
                .iter()
                .all(|e| e.collectives == 0 && e.bytes == 0.0)
        );
        assert_eq!(p.gpus[0].read_expected, p.gpus[0].read_max as f64);
    }
}
