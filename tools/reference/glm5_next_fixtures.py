#!/usr/bin/env python3
"""Golden-master fixtures for the `glm5_next` (GLM-5.3-Flash) text model.

The reference is `transformers==5.23.0`, `models/glm5_next` (the text part:
`Glm5NextTextModel` plus the untied `lm_head` of
`Glm5NextForConditionalGeneration`), run on the CPU with PyTorch. This script
builds tiny random-weight models that cover every code path of the text model,
saves each as a Hugging Face checkpoint, reloads it (f32, and bf16 through
`from_pretrained(dtype=torch.bfloat16)`), and records prefill logits, greedy
decode logits, per-layer hidden states and indexer selections, plus the
sensitivity of the logits to each feature (one feature perturbed at a time).

Usage (normally through make-fixtures.sh):
    python tools/reference/glm5_next_fixtures.py --out crates/engine/tests/fixtures/glm5_next

See docs/glm5_next.md for the forward pass and tools/reference/README.md for
what each fixture covers.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib.util
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

# The reference silently swaps in other kernels when these are importable
# (fla: chunk/recurrent KDA; causal_conv1d: the conv; kernels: hub kernels for
# RMSNorm & co). The fixtures must come from the plain torch path.
for _forbidden in ("fla", "causal_conv1d", "kernels"):
    if importlib.util.find_spec(_forbidden) is not None:
        sys.exit(f"error: `{_forbidden}` is importable; uninstall it, the reference would switch kernels")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache, Glm5NextConfig, Glm5NextForConditionalGeneration  # noqa: E402
from transformers.models.glm5_next import modeling_glm5_next as ref  # noqa: E402

REQUIRED_TRANSFORMERS = "5.23.0"
N_DECODE = 32
HIDDEN_FIRST = 8  # hidden states recorded for prefill positions 0..HIDDEN_FIRST-1 ...
HIDDEN_LAST = 2  # ... and for the last HIDDEN_LAST prefill positions
HIDDEN_DECODE = 2  # and for the first HIDDEN_DECODE decode steps
TOLERANCE = 1e-4  # the f32 acceptance bound of issue 4, used to flag sensitivities

# A deliberately tiny vision tower: it is part of the checkpoint (as in the real
# model) but never runs for text-only input.
VISION = dict(
    depth=1,
    hidden_size=16,
    num_heads=2,
    intermediate_size=16,
    projection_intermediate_size=16,
    patch_size=2,
    spatial_merge_size=1,
    temporal_patch_size=1,
)

# Distinct sizes on purpose (hidden 64, q_lora 48, kv_lora 40, nope 24, v 16,
# KDA qkv 3x16=48, indexer 16 heads x 32) so that a transposed or swapped
# weight fails on shape, not silently.
COMMON_TEXT = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=48,
    kv_lora_rank=40,
    qk_rope_head_dim=0,
    qk_nope_head_dim=24,
    v_head_dim=16,
    index_n_heads=16,
    index_head_dim=32,
    linear_num_heads=3,
    linear_head_dim=16,
    linear_conv_kernel_dim=4,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-5,
    n_routed_experts=16,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    hidden_act="silu",
    pad_token_id=None,
    tie_word_embeddings=False,
)

FIXTURES = [
    dict(
        name="lowerbound_sparse",
        seed=1001,
        prompt_len=150,
        covers=[
            "KDA forget gate with linear_lower_bound=-5.0 (sigmoid form)",
            "chunked KDA prefill over 3 chunks of 64 (last one padded), recurrent KDA decode, conv state",
            "MLA without RoPE (q/kv LoRA, normalised latent cache)",
            "DSA indexer: `full` layer followed by a `shared` layer (layers 1 -> 2) and a lone `full` layer (4)",
            "index_topk=64, index_kpool=8: positions < 71 see every token, later ones are sparse; "
            "prompt 150 = 18 pools + tail of 6; decode crosses pool boundaries",
            "dense MLP (layers 0, 3) and MoE (layers 1, 2, 4)",
            "grouped routing n_group=4, topk_group=2, top-4 of 16 experts, renormalised, routed_scaling_factor 2.5",
            "swiglu_limit=2.0 clamps gate (max only) and up (both sides)",
            "hc_mult=4, 20 Sinkhorn iterations",
        ],
        text=dict(
            vocab_size=320,
            num_hidden_layers=5,
            layer_types=[
                "linear_attention",
                "indexed_attention",
                "indexed_attention",
                "linear_attention",
                "indexed_attention",
            ],
            indexer_types=["full", "full", "shared", "full", "full"],
            mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse"],
            linear_lower_bound=-5.0,
            index_topk=64,
            index_kpool=8,
            index_kpool_always_select_tail=True,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=4,
            norm_topk_prob=True,
            swiglu_limit=2.0,
        ),
    ),
    dict(
        name="softplus_dense",
        seed=2002,
        prompt_len=141,
        covers=[
            "KDA forget gate with linear_lower_bound=null (softplus form, threshold 20)",
            "chunked KDA prefill over 3 chunks of 64 (last one padded), recurrent KDA decode, conv state",
            "MLA as the first layer; `full` layer 3 followed by a `shared` last layer 4",
            "index_topk=256 > context (173): the indexer selects every visible token; index_kpool=16, "
            "prompt 141 = 8 pools + tail of 13",
            "dense MLP (layer 0) and MoE (layers 1-4)",
            "ungrouped routing n_group=1, top-2 of 16 experts, norm_topk_prob=false",
            "swiglu_limit=3.0 clamps a smaller fraction",
            "hc_mult=4, 20 Sinkhorn iterations",
        ],
        text=dict(
            vocab_size=256,
            num_hidden_layers=5,
            layer_types=[
                "indexed_attention",
                "linear_attention",
                "linear_attention",
                "indexed_attention",
                "indexed_attention",
            ],
            indexer_types=["full", "full", "full", "full", "shared"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
            linear_lower_bound=None,
            index_topk=256,
            index_kpool=16,
            index_kpool_always_select_tail=True,
            n_group=1,
            topk_group=1,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            swiglu_limit=3.0,
        ),
    ),
    # GLM-5.3-Flash's own layout, small: what llama.cpp's converter accepts (one head
    # count for KDA and MLA, leading dense layers), so that the same checkpoint is also
    # converted by llama.cpp (tools/reference/llamacpp_convert.py -> llamacpp.gguf).
    dict(
        name="real_layout",
        seed=3004,
        prompt_len=150,
        covers=[
            "GLM-5.3-Flash's layer schedule (the config defaults): KDA where i % 4 != 3, MLA + DSA where "
            "i % 4 == 3 (layers 3, 7, both `full`: a `shared` layer after a KDA layer cannot run in the "
            "reference, so the real 3:1 layout has none)",
            "KDA head count = MLA head count (4), as llama.cpp's glm5-next requires; gate lower bound -5.0 "
            "(the real model's)",
            "3 leading dense MLP layers, then MoE (layers 3-7), as the real model",
            "index_kpool 16 (the real model's), index_topk 64: positions < 79 see every token, later ones "
            "are sparse; prompt 150 = 9 pools + tail 6; decode crosses the pool ends at 159 and 175",
            "grouped routing: 12 experts in 3 groups, topk_group 2, top-4, renormalised, scaling 2.5; "
            "one shared expert",
            "swiglu_limit 2.0 on the dense MLP, shared and routed experts",
            "hc_mult 4, 20 Sinkhorn iterations",
            "also converted by llama.cpp's converter (llamacpp.gguf in the f32 folder)",
        ],
        text=dict(
            vocab_size=288,
            hidden_size=32,
            intermediate_size=64,
            moe_intermediate_size=16,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=40,
            kv_lora_rank=28,
            qk_nope_head_dim=20,
            v_head_dim=12,
            index_n_heads=16,
            index_head_dim=24,
            linear_num_heads=4,
            linear_head_dim=12,
            n_routed_experts=12,
            num_hidden_layers=8,
            layer_types=None,  # the config's default: KDA for i % 4 != 3, MLA for i % 4 == 3
            indexer_types=None,  # default: all `full`
            mlp_layer_types=None,  # default: 3 dense, then sparse
            linear_lower_bound=-5.0,
            index_topk=64,
            index_kpool=16,
            index_kpool_always_select_tail=True,
            n_group=3,
            topk_group=2,
            num_experts_per_tok=4,
            norm_topk_prob=True,
            swiglu_limit=2.0,
        ),
    ),
]


# --------------------------------------------------------------------------
# model construction and re-randomisation


def build_config(spec: dict) -> Glm5NextConfig:
    text = dict(COMMON_TEXT)
    text.update(spec["text"])
    return Glm5NextConfig(text_config=text, vision_config=dict(VISION, out_hidden_size=text["hidden_size"]))


def randomise(model: Glm5NextForConditionalGeneration, seed: int) -> None:
    """Re-draw every text-model parameter and buffer.

    The reference initialises several tensors to constants (router correction
    bias 0, hc base 0 / scale 1, kpool gate 1 / ape 0, A_log 0 or log U(1,16))
    and its default init makes the logits nearly flat; these scales make every
    code path move the logits (see the sensitivity table in the manifests).
    """
    cfg = model.config.text_config
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float64).mul(std).add(mean).float()

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen, dtype=torch.float64).mul(hi - lo).add(lo).float()

    lm = model.model.language_model
    tensors = dict(lm.named_parameters())
    tensors.update(dict(lm.named_buffers()))
    tensors["<lm_head>"] = model.lm_head.weight
    with torch.no_grad():
        for name, t in sorted(tensors.items()):
            leaf = name.rsplit(".", 1)[-1]
            shape = tuple(t.shape)
            if name == "embed_tokens.weight":
                new = normal(shape, 1.0)
            elif name == "<lm_head>":
                new = normal(shape, 2.0 / math.sqrt(shape[1]))
            elif name.endswith("_hc.fn"):
                new = normal(shape, 1.5 / math.sqrt(shape[1]))
            elif name.endswith("_hc.base"):
                new = normal(shape, 0.5)
            elif name.endswith("_hc.scale"):
                new = uniform(shape, 0.5, 1.5)
            elif "norm" in name and leaf == "weight":  # RMSNorm / gated norm / LayerNorm gains
                new = normal(shape, 0.2, 1.0)
            elif "norm" in name and leaf == "bias":  # indexer k_norm (LayerNorm) bias
                new = normal(shape, 0.2)
            elif leaf == "A_log":
                # lower-bound form: -5*sigmoid(exp(A_log)*g); softplus form: -exp(A_log)*softplus(g)
                new = normal(shape, 0.3) if cfg.linear_lower_bound is not None else normal(shape, 0.4, -1.0)
            elif leaf == "dt_bias":
                # keeps log-decays mostly in (-0.5, -0.02) per token so state spans chunks
                new = normal(shape, 0.8, -3.0) if cfg.linear_lower_bound is not None else normal(shape, 0.6, -2.0)
            elif name.endswith("conv1d.weight"):
                new = normal(shape, 0.5)
            elif leaf == "e_score_correction_bias":
                new = normal(shape, 0.1)
            elif leaf == "index_kpool_compress_ape":
                new = normal(shape, 1.0)
            elif leaf == "index_kpool_compress_gate":
                new = normal(shape, 1.5 / math.sqrt(shape[1]))
            elif name.endswith("experts.gate_up_proj"):  # [E, 2I, D]
                new = normal(shape, 1.0 / math.sqrt(shape[2]))
            elif name.endswith("experts.down_proj"):  # [E, D, I]
                new = normal(shape, 1.0 / math.sqrt(shape[2]))
            elif leaf == "weight" and len(shape) == 2:  # every nn.Linear
                new = normal(shape, 1.0 / math.sqrt(shape[1]))
            else:
                raise RuntimeError(f"randomise: no rule for {name} {shape}")
            t.copy_(new)


# --------------------------------------------------------------------------
# running the reference


def lm_layers(model):
    return model.model.language_model.layers


def greedy_run(model, prompt: torch.Tensor, feed: list[int] | None = None, capture: bool = False) -> dict:
    """Prefill `prompt` in one call, then N_DECODE single-token calls with the
    reference's DynamicCache. Greedy unless `feed` (tokens to teacher-force) is
    given. Returns f32 logits (and captures when asked)."""
    cap: dict = {}
    handles = []
    if capture:
        layers = lm_layers(model)
        cap = {"embed": [], "streams": [[] for _ in layers], "attn": [[] for _ in layers], "mlp": [[] for _ in layers]}
        cap["topk"] = {}
        handles.append(
            model.model.language_model.embed_tokens.register_forward_hook(
                lambda m, i, o: cap["embed"].append(o.detach().float()[0])
            )
        )
        for li, layer in enumerate(layers):
            handles.append(
                layer.register_forward_hook(lambda m, i, o, li=li: cap["streams"][li].append(o[0].detach().float()[0]))
            )
            handles.append(
                layer.self_attn.register_forward_hook(
                    lambda m, i, o, li=li: cap["attn"][li].append((o[0] if isinstance(o, tuple) else o).detach().float()[0])
                )
            )
            handles.append(
                layer.mlp.register_forward_hook(lambda m, i, o, li=li: cap["mlp"][li].append(o.detach().float()[0]))
            )
            idx = getattr(layer.self_attn, "indexer", None)
            if idx is not None:
                cap["topk"][li] = []
                handles.append(idx.register_forward_hook(lambda m, i, o, li=li: cap["topk"][li].append(o.detach()[0])))
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=prompt[None], past_key_values=cache, use_cache=True)
            prefill = out.logits[0].float()
            nxt = int(prefill[-1].argmax())
            fed, dec = [], []
            for step in range(N_DECODE):
                tok = nxt if feed is None else int(feed[step])
                fed.append(tok)
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
                row = out.logits[0, -1].float()
                dec.append(row)
                nxt = int(row.argmax())
    finally:
        for h in handles:
            h.remove()
    return dict(prefill=prefill, decode=torch.stack(dec), fed=fed, last=nxt, cap=cap)


def rel_err(a: torch.Tensor, ref_logits: torch.Tensor) -> float:
    """max over rows of max|a - ref| / max(1, std(ref row)) — the metric of issue 4."""
    a, r = a.double(), ref_logits.double()
    scale = r.std(dim=-1, unbiased=False).clamp_min(1.0)
    return float(((a - r).abs().amax(dim=-1) / scale).max())


def top2_gap(logits: torch.Tensor) -> float:
    v = logits.double().topk(2, dim=-1).values
    return float((v[:, 0] - v[:, 1]).min())


# --------------------------------------------------------------------------
# perturbations (one feature off at a time) for the sensitivity table


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class _NoRelu:
    """Stand-in for torch.nn.functional inside the reference module with relu = identity."""

    def __getattr__(self, item):
        return getattr(torch.nn.functional, item)

    @staticmethod
    def relu(x):
        return x


def _kda_layers(model):
    return [l.self_attn for l in lm_layers(model) if isinstance(l.self_attn, ref.Glm5NextTextLinearAttention)]


def _mla_layers(model):
    return [l.self_attn for l in lm_layers(model) if isinstance(l.self_attn, ref.Glm5NextTextAttention)]


def _indexers(model):
    return [a.indexer for a in _mla_layers(model) if a.indexer is not None]


def _hcs(model):
    return [hc for l in lm_layers(model) for hc in (l.attn_hc, l.ffn_hc)]


def _moes(model):
    return [l.mlp for l in lm_layers(model) if isinstance(l.mlp, ref.Glm5NextTextMoE)]


def _swiglus(model):
    out = []
    for l in lm_layers(model):
        if isinstance(l.mlp, ref.Glm5NextTextMoE):
            out += [l.mlp.experts, l.mlp.shared_experts]
        else:
            out.append(l.mlp)
    return out


def _hook_output(modules, fn, stack):
    for m in modules:
        h = m.register_forward_hook(lambda mod, i, o: fn(mod, o))
        stack.callback(h.remove)


def _set_all(objs, name, value, stack):
    for o in objs:
        stack.enter_context(patched(o, name, value))


def _zero_params(tensors):
    with torch.no_grad():
        for t in tensors:
            t.zero_()


def _chunk_state_reset(orig):
    """chunk_kimi_delta_attention that forgets the state at every 64-token chunk boundary."""

    def run(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False, **kw):
        outs, state = [], initial_state
        for s in range(0, query.shape[1], chunk_size):
            sl = slice(s, s + chunk_size)
            o, st = orig(
                query[:, sl], key[:, sl], value[:, sl], g[:, sl], beta[:, sl],
                chunk_size=chunk_size, initial_state=state if s == 0 else None,
                output_final_state=True, **kw,
            )
            outs.append(o)
            state = st
        return torch.cat(outs, dim=1), (state if output_final_state else None)

    return run


def _causal_topk(attn, hidden_states, past_key_values):
    """Indices selecting every causal token, in the layout a shared layer receives."""
    s = hidden_states.shape[1]
    past = past_key_values.get_seq_length(attn.layer_idx)
    total = past + s
    kv = torch.arange(total)[None, :].expand(s, total)
    q = past + torch.arange(s)[:, None]
    return torch.where(kv <= q, kv, torch.full_like(kv, -1))[None].to(torch.int32)


def perturbations(model) -> dict:
    """name -> (description, function(model_copy, ExitStack) applying the change)."""
    cfg = model.config.text_config
    P = {}

    def add(name, desc):
        def deco(fn):
            P[name] = (desc, fn)
            return fn

        return deco

    # --- mHC
    @add("hc_sinkhorn_1", "Sinkhorn stopped after softmax + 1 column normalisation (iters=1 instead of 20)")
    def _(m, st):
        _set_all(_hcs(m), "hc_sinkhorn_iters", 1, st)

    @add("hc_sinkhorn_19", "Sinkhorn with 19 iterations instead of 20 (off by one)")
    def _(m, st):
        _set_all(_hcs(m), "hc_sinkhorn_iters", cfg.hc_sinkhorn_iters - 1, st)

    @add("hc_comb_transposed", "residual mixing with comb instead of comb^T")
    def _(m, st):
        _hook_output(_hcs(m), lambda mod, o: (o[0], o[1].transpose(-1, -2), o[2]), st)

    @add("hc_post_ones", "post weights forced to 1 (block output copied to every stream)")
    def _(m, st):
        _hook_output(_hcs(m), lambda mod, o: (torch.ones_like(o[0]), o[1], o[2]), st)

    @add("hc_pre_mean", "pre weights replaced by 1/hc_mult (plain mean of the streams)")
    def _(m, st):
        for layer in lm_layers(m):
            for hc in (layer.attn_hc, layer.ffn_hc):
                def pre_hook(mod, args):
                    mod._streams = args[0]
                st.callback(hc.register_forward_pre_hook(pre_hook).remove)
        _hook_output(_hcs(m), lambda mod, o: (o[0], o[1], mod._streams.mean(dim=2)), st)

    @add("hc_input_norm_off", "no RMS normalisation of the flattened streams before hc fn")
    def _(m, st):
        _set_all(_hcs(m), "input_norm", torch.nn.Identity(), st)

    @add("hc_eps_0", "hc_eps = 0 (pre, comb and Sinkhorn denominators)")
    def _(m, st):
        _set_all(_hcs(m), "hc_eps", 0.0, st)

    @add("hc_head_first_stream", "final hc collapse takes stream 0 instead of the mean")
    def _(m, st):
        st.enter_context(patched(m.model.language_model.hc_head, "forward", lambda h: h[:, :, 0]))

    # --- KDA
    @add("kda_conv_identity", "depthwise conv replaced by identity (SiLU kept)")
    def _(m, st):
        with torch.no_grad():
            for a in _kda_layers(m):
                w = torch.zeros_like(a.conv1d.weight)
                w[..., -1] = 1.0
                a.conv1d.weight.copy_(w)

    @add("kda_conv_no_silu", "no SiLU after the depthwise conv")
    def _(m, st):
        _set_all(_kda_layers(m), "activation", None, st)

    @add("kda_chunk_state_reset", "recurrent state not carried across 64-token prefill chunks")
    def _(m, st):
        st.enter_context(patched(ref, "chunk_kimi_delta_attention", _chunk_state_reset(ref.chunk_kimi_delta_attention)))

    @add("kda_decode_conv_state_zeroed", "conv state zeroed before every decode step (decode rows only)")
    def _(m, st):
        orig = ref.causal_conv1d_update

        def upd(hidden_states, conv_state, *a, **k):
            conv_state.zero_()
            return orig(hidden_states, conv_state, *a, **k)

        st.enter_context(patched(ref, "causal_conv1d_update", upd))

    @add("kda_decode_state_zeroed", "recurrent state zeroed before every decode step (decode rows only)")
    def _(m, st):
        orig = ref.recurrent_kimi_delta_attention

        def rec(q, k, v, g, beta, initial_state, output_final_state, **kw):
            return orig(q, k, v, g, beta, torch.zeros_like(initial_state), output_final_state, **kw)

        st.enter_context(patched(ref, "recurrent_kimi_delta_attention", rec))

    @add("kda_gate_other_form", "forget gate uses the other form (lower-bound sigmoid <-> softplus)")
    def _(m, st):
        other = None if cfg.linear_lower_bound is not None else -5.0
        _set_all([a.forget_gate for a in _kda_layers(m)], "safe_gate_lower_bound", other, st)

    @add("kda_A_log_zero", "A_log = 0 (decay rate 1)")
    def _(m, st):
        _zero_params([a.forget_gate.A_log for a in _kda_layers(m)])

    @add("kda_dt_bias_zero", "dt_bias = 0")
    def _(m, st):
        _zero_params([a.forget_gate.dt_bias for a in _kda_layers(m)])

    @add("kda_beta_one", "beta = 1 instead of sigmoid(b_proj x)")
    def _(m, st):
        _hook_output([a.b_proj for a in _kda_layers(m)], lambda mod, o: torch.full_like(o, 1e4), st)

    @add("kda_qk_l2norm_off", "q/k not L2-normalised")
    def _(m, st):
        for name in ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"):
            orig = getattr(ref, name)

            def f(*a, _orig=orig, **k):
                k["use_qk_l2norm_in_kernel"] = False
                return _orig(*a, **k)

            st.enter_context(patched(ref, name, f))

    @add("kda_output_gate_off", "gated output norm without the sigmoid gate")
    def _(m, st):
        _hook_output([a.g_b_proj for a in _kda_layers(m)], lambda mod, o: torch.full_like(o, 1e4), st)

    @add("kda_o_norm_weight_ones", "gated output norm weight = 1")
    def _(m, st):
        with torch.no_grad():
            for a in _kda_layers(m):
                a.o_norm.weight.fill_(1.0)

    # --- MLA
    @add("mla_q_a_norm_off", "no q_a_layernorm")
    def _(m, st):
        _set_all(_mla_layers(m), "q_a_layernorm", torch.nn.Identity(), st)

    @add("mla_kv_a_norm_off", "no kv_a_layernorm (latent cache not normalised)")
    def _(m, st):
        _set_all(_mla_layers(m), "kv_a_layernorm", torch.nn.Identity(), st)

    @add("mla_scale_v_head_dim", "softmax scale 1/sqrt(v_head_dim) instead of 1/sqrt(qk_head_dim)")
    def _(m, st):
        _set_all(_mla_layers(m), "scaling", cfg.v_head_dim**-0.5, st)

    # --- DSA indexer
    if _indexers(model):
        @add("dsa_dense", "indexer selects every causal token (dense attention)")
        def _(m, st):
            big = cfg.index_kpool * 64
            _set_all(_indexers(m), "index_topk", big, st)

        @add("dsa_no_tail", "incomplete kpool tail not appended")
        def _(m, st):
            _set_all(_indexers(m), "index_kpool_always_select_tail", False, st)

        @add("dsa_pool_plain_mean", "pooled key = plain mean (kpool gate and ape zero)")
        def _(m, st):
            _zero_params([p for i in _indexers(m) for p in (i.index_kpool_compress_gate, i.index_kpool_compress_ape)])

        @add("dsa_ape_off", "kpool ape (per-slot bias of the gate logits) zero")
        def _(m, st):
            _zero_params([i.index_kpool_compress_ape for i in _indexers(m)])

        @add("dsa_relu_off", "head scores not ReLU'd")
        def _(m, st):
            st.enter_context(patched(ref, "F", _NoRelu()))

        @add("dsa_head_weights_ones", "weights_proj output replaced by 1 (unweighted head sum)")
        def _(m, st):
            _hook_output([i.weights_proj for i in _indexers(m)], lambda mod, o: torch.ones_like(o), st)

        @add("dsa_k_norm_off", "indexer k_norm (LayerNorm) removed")
        def _(m, st):
            _set_all(_indexers(m), "k_norm", torch.nn.Identity(), st)

        shared = [a for a in _mla_layers(model) if a.indexer is None]
        if shared:
            @add("dsa_shared_dense", "`shared` layers attend to every causal token instead of the previous selection")
            def _(m, st):
                for a in _mla_layers(m):
                    if a.indexer is None:
                        orig = a.forward

                        def fwd(hidden_states, attention_mask, past_key_values=None, prev_topk_indices=None,
                                _orig=orig, _a=a, **kw):
                            # computed before _orig updates the cache, so `past` is the length before this call
                            idx = _causal_topk(_a, hidden_states, past_key_values)
                            return _orig(hidden_states, attention_mask, past_key_values=past_key_values,
                                         prev_topk_indices=idx, **kw)

                        st.enter_context(patched(a, "forward", fwd))

    # --- MoE
    if _moes(model):
        @add("moe_bias_off", "router correction bias ignored")
        def _(m, st):
            _zero_params([moe.gate.e_score_correction_bias for moe in _moes(m)])

        @add("moe_weights_with_bias", "routing weights taken from biased scores")
        def _(m, st):
            for moe in _moes(m):
                orig = moe.gate.forward

                def fwd(hidden_states, _orig=orig, _g=moe.gate):
                    logits, w, idx = _orig(hidden_states)
                    w = (logits.sigmoid() + _g.e_score_correction_bias).gather(1, idx)
                    if _g.norm_topk_prob:
                        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
                    return logits, w * _g.routed_scaling_factor, idx

                st.enter_context(patched(moe.gate, "forward", fwd))

        if cfg.n_group > 1:
            @add("moe_groups_off", "group-limited selection disabled (top-k over all experts)")
            def _(m, st):
                _set_all([moe.gate for moe in _moes(m)], "num_group", 1, st)
                _set_all([moe.gate for moe in _moes(m)], "topk_group", 1, st)

        @add("moe_renorm_flipped", "norm_topk_prob flipped")
        def _(m, st):
            _set_all([moe.gate for moe in _moes(m)], "norm_topk_prob", not cfg.norm_topk_prob, st)

        @add("moe_routed_scaling_1", "routed_scaling_factor = 1")
        def _(m, st):
            _set_all([moe.gate for moe in _moes(m)], "routed_scaling_factor", 1.0, st)

        @add("moe_shared_expert_off", "shared expert dropped")
        def _(m, st):
            _hook_output([moe.shared_experts for moe in _moes(m)], lambda mod, o: torch.zeros_like(o), st)

    @add("swiglu_clamp_off", "swiglu_limit = inf (no clamp)")
    def _(m, st):
        _set_all(_swiglus(m), "swiglu_limit", float("inf"), st)

    @add("swiglu_gate_clamped_below", "gate also clamped below at -swiglu_limit")
    def _(m, st):
        lim = cfg.swiglu_limit
        for mod in _swiglus(m):
            if isinstance(mod, ref.Glm5NextTextExperts):
                orig = mod._apply_gate

                def ag(gate_up, _orig=orig):
                    gate, up = gate_up.chunk(2, dim=-1)
                    return _orig(torch.cat([gate.clamp(min=-lim), up], dim=-1))

                st.enter_context(patched(mod, "_apply_gate", ag))
            else:
                _hook_output([mod.gate_proj], lambda _m, o: o.clamp(min=-lim), st)

    # --- head
    @add("final_norm_off", "final RMSNorm removed")
    def _(m, st):
        st.enter_context(patched(m.model.language_model, "norm", torch.nn.Identity()))

    return P


def implementation_variants() -> dict:
    """Changes that must NOT matter beyond float rounding (informational)."""
    V = {}

    V["kda_chunk_32"] = (
        "KDA prefill with chunk size 32 instead of 64",
        lambda m, st: st.enter_context(
            patched(ref, "chunk_kimi_delta_attention",
                    (lambda orig: (lambda *a, **k: orig(*a, **{**k, "chunk_size": 32})))(ref.chunk_kimi_delta_attention))
        ),
    )

    def eager(m, st):
        for cfg in (m.config, m.config.text_config):
            st.enter_context(patched(cfg, "_attn_implementation_internal", "eager"))

    V["attn_eager"] = ("eager attention instead of sdpa", eager)

    def experts_eager(m, st):
        for cfg in (m.config, m.config.text_config):
            st.enter_context(patched(cfg, "_experts_implementation_internal", "eager"))

    V["experts_eager"] = ("eager expert loop (index_add_) instead of grouped_mm", experts_eager)
    return V


def run_variant(model, fn, prompt, feed) -> dict:
    m = copy.deepcopy(model)
    with contextlib.ExitStack() as st:
        fn(m, st)
        return greedy_run(m, prompt, feed=feed)


def split_invariance(model, prompt, base) -> dict:
    """The same prompt prefilled in 64-token calls and token by token (reference cache)."""
    res = {}
    for label, piece in (("pieces_64", 64), ("token_by_token", 1)):
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            rows = []
            for s in range(0, len(prompt), piece):
                out = model(input_ids=prompt[None, s : s + piece], past_key_values=cache, use_cache=True)
                rows.append(out.logits[0].float())
        res[label] = rel_err(torch.cat(rows), base["prefill"])
    return res


# --------------------------------------------------------------------------
# instrumentation: swiglu clamping counts, indexer selection cross-check


def clamp_stats(model, prompt) -> dict:
    """How many gate / up values the swiglu clamp changed in the prefill, per layer."""
    lim = model.config.text_config.swiglu_limit
    stats: dict = {}
    handles = []

    def count(key, gate, up):
        s = stats.setdefault(key, dict(gate_clamped=0, up_clamped=0, elements=0))
        s["gate_clamped"] += int((gate > lim).sum())
        s["up_clamped"] += int((up.abs() > lim).sum())
        s["elements"] += int(gate.numel())

    with contextlib.ExitStack() as st:
        for li, layer in enumerate(lm_layers(model)):
            mlps = [("mlp", layer.mlp)] if not isinstance(layer.mlp, ref.Glm5NextTextMoE) else [
                ("shared_expert", layer.mlp.shared_experts)]
            for kind, mlp in mlps:
                box = {}
                handles.append(mlp.gate_proj.register_forward_hook(lambda m, i, o, box=box: box.__setitem__("g", o)))
                handles.append(mlp.up_proj.register_forward_hook(
                    lambda m, i, o, box=box, key=f"layer{li}.{kind}": count(key, box["g"], o)))
            if isinstance(layer.mlp, ref.Glm5NextTextMoE):
                ex = layer.mlp.experts
                orig = ex._apply_gate

                def ag(gate_up, _orig=orig, key=f"layer{li}.routed_experts"):
                    gate, up = gate_up.chunk(2, dim=-1)
                    count(key, gate, up)
                    return _orig(gate_up)

                st.enter_context(patched(ex, "_apply_gate", ag))
        try:
            with torch.no_grad():
                model(input_ids=prompt[None], use_cache=False)
        finally:
            for h in handles:
                h.remove()
    return stats


def indexer_crosscheck(model, prompt, topk_captured: dict) -> dict:
    """Recompute the DSA selection of every `full` layer for the whole prefill
    with an independent implementation of docs/glm5_next.md §DSA and compare
    it (as sets) with the reference's; also report the smallest score gap
    between the last selected and the first rejected pool (ties would make the
    selection implementation-dependent)."""
    cfg = model.config.text_config
    inputs: dict = {}
    handles = []
    for li, a in enumerate(lm_layers(model)):
        idx = getattr(a.self_attn, "indexer", None)
        if idx is not None:
            handles.append(idx.register_forward_pre_hook(
                lambda m, args, kwargs, li=li: inputs.__setitem__(li, (kwargs["hidden_states"], kwargs["q_resid"])),
                with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=prompt[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()

    report = {}
    kp, hd, nh = cfg.index_kpool, cfg.index_head_dim, cfg.index_n_heads
    torch.set_grad_enabled(False)
    for li, (x, q_resid) in inputs.items():
        ix = lm_layers(model)[li].self_attn.indexer
        x, q_resid = x[0].double(), q_resid[0].double()
        s = x.shape[0]
        q = (q_resid @ ix.wq_b.weight.double().T).view(s, nh, hd)
        k = torch.nn.functional.layer_norm(
            x @ ix.wk.weight.double().T, (hd,), ix.k_norm.weight.double(), ix.k_norm.bias.double(), 1e-6)
        gate = x @ ix.index_kpool_compress_gate.double().T
        n_pools = s // kp
        logits = gate[: n_pools * kp].view(n_pools, kp, hd) + ix.index_kpool_compress_ape.double()[None]
        pool_k = (logits.softmax(dim=1) * k[: n_pools * kp].view(n_pools, kp, hd)).sum(dim=1)
        head = torch.relu(torch.einsum("shd,pd->shp", q, pool_k) * hd**-0.5)
        w = (x @ ix.weights_proj.weight.double().T) * nh**-0.5
        score = torch.einsum("sh,shp->sp", w, head)
        select_k = min(cfg.index_topk // kp, n_pools)
        mismatches, min_gap = 0, math.inf
        ref_sel = topk_captured[li][0]  # prefill call
        for t in range(s):
            visible = [p for p in range(n_pools) if (p + 1) * kp - 1 <= t]
            chosen = set()
            if visible:
                sc = score[t, visible]
                order = torch.argsort(sc, descending=True)
                top = [visible[i] for i in order[:select_k].tolist()]
                if len(visible) > select_k:
                    gap = float(sc[order[select_k - 1]] - sc[order[select_k]])
                    min_gap = min(min_gap, gap / max(1e-30, float(sc.abs().max())))
                for p in top:
                    chosen.update(range(p * kp, (p + 1) * kp))
            tail = (t + 1) % kp
            if cfg.index_kpool_always_select_tail:
                chosen.update(range(t + 1 - tail, t + 1))
            got = {int(v) for v in ref_sel[t].tolist() if v >= 0}
            mismatches += got != chosen
        report[f"layer{li}"] = dict(
            queries=s, mismatched_queries=mismatches,
            min_relative_gap_kth_vs_next=None if min_gap == math.inf else min_gap,
        )
    torch.set_grad_enabled(True)
    return report


# --------------------------------------------------------------------------
# writing


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Writer:
    def __init__(self, root: Path):
        self.root = root
        self.arrays: dict = {}

    def save(self, name: str, arr, description: str):
        arr = np.asarray(arr)
        if arr.dtype.kind == "f":
            arr = arr.astype("<f4")
        elif arr.dtype.kind in "iu":
            arr = arr.astype("<i4")
        path = self.root / f"{name}.npy"
        np.save(path, np.ascontiguousarray(arr), allow_pickle=False)
        self.arrays[name] = dict(
            file=path.name, dtype=str(arr.dtype), shape=list(arr.shape), sha256=sha256(path), description=description
        )


def hidden_positions(prompt_len: int) -> list[int]:
    return list(range(HIDDEN_FIRST)) + list(range(prompt_len - HIDDEN_LAST, prompt_len))


def write_outputs(w: Writer, res: dict, prompt: torch.Tensor, model) -> dict:
    cap = res["cap"]
    S = len(prompt)
    pos = hidden_positions(S)
    L = len(lm_layers(model))
    w.save("prompt", prompt.numpy(), "prompt token ids [S]")
    w.save("prefill_logits", res["prefill"].numpy(), "logits of the one-call prefill at every prompt position [S, V]")
    w.save("decode_tokens", np.array(res["fed"] + [res["last"]]),
           f"greedy tokens [{N_DECODE}+1]: entry i is fed at decode step i; the last one is the argmax of the last step")
    w.save("decode_logits", res["decode"].numpy(),
           f"logits of decode step i (one token, reference cache) after feeding decode_tokens[i] [{N_DECODE}, V]")
    # prefill is call 0, decode step i is call i+1
    emb = cap["embed"][0][pos]
    streams = torch.stack([cap["streams"][li][0][pos] for li in range(L)])
    attn = torch.stack([cap["attn"][li][0][pos] for li in range(L)])
    mlp = torch.stack([cap["mlp"][li][0][pos] for li in range(L)])
    w.save("hidden_positions", np.array(pos), "prompt positions of the hidden_* arrays [P]")
    w.save("hidden_embed", emb.numpy(), "token embeddings (copied into every hc stream) [P, D]")
    w.save("hidden_streams", streams.numpy(), "hc streams after each decoder layer [L, P, hc_mult, D]")
    w.save("hidden_attn_out", attn.numpy(), "output of each layer's attention block (KDA/MLA o_proj) [L, P, D]")
    w.save("hidden_mlp_out", mlp.numpy(), "output of each layer's MLP/MoE block [L, P, D]")
    dec_streams = torch.stack(
        [torch.stack([cap["streams"][li][1 + i][0] for li in range(L)]) for i in range(HIDDEN_DECODE)], dim=1)
    dec_attn = torch.stack(
        [torch.stack([cap["attn"][li][1 + i][0] for li in range(L)]) for i in range(HIDDEN_DECODE)], dim=1)
    w.save("hidden_decode_streams", dec_streams.numpy(),
           f"hc streams after each layer for decode steps 0..{HIDDEN_DECODE - 1} [L, {HIDDEN_DECODE}, hc_mult, D]")
    w.save("hidden_decode_attn_out", dec_attn.numpy(),
           f"attention block output for decode steps 0..{HIDDEN_DECODE - 1} [L, {HIDDEN_DECODE}, D]")
    for li, calls in cap["topk"].items():
        w.save(f"indexer_topk_layer{li}", calls[0].numpy(),
               "raw indexer output of this `full` layer for the prefill (token indices, -1 = none; "
               "compare as sets per row) [S, index_topk + index_kpool - 1]")
        dec = torch.stack([c[0] for c in calls[1:]])
        w.save(f"indexer_topk_layer{li}_decode", dec.numpy(),
               f"indexer output for each decode step [{N_DECODE}, index_topk + index_kpool - 1]")
    return dict(prompt_len=S, decode_steps=N_DECODE, hidden_positions=pos)


def fp32_kept(model) -> list[str]:
    lm = model.model.language_model
    names = [n for n, p in list(lm.named_parameters()) + list(lm.named_buffers()) if p.dtype == torch.float32]
    return sorted({".".join("*" if part.isdigit() else part for part in n.split(".")) for n in names})


def make_fixture(spec: dict, out_root: Path, with_sensitivity: bool) -> list[dict]:
    name = spec["name"]
    torch.manual_seed(spec["seed"])
    cfg = build_config(spec)
    model = Glm5NextForConditionalGeneration(cfg).eval()
    randomise(model, spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"] + 7)
    prompt = torch.randint(0, cfg.text_config.vocab_size, (spec["prompt_len"],), generator=gen)

    summaries = []
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for suffix in ("f32", "bf16"):
            stale = out_root / f"{name}_{suffix}"
            if stale.exists():
                shutil.rmtree(stale)
        f32_dir = out_root / f"{name}_f32"
        f32_dir.mkdir(parents=True)
        shutil.copy(Path(tmp) / "config.json", f32_dir / "config.json")
        shutil.copy(Path(tmp) / "model.safetensors", f32_dir / "model.safetensors")

        for dtype_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            loaded = Glm5NextForConditionalGeneration.from_pretrained(tmp, dtype=dtype).eval()
            if dtype == torch.float32:
                mine, theirs = model.state_dict(), loaded.state_dict()
                assert mine.keys() == theirs.keys(), "reloaded checkpoint has different tensors"
                for k in mine:
                    assert torch.equal(mine[k], theirs[k]), f"reload changed {k}"
            out_dir = out_root / f"{name}_{dtype_name}"
            out_dir.mkdir(parents=True, exist_ok=True)
            if dtype_name == "bf16":
                shutil.copy(Path(tmp) / "config.json", out_dir / "config.json")
            summaries.append(record(spec, loaded, prompt, out_dir, dtype_name, with_sensitivity and dtype_name == "f32"))
    return summaries


def record(spec, model, prompt, out_dir: Path, dtype_name: str, with_sensitivity: bool) -> dict:
    print(f"[{spec['name']} {dtype_name}] reference run", flush=True)
    cfg = model.config.text_config
    res = greedy_run(model, prompt, capture=True)
    w = Writer(out_dir)
    meta = write_outputs(w, res, prompt, model)

    # the reference's own generate() must agree with the manual greedy loop
    with torch.no_grad():
        # (an explicit all-ones mask: generate() would otherwise treat pad_token_id in the prompt as padding)
        gen = model.generate(input_ids=prompt[None], attention_mask=torch.ones_like(prompt[None]),
                             max_new_tokens=N_DECODE + 1, do_sample=False, eos_token_id=None, pad_token_id=0)
    gen_tokens = gen[0, len(prompt):].tolist()
    assert gen_tokens == res["fed"] + [res["last"]], "generate() disagrees with the manual greedy loop"

    checks = dict(
        generate_agrees_with_manual_loop=True,
        min_top2_gap_prefill=top2_gap(res["prefill"]),
        min_top2_gap_decode=top2_gap(res["decode"]),
        top2_gap_last_prefill_row=top2_gap(res["prefill"][-1:]),
        logits_std_prefill_mean=float(res["prefill"].double().std(dim=-1).mean()),
        logits_std_decode_mean=float(res["decode"].double().std(dim=-1).mean()),
        prefill_split_invariance_rel_err=split_invariance(model, prompt, res),
        swiglu_clamp_counts_prefill=clamp_stats(model, prompt),
    )
    if dtype_name == "f32":
        checks["indexer_selection_crosscheck"] = indexer_crosscheck(model, prompt, res["cap"]["topk"])
        for layer, rep in checks["indexer_selection_crosscheck"].items():
            assert rep["mismatched_queries"] == 0, f"indexer cross-check failed at {layer}: {rep}"
    total_clamped = sum(v["gate_clamped"] + v["up_clamped"] for v in checks["swiglu_clamp_counts_prefill"].values())
    assert total_clamped > 0, "swiglu_limit never clamps"

    sensitivity, variants = {}, {}
    if with_sensitivity:
        feed = res["fed"]
        for key, (desc, fn) in perturbations(model).items():
            r = run_variant(model, fn, prompt, feed)
            sensitivity[key] = dict(description=desc, prefill_rel_err=rel_err(r["prefill"], res["prefill"]),
                                    decode_rel_err=rel_err(r["decode"], res["decode"]))
            print(f"  sensitivity {key:32s} prefill {sensitivity[key]['prefill_rel_err']:.3e} "
                  f"decode {sensitivity[key]['decode_rel_err']:.3e}", flush=True)
        for key, (desc, fn) in implementation_variants().items():
            r = run_variant(model, fn, prompt, feed)
            variants[key] = dict(description=desc, prefill_rel_err=rel_err(r["prefill"], res["prefill"]),
                                 decode_rel_err=rel_err(r["decode"], res["decode"]))
    else:
        for key, (desc, fn) in implementation_variants().items():
            r = run_variant(model, fn, prompt, res["fed"])
            variants[key] = dict(description=desc, prefill_rel_err=rel_err(r["prefill"], res["prefill"]),
                                 decode_rel_err=rel_err(r["decode"], res["decode"]))

    manifest = dict(
        fixture=out_dir.name,
        family="glm5_next",
        reference=dict(
            transformers=transformers.__version__, torch=torch.__version__,
            model_class="Glm5NextForConditionalGeneration (text path only)",
            attn_implementation=model.config.text_config._attn_implementation,
            experts_implementation=model.config.text_config._experts_implementation,
        ),
        dtype=dtype_name,
        checkpoint=dict(
            config="config.json",
            safetensors="model.safetensors" if dtype_name == "f32" else f"../{spec['name']}_f32/model.safetensors",
            stored_dtype="float32",
            load=f"Glm5NextForConditionalGeneration.from_pretrained(dir, dtype=torch.{'float32' if dtype_name == 'f32' else 'bfloat16'})",
            tensors_kept_in_float32=fp32_kept(model) if dtype_name == "bf16" else "all (f32 model)",
        ),
        seed=spec["seed"],
        covers=spec["covers"],
        config_summary=dict(
            layer_types=cfg.layer_types, indexer_types=cfg.indexer_types, mlp_layer_types=cfg.mlp_layer_types,
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, linear_lower_bound=cfg.linear_lower_bound,
            index_topk=cfg.index_topk, index_kpool=cfg.index_kpool, n_group=cfg.n_group, topk_group=cfg.topk_group,
            num_experts_per_tok=cfg.num_experts_per_tok, swiglu_limit=cfg.swiglu_limit,
        ),
        **meta,
        arrays=w.arrays,
        checks=checks,
        tolerance_note="f32: max|ours-ref| <= 1e-4 * max(1, std(ref row)) per row (issue 4); "
                       "bf16: see docs/parity.md",
        sensitivity=sensitivity,
        implementation_variants=variants,
    )
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="fixture folder (crates/engine/tests/fixtures/glm5_next)")
    ap.add_argument("--only", help="build only the fixture with this name")
    ap.add_argument("--no-sensitivity", action="store_true", help="skip the perturbation runs (faster)")
    args = ap.parse_args()
    if transformers.__version__ != REQUIRED_TRANSFORMERS:
        sys.exit(f"error: transformers {transformers.__version__} found, {REQUIRED_TRANSFORMERS} required")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and reproducible
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in FIXTURES:
        if args.only and spec["name"] != args.only:
            continue
        make_fixture(spec, args.out, with_sensitivity=not args.no_sensitivity)
    print("done", flush=True)


if __name__ == "__main__":
    main()
