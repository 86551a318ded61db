#!/usr/bin/env python3
"""Golden-master fixtures for the `deepseek_v4` (DeepSeek-V4-Flash) text model.

The reference is `transformers==5.23.0`, `models/deepseek_v4`
(`DeepseekV4ForCausalLM`), run on the CPU with PyTorch. This script builds
tiny random-weight models that cover every code path of the model (sliding,
compressed sparse (CSA, with its lightning indexer and overlapping windows)
and heavily compressed (HCA) attention; hash-routed and score-routed MoE; mHC),
saves each checkpoint in DeepSeek's original tensor naming (what the published
checkpoint, transformers' loading conversion and llama.cpp's converter all
read), reloads it (f32, and bf16 through `from_pretrained(dtype=torch.bfloat16)`),
and records prefill logits, greedy decode logits, per-layer hidden states and
indexer selections, plus the sensitivity of the logits to each feature (one
feature perturbed at a time).

The routed experts are drawn exactly representable in MXFP4 (e2m1 values times
a power-of-two scale per 32 inputs): llama.cpp's converter always writes the
routed experts as MXFP4 (it repacks DeepSeek's FP4 checkpoint format), so the
GGUF made by tools/reference/llamacpp_convert.py holds the same values.

Usage (normally through make-fixtures.sh):
    python tools/reference/deepseek4_fixtures.py --out crates/engine/tests/fixtures/deepseek4

See docs/deepseek4.md for the forward pass and tools/reference/README.md for
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
import re
import shutil
import sys
import tempfile
from pathlib import Path

for _forbidden in ("fla", "causal_conv1d", "kernels"):
    if importlib.util.find_spec(_forbidden) is not None:
        sys.exit(f"error: `{_forbidden}` is importable; uninstall it, the reference would switch kernels")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM, DynamicCache  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as ref  # noqa: E402

REQUIRED_TRANSFORMERS = "5.23.0"
N_DECODE = 32
HIDDEN_DECODE = 2
TOLERANCE = 1e-4

# e2m1 (FP4) magnitudes, the values MXFP4 can hold before its per-block power-of-two scale
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)

# DeepSeek-V4-Flash's published rope scaling (YaRN on the compressed layers' rope only)
FLASH_ROPE_SCALING = dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=65536,
                          beta_fast=32, beta_slow=1)

COMMON = dict(
    hidden_size=64,
    moe_intermediate_size=32,
    num_key_value_heads=1,
    q_lora_rank=48,
    n_routed_experts=6,
    num_experts_per_tok=2,
    n_shared_experts=1,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    max_position_embeddings=1048576,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    hc_mult=4,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    index_n_heads=16,
    num_nextn_predict_layers=1,
    hidden_act="silu",
    pad_token_id=None,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)

FIXTURES = [
    dict(
        name="small_rates",
        seed=4030,
        prompt_len=150,
        covers=[
            "every layer kind: CSA (layers 0, 3), HCA (1, 4), sliding only (2)",
            "compress rates CSA 4 / HCA 16: 37 CSA and 9 HCA windows close in the 150-token prompt, "
            "decode (positions 150..181) closes 8 CSA windows and the HCA windows ending at 159 and 175",
            "CSA overlap (Ca of window w-1 + Cb of window w) carried across calls; partially filled windows buffered",
            "lightning indexer with index_topk 8 < compressed entries (37..45): real top-k selection, 16 heads",
            "sliding_window 24 < prompt",
            "hash-routed MoE in layers 0-1 (tid2eid, random distinct experts per token), "
            "sqrt-softplus scored top-2 of 6 with correction bias in layers 2-4",
            "swiglu_limit 2.0 clamps gate (max only) and up (both sides) in routed and shared experts",
            "hc_mult 4 with 7 Sinkhorn iterations",
            "o_groups 2 (grouped output projection), partial RoPE (8 of 32 dims, trailing), interleaved pairs",
            "YaRN-scaled `compress` rope (theta 160000, factor 16, original 65536) on CSA/HCA layers; "
            "plain `main` rope (theta 10000) on the sliding layer",
            "non-zero attention sinks, compressor position biases (ape) and hc base/scale",
        ],
        cfg=dict(
            vocab_size=288,
            num_hidden_layers=5,
            num_attention_heads=4,
            head_dim=32,
            partial_rotary_factor=0.25,
            o_groups=2,
            o_lora_rank=20,
            index_head_dim=16,
            index_topk=8,
            sliding_window=24,
            layer_types=[
                "compressed_sparse_attention",
                "heavily_compressed_attention",
                "sliding_attention",
                "compressed_sparse_attention",
                "heavily_compressed_attention",
            ],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
            hc_sinkhorn_iters=7,
            swiglu_limit=2.0,
            rope_parameters=dict(FLASH_ROPE_SCALING),
        ),
    ),
    dict(
        name="real_layout",
        seed=4037,
        prompt_len=300,
        covers=[
            "DeepSeek-V4-Flash's layer pattern truncated to 5 layers: compress_ratios [0, 0, 4, 128, 4] "
            "(sliding, sliding, CSA, HCA, CSA), num_hash_layers 3",
            "the real compress rates 4 and 128 (the only ones llama.cpp's loader accepts): the prompt of 300 "
            "closes 2 HCA windows (at 127 and 255) and 75 CSA windows; decode (300..331) closes 8 CSA windows, "
            "the HCA buffer stays partially filled (44..76 tokens)",
            "sliding_window 128 (real) < prompt",
            "lightning indexer with index_topk 32 < compressed entries (75..83), 16 heads of 16",
            "Flash's hyper-parameters where they are not sizes: hc 4 streams / 20 Sinkhorn iterations, "
            "swiglu_limit 10, routed_scaling_factor 1.5, rope theta 10000 / compress 160000 with YaRN factor 16",
            "o_groups 2, partial RoPE 8 of 32 dims",
        ],
        cfg=dict(
            vocab_size=272,
            num_hidden_layers=5,
            num_attention_heads=4,
            head_dim=32,
            partial_rotary_factor=0.25,
            o_groups=2,
            o_lora_rank=20,
            index_head_dim=16,
            index_topk=32,
            sliding_window=128,
            layer_types=[
                "sliding_attention",
                "sliding_attention",
                "compressed_sparse_attention",
                "heavily_compressed_attention",
                "compressed_sparse_attention",
            ],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            mlp_layer_types=["hash_moe", "hash_moe", "hash_moe", "moe", "moe"],
            hc_sinkhorn_iters=20,
            swiglu_limit=10.0,
            rope_parameters=dict(FLASH_ROPE_SCALING),
        ),
    ),
]


# --------------------------------------------------------------------------
# model construction, re-randomisation, original tensor names


def build_config(spec: dict) -> DeepseekV4Config:
    cfg = dict(COMMON)
    cfg.update(copy.deepcopy(spec["cfg"]))
    return DeepseekV4Config(**cfg)


def mxfp4_exact(x: torch.Tensor) -> torch.Tensor:
    """Round `x` [..., in] (float64) to the nearest value MXFP4 holds with one
    power-of-two scale per 32 consecutive inputs (the scale that maps the
    block's largest magnitude into [3, 6])."""
    shape = x.shape
    assert shape[-1] % 32 == 0, "MXFP4 needs the input dimension to be a multiple of 32"
    b = x.reshape(-1, 32)
    amax = b.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
    q = b / scale
    idx = (q.abs().unsqueeze(-1) - E2M1).abs().argmin(dim=-1)
    out = E2M1[idx] * q.sign() * scale
    return out.reshape(shape)


def randomise(model: DeepseekV4ForCausalLM, seed: int) -> None:
    """Re-draw every parameter and persistent buffer.

    The reference initialises several tensors to constants (sinks 0, compressor
    position biases 0, correction bias 0, tid2eid 0, hc base 0 / scale 1) that
    hide whole code paths; these scales make every path move the logits (see
    the sensitivity table in the manifests)."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen, dtype=torch.float64).mul(std).add(mean)

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen, dtype=torch.float64).mul(hi - lo).add(lo)

    tensors = dict(model.named_parameters())
    for n, b in model.named_buffers():
        if "rotary_emb" not in n:  # rope tables are computed from the config
            tensors[n] = b
    with torch.no_grad():
        for name, t in sorted(tensors.items()):
            leaf = name.rsplit(".", 1)[-1]
            shape = tuple(t.shape)
            if name == "model.embed_tokens.weight":
                new = normal(shape, 1.0)
            elif name == "lm_head.weight":
                new = normal(shape, 2.0 / math.sqrt(shape[1]))
            elif leaf in ("fn", "hc_fn"):
                new = normal(shape, 1.5 / math.sqrt(shape[1]))
            elif leaf in ("base", "hc_base"):
                new = normal(shape, 0.5)
            elif leaf in ("scale", "hc_scale"):
                new = uniform(shape, 0.5, 1.5)
            elif "norm" in name and leaf == "weight":
                new = normal(shape, 0.2, 1.0)
            elif leaf == "sinks":
                new = normal(shape, 0.7, 1.0)
            elif leaf == "position_bias":
                new = normal(shape, 1.0)
            elif leaf == "e_score_correction_bias":
                new = normal(shape, 0.1)
            elif leaf == "tid2eid":
                n_exp = cfg.n_routed_experts
                rows = [torch.randperm(n_exp, generator=gen)[: shape[1]] for _ in range(shape[0])]
                t.copy_(torch.stack(rows).to(t.dtype))
                continue
            elif name.endswith("gate_proj.weight") and ".compressor." in name:
                new = normal(shape, 1.5 / math.sqrt(shape[1]))
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                new = mxfp4_exact(normal(shape, 1.0 / math.sqrt(shape[2])))
            elif leaf == "weight" and len(shape) == 2:
                new = normal(shape, 1.0 / math.sqrt(shape[1]))
            else:
                raise RuntimeError(f"randomise: no rule for {name} {shape}")
            t.copy_(new.to(t.dtype))


_LAYER_NAMES = {
    "self_attn.sinks": "attn.attn_sink",
    "self_attn.q_a_proj.weight": "attn.wq_a.weight",
    "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight",
    "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight",
    "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight",
    "self_attn.compressor.position_bias": "attn.compressor.ape",
    "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "mlp.gate.weight": "ffn.gate.weight",
    "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn",
    "attn_hc.base": "hc_attn_base",
    "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn",
    "ffn_hc.base": "hc_ffn_base",
    "ffn_hc.scale": "hc_ffn_scale",
}


def original_state_dict(model: DeepseekV4ForCausalLM) -> dict[str, torch.Tensor]:
    """The model's tensors under DeepSeek's original checkpoint names (the
    inverse of transformers' `conversion_mapping.py` "deepseek_v4" renames).

    `save_pretrained` is not used: its reverse mapping is lossy for this model
    (it writes `model.embed_tokens.weight`, `model.hc_head.hc_fn`,
    `attn.norm.weight` for the attention kv norm), a naming neither the
    published checkpoint nor llama.cpp's converter uses."""
    inter = model.config.moe_intermediate_size
    out: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if "rotary_emb" in k:
            continue
        if k == "model.embed_tokens.weight":
            out["embed.weight"] = v
        elif k == "lm_head.weight":
            out["head.weight"] = v
        elif k == "model.norm.weight":
            out["norm.weight"] = v
        elif (m := re.match(r"model\.hc_head\.hc_(fn|base|scale)$", k)) is not None:
            out["hc_head_" + m.group(1)] = v
        elif (m := re.match(r"model\.layers\.(\d+)\.(.+)$", k)) is not None:
            p, rest = f"layers.{m.group(1)}.", m.group(2)
            if rest in _LAYER_NAMES:
                out[p + _LAYER_NAMES[rest]] = v
            elif rest == "mlp.experts.gate_up_proj":
                for e in range(v.shape[0]):
                    out[p + f"ffn.experts.{e}.w1.weight"] = v[e, :inter]
                    out[p + f"ffn.experts.{e}.w3.weight"] = v[e, inter:]
            elif rest == "mlp.experts.down_proj":
                for e in range(v.shape[0]):
                    out[p + f"ffn.experts.{e}.w2.weight"] = v[e]
            else:
                raise KeyError(f"no original name for {k}")
        else:
            raise KeyError(f"no original name for {k}")
    return {k: v.detach().contiguous().clone() for k, v in sorted(out.items())}


# --------------------------------------------------------------------------
# running the reference


def layers_of(model):
    return model.model.layers


def state_counts(cache, model) -> dict:
    """Compressor / indexer bookkeeping of each compressed layer's cache."""
    out = {}
    for li, layer in enumerate(cache.layers):
        if not isinstance(layer, ref.DeepseekV4HCACache):
            continue
        rec = dict(kind=type(layer).__name__, sliding_keys=int(layer.keys.shape[-2]),
                   cumulative_length=int(layer.cumulative_length))
        for name in layer.entry_count:
            buf = layer.buffer_kv[name]
            rec[name] = dict(
                entries=int(layer.entry_count[name]),
                buffered_tokens=0 if buf is None else int(buf.shape[1]),
                overlap_saved=bool(getattr(layer, "overlap_kv", {}).get(name) is not None),
            )
        out[f"layer{li}"] = rec
    return out


def greedy_run(model, prompt: torch.Tensor, feed: list[int] | None = None, capture: bool = False) -> dict:
    """Prefill `prompt` in one call, then N_DECODE single-token calls through
    the reference's own DynamicCache. Greedy unless `feed` is given."""
    cap: dict = {}
    handles = []
    if capture:
        layers = layers_of(model)
        cap = {"embed": [], "streams": [[] for _ in layers], "attn": [[] for _ in layers],
               "mlp": [[] for _ in layers], "topk": {}}
        handles.append(model.model.embed_tokens.register_forward_hook(
            lambda m, i, o: cap["embed"].append(o.detach().float()[0])))
        for li, layer in enumerate(layers):
            handles.append(layer.register_forward_hook(
                lambda m, i, o, li=li: cap["streams"][li].append(o.detach().float()[0])))
            handles.append(layer.self_attn.register_forward_hook(
                lambda m, i, o, li=li: cap["attn"][li].append(o[0].detach().float()[0])))
            handles.append(layer.mlp.register_forward_hook(
                lambda m, i, o, li=li: cap["mlp"][li].append(o.detach().float()[0])))
            comp = layer.self_attn.compressor
            if isinstance(comp, ref.DeepseekV4CSACompressor):
                cap["topk"][li] = []
                handles.append(comp.indexer.register_forward_hook(
                    lambda m, i, o, li=li: cap["topk"][li].append(o.detach()[0])))
    try:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=prompt[None], past_key_values=cache, use_cache=True)
            prefill = out.logits[0].float()
            counts_prefill = state_counts(cache, model)
            nxt = int(prefill[-1].argmax())
            fed, dec = [], []
            for step in range(N_DECODE):
                tok = nxt if feed is None else int(feed[step])
                fed.append(tok)
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
                row = out.logits[0, -1].float()
                dec.append(row)
                nxt = int(row.argmax())
            counts_end = state_counts(cache, model)
    finally:
        for h in handles:
            h.remove()
    return dict(prefill=prefill, decode=torch.stack(dec), fed=fed, last=nxt, cap=cap,
                counts=dict(after_prefill=counts_prefill, after_decode=counts_end))


def rel_err(a: torch.Tensor, ref_logits: torch.Tensor) -> float:
    """max over rows of max|a - ref| / max(1, std(ref row))."""
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


def _attns(model):
    return [l.self_attn for l in layers_of(model)]


def _compressors(model, cls=None):
    out = [a.compressor for a in _attns(model) if a.compressor is not None]
    return [c for c in out if cls is None or isinstance(c, cls)]


def _indexers(model):
    return [c.indexer for c in _compressors(model, ref.DeepseekV4CSACompressor)]


def _hcs(model):
    return [hc for l in layers_of(model) for hc in (l.attn_hc, l.ffn_hc)]


def _moes(model, hashed=None):
    return [l.mlp for l in layers_of(model) if hashed is None or l.mlp.is_hash == hashed]


def _rotaries(model):
    return [m for m in model.modules() if isinstance(m, ref.DeepseekV4RotaryEmbedding)]


def _hook_output(modules, fn, stack):
    for m in modules:
        h = m.register_forward_hook(lambda mod, i, o: fn(mod, o))
        stack.callback(h.remove)


def _set_all(objs, name, value, stack):
    for o in objs:
        stack.enter_context(patched(o, name, value))


def _fill(tensors, value, sl=None):
    with torch.no_grad():
        for t in tensors:
            (t if sl is None else t[sl]).fill_(value)


def _rope_neox(x, cos, sin, unsqueeze_dim=1):
    """RoPE on the trailing slice with NeoX pairing (i, i + d/2) instead of interleaved pairs."""
    cos = torch.cat([cos, cos], dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([sin, sin], dim=-1).unsqueeze(unsqueeze_dim)
    rd = cos.shape[-1]
    nope, rope = x[..., :-rd], x[..., -rd:]
    r1, r2 = rope[..., : rd // 2], rope[..., rd // 2:]
    rot = torch.cat([-r2, r1], dim=-1)
    return torch.cat([nope, ((rope.float() * cos) + (rot.float() * sin)).to(x.dtype)], dim=-1)


def _rope_leading(x, cos, sin, unsqueeze_dim=1):
    """The reference's interleaved RoPE applied to the LEADING rope_dim channels."""
    rd = 2 * cos.shape[-1]
    head, tail = x[..., :rd], x[..., rd:]
    rolled = _ORIG_ROPE(torch.cat([tail, head], dim=-1), cos, sin, unsqueeze_dim)
    return torch.cat([rolled[..., -rd:], rolled[..., :-rd]], dim=-1)


_ORIG_ROPE = ref.apply_rotary_pos_emb


def perturbations(model) -> dict:
    """name -> (description, function(model_copy, ExitStack) applying the change)."""
    cfg = model.config
    P = {}

    def add(name, desc):
        def deco(fn):
            P[name] = (desc, fn)
            return fn

        return deco

    # --- mHC
    @add("hc_sinkhorn_1", f"Sinkhorn stopped after softmax + 1 column normalisation (iters=1 instead of {cfg.hc_sinkhorn_iters})")
    def _(m, st):
        _set_all(_hcs(m), "hc_sinkhorn_iters", 1, st)

    @add("hc_sinkhorn_minus_1", f"Sinkhorn with {cfg.hc_sinkhorn_iters - 1} iterations instead of {cfg.hc_sinkhorn_iters} (off by one)")
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
        for hc in _hcs(m):
            st.callback(hc.register_forward_pre_hook(lambda mod, args: setattr(mod, "_x", args[0])).remove)
        _hook_output(_hcs(m), lambda mod, o: (o[0], o[1], mod._x.mean(dim=2)), st)

    @add("hc_input_norm_off", "no RMS normalisation of the flattened streams before the hc projections (layers and head)")
    def _(m, st):
        _set_all(_hcs(m) + [m.model.hc_head], "input_norm", torch.nn.Identity(), st)

    @add("hc_eps_0", "hc_eps = 0 (pre, comb, Sinkhorn denominators, head pre)")
    def _(m, st):
        _set_all(_hcs(m), "hc_eps", 0.0, st)
        st.enter_context(patched(m.model.hc_head, "eps", 0.0))

    @add("hc_head_mean", "final hc collapse = plain mean of the streams instead of the hc_head weights")
    def _(m, st):
        st.enter_context(patched(m.model.hc_head, "forward", lambda x: x.mean(dim=2)))

    # --- attention
    @add("sinks_off", "attention sinks removed (sink logit -inf)")
    def _(m, st):
        _fill([a.sinks for a in _attns(m)], float("-inf"))

    @add("sinks_zero", "attention sink logits 0 (the reference's init value) instead of the trained ones")
    def _(m, st):
        _fill([a.sinks for a in _attns(m)], 0.0)

    @add("q_b_norm_off", "no unweighted RMS norm of the per-head queries")
    def _(m, st):
        _set_all(_attns(m), "q_b_norm", torch.nn.Identity(), st)

    @add("kv_norm_off", "no kv_norm on the shared key/value")
    def _(m, st):
        _set_all(_attns(m), "kv_norm", torch.nn.Identity(), st)

    @add("no_inverse_rope_on_output", "attention output's rope slice not rotated back by -position")
    def _(m, st):
        cur = {}
        orig = ref.apply_rotary_pos_emb

        def rope(x, cos, sin, unsqueeze_dim=1):
            pe = cur.get("pe")
            if pe is not None and cos is pe[0] and sin is not pe[1]:
                return x  # the output de-rotation: apply_rotary_pos_emb(out, cos, -sin)
            return orig(x, cos, sin, unsqueeze_dim)

        for a in _attns(m):
            def pre(mod, args, kwargs):
                cur["pe"] = kwargs["position_embeddings"][mod.rope_layer_type]

            st.callback(a.register_forward_pre_hook(pre, with_kwargs=True).remove)
        st.enter_context(patched(ref, "apply_rotary_pos_emb", rope))

    @add("rope_neox_pairs", "RoPE pairs (i, i+d/2) (NeoX) instead of interleaved (2i, 2i+1), everywhere")
    def _(m, st):
        st.enter_context(patched(ref, "apply_rotary_pos_emb", _rope_neox))

    @add("rope_leading_dims", "RoPE on the leading rope_dim channels instead of the trailing ones, everywhere")
    def _(m, st):
        st.enter_context(patched(ref, "apply_rotary_pos_emb", _rope_leading))

    @add("compress_rope_main_theta", "compressed layers (attention, compressor, indexer) use the main rope (theta 10000, no YaRN)")
    def _(m, st):
        with torch.no_grad():
            for r in _rotaries(m):
                r.compress_inv_freq.copy_(r.main_inv_freq)

    @add("compress_rope_no_yarn", "compress rope without YaRN (theta 160000 unscaled)")
    def _(m, st):
        plain, _ = ref.DeepseekV4RotaryEmbedding.compute_default_rope_parameters(m.config, layer_type="compress")
        with torch.no_grad():
            for r in _rotaries(m):
                r.compress_inv_freq.copy_(plain)

    @add("main_rope_compress_theta", "sliding layers use the compress rope instead of the main rope")
    def _(m, st):
        with torch.no_grad():
            r = m.model.rotary_emb
            r.main_inv_freq.copy_(r.compress_inv_freq)

    @add("sliding_window_minus_1", f"sliding window {cfg.sliding_window - 1} instead of {cfg.sliding_window} (off by one)")
    def _(m, st):
        st.enter_context(patched(m.config, "sliding_window", cfg.sliding_window - 1))
        _set_all(_attns(m), "sliding_window", cfg.sliding_window - 1, st)

    @add("wo_a_groups_swapped", "grouped output projection applied with the head groups in reverse order")
    def _(m, st):
        for a in _attns(m):
            st.callback(a.o_a_proj.register_forward_pre_hook(lambda mod, args: (args[0].flip(-2),)).remove)

    # --- compressors
    @add("compression_off", "no compressed entries (CSA/HCA layers attend to the sliding window only)")
    def _(m, st):
        _set_all(_attns(m), "compressor", None, st)

    @add("compressor_ape_off", "compressor position biases (ape) zero, in the CSA/HCA compressors and the indexer's")
    def _(m, st):
        _fill([c.position_bias for c in _compressors(m)] + [i.position_bias for i in _indexers(m)], 0.0)

    @add("compressor_norm_off", "no kv_norm on the compressed entries (CSA/HCA compressors)")
    def _(m, st):
        _set_all(_compressors(m), "kv_norm", torch.nn.Identity(), st)

    @add("compressed_rope_at_window_end", "compressed entries rotated at the window's last position instead of its first")
    def _(m, st):
        for c in _compressors(m):
            def pre(mod, args, kwargs, rate=c.compress_rate):
                kwargs = dict(kwargs)
                kwargs["position_ids"] = kwargs["position_ids"] + rate - 1
                return args, kwargs

            st.callback(c.rotary_emb.register_forward_pre_hook(pre, with_kwargs=True).remove)

    @add("compressed_entry_one_token_late", "a compressed entry becomes visible one token after its window closes "
                                            "(the closing token does not see it), CSA and HCA")
    def _(m, st):
        def hide_mask(pos, rate, n_entries):
            closing = (pos + 1) % rate == 0
            last = (pos + 1) // rate - 1
            return closing[..., None] & (torch.arange(n_entries)[None, None, :] == last[..., None])  # [B, S, T]

        def hca_hook(mod, args, out):
            kv, bias = out
            hide = hide_mask(args[2], mod.compress_rate, kv.shape[2])
            if bias is None:
                bias = kv.new_zeros((kv.shape[0], 1, args[2].shape[1], kv.shape[2]))
            return kv, bias.masked_fill(hide[:, None], float("-inf"))

        def idx_hook(mod, args, out):
            hide = (args[2] + 1) % mod.compress_rate == 0
            last = (args[2] + 1) // mod.compress_rate - 1
            return torch.where(hide[..., None] & (out == last[..., None]), torch.full_like(out, -1), out)

        for c in _compressors(m, ref.DeepseekV4HCACompressor):
            st.callback(c.register_forward_hook(hca_hook).remove)
        for i in _indexers(m):
            st.callback(i.register_forward_hook(idx_hook).remove)

    if _indexers(model):
        hd, ihd = cfg.head_dim, cfg.index_head_dim

        @add("csa_overlap_off", "CSA entries pool their own window only (no Ca slice of the previous window)")
        def _(m, st):
            _fill([c.position_bias for c in _compressors(m, ref.DeepseekV4CSACompressor)], float("-inf"), (slice(None), slice(0, hd)))

        @add("csa_overlap_not_carried", "previous call's last Ca slice not carried into the next call (CSA and indexer; decode rows only)")
        def _(m, st):
            st.enter_context(patched(ref.DeepseekV4CSACache, "update_overlap_state",
                                     (lambda orig: (lambda self, *a, **k: (orig(self, *a, **k), (None, None))[1]))(
                                         ref.DeepseekV4CSACache.update_overlap_state)))

        @add("indexer_select_all", "indexer selects every visible compressed entry (index_topk = infinity)")
        def _(m, st):
            _set_all(_indexers(m), "index_topk", 10**9, st)

        @add("indexer_relu_off", "indexer head scores not ReLU'd")
        def _(m, st):
            st.enter_context(patched(ref, "F", _NoRelu()))

        @add("indexer_head_weights_ones", "indexer weights_proj output replaced by 1 (unweighted head sum)")
        def _(m, st):
            _hook_output([i.scorer.weights_proj for i in _indexers(m)], lambda mod, o: torch.ones_like(o), st)

        @add("indexer_no_rope", "indexer queries and compressed keys not rotated")
        def _(m, st):
            _hook_output([i.rotary_emb for i in _indexers(m)], lambda mod, o: (torch.ones_like(o[0]), torch.zeros_like(o[1])), st)

        @add("indexer_overlap_off", "indexer compressor pools its own window only (no Ca slice)")
        def _(m, st):
            _fill([i.position_bias for i in _indexers(m)], float("-inf"), (slice(None), slice(0, ihd)))

        @add("indexer_norm_off", "no kv_norm on the indexer's compressed keys")
        def _(m, st):
            _set_all(_indexers(m), "kv_norm", torch.nn.Identity(), st)

    # --- MoE
    if _moes(model, hashed=True):
        @add("hash_routing_as_score", "hash layers route by top-k of their scores (no tid2eid)")
        def _(m, st):
            for moe in _moes(m, hashed=True):
                def fwd(hidden_states, input_ids=None, _g=moe.gate):
                    flat = hidden_states.reshape(-1, _g.hidden_dim)
                    logits = F_linear(flat, _g.weight)
                    scores = _g.score_fn(logits)
                    idx = scores.topk(_g.top_k, dim=-1).indices
                    w = scores.gather(1, idx)
                    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
                    return logits, w * _g.routed_scaling_factor, idx

                st.enter_context(patched(moe.gate, "forward", fwd))

    if _moes(model, hashed=False):
        @add("moe_bias_off", "router correction bias ignored")
        def _(m, st):
            _fill([moe.gate.e_score_correction_bias for moe in _moes(m, hashed=False)], 0.0)

        @add("moe_weights_with_bias", "routing weights taken from biased scores")
        def _(m, st):
            for moe in _moes(m, hashed=False):
                orig = moe.gate.forward

                def fwd(hidden_states, _orig=orig, _g=moe.gate):
                    logits, w, idx = _orig(hidden_states)
                    w = (_g.score_fn(logits) + _g.e_score_correction_bias).gather(1, idx)
                    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
                    return logits, w * _g.routed_scaling_factor, idx

                st.enter_context(patched(moe.gate, "forward", fwd))

    @add("moe_score_sigmoid", "router scores sigmoid instead of sqrt(softplus)")
    def _(m, st):
        _set_all([moe.gate for moe in _moes(m)], "score_fn", torch.nn.Sigmoid(), st)

    @add("moe_no_renorm", "selected routing weights not renormalised to sum 1")
    def _(m, st):
        for moe in _moes(m):
            orig = moe.gate.forward

            def fwd(*a, _orig=orig, _g=moe.gate):
                logits, w, idx = _orig(*a)
                return logits, _g.score_fn(logits).gather(1, idx) * _g.routed_scaling_factor, idx

            st.enter_context(patched(moe.gate, "forward", fwd))

    @add("moe_routed_scaling_1", "routed_scaling_factor = 1")
    def _(m, st):
        _set_all([moe.gate for moe in _moes(m)], "routed_scaling_factor", 1.0, st)

    @add("moe_shared_expert_off", "shared expert dropped")
    def _(m, st):
        _hook_output([moe.shared_experts for moe in _moes(m)], lambda mod, o: torch.zeros_like(o), st)

    @add("swiglu_clamp_off", "swiglu_limit = inf (no clamp)")
    def _(m, st):
        _set_all([moe.experts for moe in _moes(m)], "limit", float("inf"), st)
        _set_all([moe.shared_experts for moe in _moes(m)], "limit", float("inf"), st)

    @add("swiglu_gate_clamped_below", "gate also clamped below at -swiglu_limit")
    def _(m, st):
        lim = cfg.swiglu_limit
        for moe in _moes(m):
            orig = moe.experts._apply_gate

            def ag(gate_up, _orig=orig):
                gate, up = gate_up.chunk(2, dim=-1)
                return _orig(torch.cat([gate.clamp(min=-lim), up], dim=-1))

            st.enter_context(patched(moe.experts, "_apply_gate", ag))
            _hook_output([moe.shared_experts.gate_proj], lambda _m, o: o.clamp(min=-lim), st)

    @add("final_norm_off", "final RMSNorm removed")
    def _(m, st):
        st.enter_context(patched(m.model, "norm", torch.nn.Identity()))

    return P


def F_linear(x, w):
    return torch.nn.functional.linear(x, w)


def implementation_variants() -> dict:
    """Changes that must NOT matter beyond float rounding (informational)."""

    def experts_eager(m, st):
        st.enter_context(patched(m.config, "_experts_implementation_internal", "eager"))

    return {"experts_eager": ("eager expert loop (index_add_) instead of grouped_mm", experts_eager)}


def run_variant(model, fn, prompt, feed) -> dict:
    m = copy.deepcopy(model)
    with contextlib.ExitStack() as st:
        fn(m, st)
        return greedy_run(m, prompt, feed=feed)


def split_invariance(model, prompt, base) -> dict:
    """The same prompt prefilled in pieces (reference cache), against the one-call prefill."""
    res = {}
    for label, piece in (("pieces_64", 64), ("pieces_5", 5), ("token_by_token", 1)):
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            rows = []
            for s in range(0, len(prompt), piece):
                out = model(input_ids=prompt[None, s: s + piece], past_key_values=cache, use_cache=True)
                rows.append(out.logits[0].float())
        res[label] = rel_err(torch.cat(rows), base["prefill"])
    return res


# --------------------------------------------------------------------------
# instrumentation


def clamp_stats(model, prompt) -> dict:
    """How many gate / up values the swiglu clamp changed in the prefill, per layer."""
    lim = model.config.swiglu_limit
    stats: dict = {}

    def count(key, gate, up):
        s = stats.setdefault(key, dict(gate_clamped=0, up_clamped=0, elements=0))
        s["gate_clamped"] += int((gate > lim).sum())
        s["up_clamped"] += int((up.abs() > lim).sum())
        s["elements"] += int(gate.numel())

    with contextlib.ExitStack() as st:
        for li, layer in enumerate(layers_of(model)):
            sh = layer.mlp.shared_experts
            box: dict = {}
            st.callback(sh.gate_proj.register_forward_hook(lambda m, i, o, box=box: box.__setitem__("g", o)).remove)
            st.callback(sh.up_proj.register_forward_hook(
                lambda m, i, o, box=box, key=f"layer{li}.shared_expert": count(key, box["g"], o)).remove)
            ex = layer.mlp.experts
            orig = ex._apply_gate

            def ag(gate_up, _orig=orig, key=f"layer{li}.routed_experts"):
                gate, up = gate_up.chunk(2, dim=-1)
                count(key, gate, up)
                return _orig(gate_up)

            st.enter_context(patched(ex, "_apply_gate", ag))
        with torch.no_grad():
            model(input_ids=prompt[None], use_cache=False)
    return stats


def indexer_gaps(model, prompt) -> dict:
    """Smallest relative gap between the k-th and (k+1)-th visible indexer score
    over the prefill, per CSA layer (ties would make the selection
    implementation-dependent)."""
    rep = {}
    with contextlib.ExitStack() as st:
        scores: dict = {}
        for li, layer in enumerate(layers_of(model)):
            comp = layer.self_attn.compressor
            if isinstance(comp, ref.DeepseekV4CSACompressor):
                st.callback(comp.indexer.scorer.register_forward_hook(
                    lambda m, i, o, li=li: scores.__setitem__(li, o.detach().double()[0])).remove)
        with torch.no_grad():
            model(input_ids=prompt[None], use_cache=False)
    for li, sc in scores.items():
        ix = layers_of(model)[li].self_attn.compressor.indexer
        k, rate = ix.index_topk, ix.compress_rate
        gap, ties = math.inf, 0
        for t in range(sc.shape[0]):
            vis = (t + 1) // rate
            if vis <= k:
                continue
            v = sc[t, :vis].sort(descending=True).values
            g = float(v[k - 1] - v[k]) / max(1e-30, float(v.abs().max()))
            ties += g == 0.0
            gap = min(gap, g)
        rep[f"layer{li}"] = dict(min_relative_gap_kth_vs_next=None if gap == math.inf else gap, exact_ties=ties,
                                 queries_with_real_selection=int(sum((t + 1) // rate > k for t in range(sc.shape[0]))))
    return rep


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
        self.arrays[name] = dict(file=path.name, dtype=str(arr.dtype), shape=list(arr.shape), sha256=sha256(path),
                                 description=description)


def hidden_positions(prompt_len: int) -> list[int]:
    return list(range(8)) + [prompt_len // 2, prompt_len - 2, prompt_len - 1]


def write_outputs(w: Writer, res: dict, prompt: torch.Tensor, model) -> dict:
    cap = res["cap"]
    S = len(prompt)
    pos = hidden_positions(S)
    L = len(layers_of(model))
    topk = model.config.index_topk
    w.save("prompt", prompt.numpy(), "prompt token ids [S]")
    w.save("prefill_logits", res["prefill"].numpy(), "logits of the one-call prefill at every prompt position [S, V]")
    w.save("decode_tokens", np.array(res["fed"] + [res["last"]]),
           f"greedy tokens [{N_DECODE}+1]: entry i is fed at decode step i; the last one is the argmax of the last step")
    w.save("decode_logits", res["decode"].numpy(),
           f"logits of decode step i (one token, reference cache) after feeding decode_tokens[i] [{N_DECODE}, V]")
    w.save("hidden_positions", np.array(pos), "prompt positions of the hidden_* arrays [P]")
    w.save("hidden_embed", cap["embed"][0][pos].numpy(), "token embeddings (copied into every hc stream) [P, D]")
    w.save("hidden_streams", torch.stack([cap["streams"][li][0][pos] for li in range(L)]).numpy(),
           "hc streams after each decoder layer [L, P, hc_mult, D]")
    w.save("hidden_attn_out", torch.stack([cap["attn"][li][0][pos] for li in range(L)]).numpy(),
           "output of each layer's attention block (after o_b_proj) [L, P, D]")
    w.save("hidden_mlp_out", torch.stack([cap["mlp"][li][0][pos] for li in range(L)]).numpy(),
           "output of each layer's MoE block (routed + shared) [L, P, D]")
    w.save("hidden_decode_streams",
           torch.stack([torch.stack([cap["streams"][li][1 + i][0] for li in range(L)]) for i in range(HIDDEN_DECODE)],
                       dim=1).numpy(),
           f"hc streams after each layer for decode steps 0..{HIDDEN_DECODE - 1} [L, {HIDDEN_DECODE}, hc_mult, D]")
    w.save("hidden_decode_attn_out",
           torch.stack([torch.stack([cap["attn"][li][1 + i][0] for li in range(L)]) for i in range(HIDDEN_DECODE)],
                       dim=1).numpy(),
           f"attention block output for decode steps 0..{HIDDEN_DECODE - 1} [L, {HIDDEN_DECODE}, D]")

    def pad(t):
        t = t.to(torch.int64)
        if t.shape[-1] < topk:
            t = torch.cat([t, torch.full((*t.shape[:-1], topk - t.shape[-1]), -1, dtype=t.dtype)], dim=-1)
        return t

    for li, calls in cap["topk"].items():
        w.save(f"indexer_topk_layer{li}", pad(calls[0]).numpy(),
               "raw lightning-indexer output of this CSA layer for the prefill: compressed-entry indices, -1 = none "
               "(future or padding); compare per row as sets [S, index_topk]")
        w.save(f"indexer_topk_layer{li}_decode", torch.stack([pad(c[0]) for c in calls[1:]]).numpy(),
               f"indexer output for each decode step [{N_DECODE}, index_topk]")
    return dict(prompt_len=S, decode_steps=N_DECODE, hidden_positions=pos)


def fp32_kept(model) -> list[str]:
    names = [n for n, p in list(model.named_parameters()) + list(model.named_buffers())
             if p.dtype == torch.float32 and "rotary_emb" not in n]
    return sorted({".".join("*" if part.isdigit() else part for part in n.split(".")) for n in names})


def make_fixture(spec: dict, out_root: Path, with_sensitivity: bool) -> list[dict]:
    name = spec["name"]
    torch.manual_seed(spec["seed"])
    cfg = build_config(spec)
    model = DeepseekV4ForCausalLM(cfg).eval()
    randomise(model, spec["seed"])
    gen = torch.Generator().manual_seed(spec["seed"] + 7)
    prompt = torch.randint(0, cfg.vocab_size, (spec["prompt_len"],), generator=gen)

    summaries = []
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)  # for config.json (transformers' own serialisation)
        (Path(tmp) / "model.safetensors").unlink()
        save_file(original_state_dict(model), str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        for suffix in ("f32", "bf16"):
            stale = out_root / f"{name}_{suffix}"
            if stale.exists():  # (llamacpp.gguf too: make-fixtures.sh remakes it from the new checkpoint)
                shutil.rmtree(stale)
        f32_dir = out_root / f"{name}_f32"
        f32_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(tmp) / "config.json", f32_dir / "config.json")
        shutil.copy(Path(tmp) / "model.safetensors", f32_dir / "model.safetensors")

        for dtype_name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            loaded = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=dtype).eval()
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
    cfg = model.config
    res = greedy_run(model, prompt, capture=True)
    w = Writer(out_dir)
    meta = write_outputs(w, res, prompt, model)

    with torch.no_grad():
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
        compressor_state=res["counts"],
        indexer_score_gaps_prefill=indexer_gaps(model, prompt),
    )
    print(f"  split invariance {checks['prefill_split_invariance_rel_err']}, "
          f"top2 gap decode {checks['min_top2_gap_decode']:.3g}", flush=True)

    sensitivity, variants = {}, {}
    feed = res["fed"]
    if with_sensitivity:
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

    manifest = dict(
        fixture=out_dir.name,
        family="deepseek_v4",
        reference=dict(
            transformers=transformers.__version__, torch=torch.__version__,
            model_class="DeepseekV4ForCausalLM",
            attn_implementation=cfg._attn_implementation,
            experts_implementation=cfg._experts_implementation,
            mtp="not computed: the reference ignores mtp.* weights (_keys_to_ignore_on_load_unexpected); "
                "the fixture checkpoints have none",
        ),
        dtype=dtype_name,
        checkpoint=dict(
            config="config.json",
            safetensors="model.safetensors" if dtype_name == "f32" else f"../{spec['name']}_f32/model.safetensors",
            naming="DeepSeek original names (embed.weight, layers.{i}.attn.wq_a.weight, "
                   "layers.{i}.ffn.experts.{e}.w1.weight, hc_head_fn, head.weight, ...), read through "
                   "transformers' conversion_mapping 'deepseek_v4'; see docs/deepseek4.md",
            stored_dtype="float32 (tid2eid int64); routed experts exactly MXFP4-representable",
            load=f"DeepseekV4ForCausalLM.from_pretrained(dir, dtype=torch.{'float32' if dtype_name == 'f32' else 'bfloat16'})",
            tensors_kept_in_float32=fp32_kept(model) if dtype_name == "bf16" else "all (f32 model)",
        ),
        seed=spec["seed"],
        covers=spec["covers"],
        config_summary=dict(
            layer_types=cfg.layer_types, mlp_layer_types=cfg.mlp_layer_types, compress_rates=cfg.compress_rates,
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
            head_dim=cfg.head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim, sliding_window=cfg.sliding_window,
            index_topk=cfg.index_topk, index_n_heads=cfg.index_n_heads, index_head_dim=cfg.index_head_dim,
            o_groups=cfg.o_groups, o_lora_rank=cfg.o_lora_rank, hc_sinkhorn_iters=cfg.hc_sinkhorn_iters,
            swiglu_limit=cfg.swiglu_limit, rope_parameters=cfg.rope_parameters,
        ),
        **meta,
        arrays=w.arrays,
        checks=checks,
        tolerance_note="f32: max|ours-ref| <= 1e-4 * max(1, std(ref row)) per row; bf16: see docs/parity.md",
        sensitivity=sensitivity,
        implementation_variants=variants,
    )
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="fixture folder (crates/engine/tests/fixtures/deepseek4)")
    ap.add_argument("--only", help="build only the fixture with this name")
    ap.add_argument("--no-sensitivity", action="store_true", help="skip the perturbation runs (faster)")
    args = ap.parse_args()
    if transformers.__version__ != REQUIRED_TRANSFORMERS:
        sys.exit(f"error: transformers {transformers.__version__} found, {REQUIRED_TRANSFORMERS} required")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in FIXTURES:
        if args.only and spec["name"] != args.only:
            continue
        make_fixture(spec, args.out, with_sensitivity=not args.no_sensitivity)
    print("done", flush=True)


if __name__ == "__main__":
    main()
