#!/usr/bin/env python3
"""Convert a committed f32 fixture checkpoint to GGUF with llama.cpp's own
converter (`convert_hf_to_gguf.py --outtype f32`), and write it next to the
checkpoint as `llamacpp.gguf`.

llama.cpp is taken from the llama-cpp-python sdist (`llama_cpp_python-0.3.36`,
vendored llama.cpp at commit 0c1e5709): pass its unpacked `vendor/llama.cpp`
folder with --llama-cpp (default: $LLAMA_CPP_DIR, else
/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp). Its `gguf-py` is put on
the path; the converter runs inside tools/reference/.venv (it needs torch,
numpy, transformers and tokenizers, all there; `requests` and `sentencepiece`
are not needed for these models).

What the converter is given (in a temporary folder named like the fixture, so
that `general.name` is the fixture's name):

deepseek_v4 (`DeepseekV4Model`, arch `deepseek4`)
  * `model.safetensors`: the fixture's tensors under the same (original
    DeepSeek) names, except the routed experts
    `layers.{i}.ffn.experts.{e}.w{1,2,3}.weight`, which the converter only
    accepts in DeepSeek's FP4 checkpoint format: packed e2m1 codes (uint8
    `[rows, cols/2]`, even element in the low nibble) plus an E8M0 scale
    (`.scale`, uint8 `[rows, cols/32]`). The fixture's experts are exactly
    representable, so the packing is lossless (checked here by unpacking).
    The converter repacks them to GGML MXFP4 bit for bit.
  * `config.json`: the fixture's (transformers) config plus the legacy keys the
    converter reads and the published checkpoint's config.json carries:
    `compress_ratios` (one per layer, from `layer_types` and `compress_rates`,
    plus a trailing 0 for the MTP layer as in the published config),
    `num_hash_layers` (the leading `hash_moe` layers; they must be leading) and
    `rope_scaling` (the YaRN parameters of the `compress` rope). Without
    `rope_scaling` the converter silently writes no YaRN keys.
  * a tiny byte-level BPE tokenizer (`tokenizer.json`, `tokenizer_config.json`)
    with exactly `vocab_size` entries: `<｜begin▁of▁sentence｜>` = 0 (bos),
    `<｜end▁of▁sentence｜>` = 1 (eos), the 256 byte symbols, then merges of
    frequent letter pairs. Its pre-tokenizer hash is unknown to llama.cpp, so
    `get_vocab_base_pre` is patched to answer `deepseek-v3` (the DeepSeek-V3/V4
    pre-tokenizer) for it; nothing else in the converter is changed.

glm5_next (`Glm5NextModel`, arch `glm5-next`)
  * `model.safetensors`: the fixture's checkpoint as `save_pretrained` wrote it
    (hub names `model.language_model.layers.{i}.…`, per-expert matrices).
  * `config.json`: the fixture's (transformers) config plus, in `text_config`,
    the keys the converter reads that transformers' `Glm5NextTextConfig` does not
    serialise: `linear_attn_config` (`head_dim`, `num_heads`,
    `short_conv_kernel_size`, `gate_lower_bound` from the `linear_*` keys),
    `mla_use_nope: true`, `first_k_dense_replace` (the number of leading dense
    layers; the MLP schedule must be a leading dense block).
  * a tiny byte-level BPE tokenizer with exactly `vocab_size` entries: the 256
    byte symbols, merges of frequent letter pairs, then GLM's four special tokens
    the converter looks up (`<|endoftext|>`, `[gMASK]`, `<|user|>`,
    `<|observation|>`) as the last ids. It is also written into the fixture
    folder (`tokenizer.json`, `tokenizer_config.json`), so that our converter
    (`ds4-server convert`) reads the same tokenizer and the two files can be
    compared key by key. Its pre-tokenizer hash is unknown to llama.cpp, so
    `get_vocab_base_pre` answers `glm4` for it (as for the real GLM tokenizer).
  The committed lowerbound_sparse / softplus_dense fixtures cannot be converted
  (3 KDA heads vs 4 MLA heads; a non-leading dense MLP): the script reports the
  converter's own error. `real_layout` is made for it.

Usage:
    tools/reference/.venv/bin/python tools/reference/llamacpp_convert.py \\
        crates/engine/tests/fixtures/deepseek4/small_rates_f32 ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
RATIO_OF = {"sliding_attention": 0}
DEFAULT_LLAMA_CPP = "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp"
LLAMA_CPP_COMMIT = "0c1e5709 (llama-cpp-python 0.3.36 sdist)"
PRE_TOKENIZER = {"deepseek_v4": "deepseek-v3", "glm5_next": "glm4"}


# --------------------------------------------------------------------------
# DeepSeek FP4 (e2m1 + E8M0 per 32) packing of the routed experts


def pack_fp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, cols] float -> (codes uint8 [rows, cols/2], scale uint8 [rows, cols/32]); exact or raises."""
    rows, cols = w.shape
    assert cols % 32 == 0, f"FP4 needs cols % 32 == 0, got {cols}"
    b = w.double().reshape(rows, cols // 32, 32)
    amax = b.abs().amax(dim=-1)
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp_min(1e-30) / 6.0)), torch.zeros_like(amax))
    scale = torch.exp2(exp)[..., None]
    q = b / scale
    idx = (q.abs()[..., None] - E2M1).abs().argmin(dim=-1)
    code = idx + 8 * ((q < 0) & (idx > 0)).to(idx.dtype)
    back = E2M1[idx] * torch.where(q < 0, -1.0, 1.0) * scale
    if not torch.equal(back, b):
        bad = (back - b).abs().max().item()
        raise ValueError(f"expert weight is not exactly MXFP4-representable (max error {bad})")
    code = code.reshape(rows, cols).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    e8m0 = (exp + 127).to(torch.int64)
    assert int(e8m0.min()) >= 0 and int(e8m0.max()) <= 254
    return packed.contiguous(), e8m0.to(torch.uint8).contiguous()


def unpack_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows = packed.shape[0]
    lo, hi = packed & 0x0F, packed >> 4
    code = torch.stack([lo, hi], dim=-1).reshape(rows, -1).long()
    mag = E2M1[code & 7] * torch.where(code >= 8, -1.0, 1.0)
    s = torch.exp2(scale.double() - 127.0).repeat_interleave(32, dim=1)
    return mag * s


# --------------------------------------------------------------------------
# tiny tokenizer


GLM_SPECIALS = ["<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>"]


def write_tiny_glm_tokenizer(folder: Path, vocab_size: int) -> None:
    """Byte symbols 0..255, letter-pair merges, GLM's special tokens as the last ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    n_normal = vocab_size - len(GLM_SPECIALS)
    assert n_normal >= len(alphabet), f"glm5_next fixture vocab {vocab_size} is too small for a byte-level tokenizer"
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    letters = "etaoinshrdlucmfw"
    for a in letters:
        for b in letters:
            if len(vocab) >= n_normal:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    assert len(vocab) == n_normal
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GLM_SPECIALS])
    assert [tok.token_to_id(t) for t in GLM_SPECIALS] == list(range(n_normal, vocab_size))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="PreTrainedTokenizerFast", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        model_max_length=1048576), indent=1) + "\n")


def write_tiny_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {bos: 0, eos: 1}
    for ch in alphabet[: vocab_size - 2]:  # (a vocabulary under 258 entries loses its last byte symbols)
        vocab[ch] = len(vocab)
    merges = []
    letters = "etaoinshrdlucmfw"
    for a in letters:
        for b in letters:
            if len(vocab) >= vocab_size:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([bos, eos])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="PreTrainedTokenizerFast", bos_token=bos, eos_token=eos, add_bos_token=False,
        model_max_length=1048576), indent=1) + "\n")


# --------------------------------------------------------------------------
# per-family input preparation


def prepare_deepseek4(src: Path, dst: Path, cfg: dict) -> dict:
    rates = dict(cfg["compress_rates"])
    ratios = [0 if t == "sliding_attention" else rates[t] for t in cfg["layer_types"]]
    mlp = cfg["mlp_layer_types"]
    n_hash = sum(1 for t in mlp if t == "hash_moe")
    if mlp[:n_hash] != ["hash_moe"] * n_hash:
        raise ValueError("llama.cpp (converter and loader) needs the hash-routed layers to be the leading ones")
    comp = cfg["rope_parameters"]["compress"]
    rope_scaling = None
    if comp.get("rope_type", "default") != "default":
        rope_scaling = {k: v for k, v in comp.items() if k not in ("rope_theta", "partial_rotary_factor", "attention_factor", "rope_type")}
        rope_scaling["type"] = comp["rope_type"]
    out_cfg = dict(cfg)
    out_cfg.update(compress_ratios=ratios + [0], num_hash_layers=n_hash)
    if rope_scaling is not None:
        out_cfg["rope_scaling"] = rope_scaling
    (dst / "config.json").write_text(json.dumps(out_cfg, indent=1) + "\n")

    tensors, packed_n = {}, 0
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            if ".ffn.experts." in k and k.endswith(".weight"):
                packed, scale = pack_fp4(t)
                assert torch.equal(unpack_fp4(packed, scale), t.double()), k
                tensors[k] = packed
                tensors[k[: -len(".weight")] + ".scale"] = scale
                packed_n += 1
            else:
                tensors[k] = t
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    write_tiny_tokenizer(dst, cfg["vocab_size"])
    return dict(compress_ratios=ratios + [0], num_hash_layers=n_hash, rope_scaling=rope_scaling,
                fp4_packed_expert_matrices=packed_n)


def prepare_glm5_next(src: Path, dst: Path, cfg: dict) -> dict:
    text = cfg["text_config"]
    problems = []
    if text["linear_num_heads"] != text["num_attention_heads"]:
        problems.append(f"KDA heads {text['linear_num_heads']} != MLA heads {text['num_attention_heads']}: llama.cpp's "
                        "Glm5NextModel asserts they are equal (glm5-next has one head count for both)")
    mlp = text["mlp_layer_types"]
    lead = next((i for i, t in enumerate(mlp) if t != "dense"), len(mlp))
    if any(t == "dense" for t in mlp[lead:]):
        problems.append(f"mlp_layer_types {mlp} is not a leading dense block: llama.cpp decides dense/MoE by "
                        "leading_dense_block_count only")
    for p in problems:
        logging.getLogger("llamacpp_convert").error("glm5_next fixture not representable: %s", p)
    out_cfg = dict(cfg)
    t = dict(text)
    # keys the converter reads that transformers' Glm5NextTextConfig does not serialise
    t["linear_attn_config"] = dict(head_dim=text["linear_head_dim"], num_heads=text["linear_num_heads"],
                                   short_conv_kernel_size=text["linear_conv_kernel_dim"],
                                   gate_lower_bound=text.get("linear_lower_bound"))
    t["mla_use_nope"] = True
    t["first_k_dense_replace"] = lead
    out_cfg["text_config"] = t
    (dst / "config.json").write_text(json.dumps(out_cfg, indent=1) + "\n")
    shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    if not problems:
        # the same tokenizer beside the fixture's checkpoint, for our converter
        write_tiny_glm_tokenizer(src, text["vocab_size"])
    write_tiny_glm_tokenizer(dst, text["vocab_size"])
    added = {k: t[k] for k in ("linear_attn_config", "mla_use_nope", "first_k_dense_replace")}
    return dict(config_keys_added=added, tokenizer="tokenizer.json + tokenizer_config.json (also in the fixture folder)")


# --------------------------------------------------------------------------
# read-back check: every GGUF tensor equals the checkpoint tensor docs/deepseek4_gguf.md maps it to

DS4_ROOT = {"embed.weight": "token_embd.weight", "head.weight": "output.weight", "norm.weight": "output_norm.weight",
            "hc_head_fn": "output_hc_fn.weight", "hc_head_base": "output_hc_base.weight",
            "hc_head_scale": "output_hc_scale.weight"}
DS4_LAYER = {
    "attn.attn_sink": "attn_sinks.weight", "attn.wq_a.weight": "attn_q_a.weight",
    "attn.q_norm.weight": "attn_q_a_norm.weight", "attn.wq_b.weight": "attn_q_b.weight",
    "attn.wkv.weight": "attn_kv.weight", "attn.kv_norm.weight": "attn_kv_a_norm.weight",
    "attn.wo_a.weight": "attn_output_a.weight", "attn.wo_b.weight": "attn_output_b.weight",
    "attn.compressor.ape": "attn_compressor_ape.weight", "attn.compressor.wkv.weight": "attn_compressor_kv.weight",
    "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.norm.weight": "attn_compressor_norm.weight",
    "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight", "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "attn.indexer.compressor.ape": "indexer_compressor_ape.weight",
    "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv.weight",
    "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate.weight",
    "attn.indexer.compressor.norm.weight": "indexer_compressor_norm.weight",
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "ffn_norm.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight", "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight", "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
    "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
    "hc_attn_fn": "hc_attn_fn.weight", "hc_attn_base": "hc_attn_base.weight", "hc_attn_scale": "hc_attn_scale.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight", "hc_ffn_base": "hc_ffn_base.weight", "hc_ffn_scale": "hc_ffn_scale.weight",
}
DS4_EXPERTS = {"w1": "ffn_gate_exps.weight", "w2": "ffn_down_exps.weight", "w3": "ffn_up_exps.weight"}


def verify_deepseek4(fixture: Path, gguf_path: Path) -> dict:
    import re

    import gguf  # the llama.cpp tree's gguf-py (on sys.path after run_converter)
    import numpy as np

    reader = gguf.GGUFReader(str(gguf_path))
    got = {}
    types = {}
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type) if t.tensor_type.name == "MXFP4" else np.array(t.data)
        got[t.name] = data.reshape([int(d) for d in reversed(list(t.shape))])
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    want: dict = {}
    experts: dict = {}
    with safe_open(str(fixture / "model.safetensors"), "np") as f:
        for k in f.keys():
            v = f.get_tensor(k)
            if k in DS4_ROOT:
                want[DS4_ROOT[k]] = v
                continue
            m = re.match(r"layers\.(\d+)\.(.+)$", k)
            i, rest = m.group(1), m.group(2)
            if (e := re.match(r"ffn\.experts\.(\d+)\.(w[123])\.weight$", rest)) is not None:
                experts.setdefault((i, e.group(2)), {})[int(e.group(1))] = v
            else:
                want[f"blk.{i}.{DS4_LAYER[rest]}"] = v
    for (i, w), per in experts.items():
        want[f"blk.{i}.{DS4_EXPERTS[w]}"] = np.stack([per[e] for e in sorted(per)])
    missing = sorted(set(want) ^ set(got))
    if missing:
        raise ValueError(f"GGUF and checkpoint tensor sets differ: {missing}")
    worst = 0.0
    for name, v in want.items():
        g = got[name]
        if g.shape != v.shape:
            raise ValueError(f"{name}: GGUF shape {g.shape} (numpy order) != checkpoint {v.shape}")
        worst = max(worst, float(np.abs(g.astype(np.float64) - v.astype(np.float64)).max()))
    if worst != 0.0:
        raise ValueError(f"GGUF values differ from the checkpoint by up to {worst}")
    return dict(tensors=len(got), types=types, max_abs_diff_vs_checkpoint=worst)


# --------------------------------------------------------------------------
# tensor types of llama.cpp's other output types (glm5_next)

TYPE_OUTTYPES = ("bf16", "f16", "q8_0")


def tensor_types(path: Path) -> dict:
    """{"default": the most common type, "other": {tensor: type} for the rest} of a GGUF."""
    import gguf  # the llama.cpp tree's gguf-py (on sys.path after run_converter)

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    counts: dict = {}
    for ty in types.values():
        counts[ty] = counts.get(ty, 0) + 1
    default = max(counts, key=lambda ty: counts[ty])
    return dict(default=default, other={n: ty for n, ty in sorted(types.items()) if ty != default})


# --------------------------------------------------------------------------


def run_converter(llama_cpp: Path, model_dir: Path, out: Path, family: str, outtype: str = "f32") -> None:
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import conversion.base as base  # noqa: E402

    if not getattr(base.TextModel, "_ds4_patched", False):
        orig = base.TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):
            try:
                return orig(self, tokenizer)
            except NotImplementedError:
                name = PRE_TOKENIZER[self._ds4_family]
                logging.getLogger("llamacpp_convert").warning(
                    "tiny fixture tokenizer: pre-tokenizer hash unknown to llama.cpp, using %r", name)
                return name

        base.TextModel.get_vocab_base_pre = get_vocab_base_pre
        base.TextModel._ds4_patched = True
    base.TextModel._ds4_family = family
    import convert_hf_to_gguf  # noqa: E402

    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outfile", str(out), "--outtype", outtype]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def convert(fixture: Path, llama_cpp: Path) -> dict:
    cfg = json.loads((fixture / "config.json").read_text())
    family = cfg["model_type"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / fixture.name
        work.mkdir()
        if family == "deepseek_v4":
            info = prepare_deepseek4(fixture, work, cfg)
        elif family == "glm5_next":
            info = prepare_glm5_next(fixture, work, cfg)
        else:
            raise ValueError(f"unsupported model_type {family}")
        out = fixture / "llamacpp.gguf"
        tmp_out = Path(tmp) / "out.gguf"
        run_converter(llama_cpp, work, tmp_out, family)
        shutil.move(str(tmp_out), out)
        if family == "glm5_next":
            # which tensors llama.cpp writes in which type for the other output types
            # (crates/convert/tests/glm5_next_llamacpp.rs holds our converter to it)
            info["tensor_types"] = {}
            for outtype in TYPE_OUTTYPES:
                other = Path(tmp) / f"out-{outtype}.gguf"
                run_converter(llama_cpp, work, other, family, outtype)
                info["tensor_types"][outtype] = tensor_types(other)
    if family == "deepseek_v4":
        info["read_back"] = verify_deepseek4(fixture, out)
    info.update(file=out.name, bytes=out.stat().st_size, sha256=hashlib.sha256(out.read_bytes()).hexdigest(),
                converter=f"{llama_cpp}/convert_hf_to_gguf.py --outtype f32 (llama.cpp {LLAMA_CPP_COMMIT})",
                patched="conversion.base.TextModel.get_vocab_base_pre: unknown pre-tokenizer hash -> "
                        f"{PRE_TOKENIZER[family]!r} (tiny generated tokenizer)")
    manifest = fixture / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        m["llamacpp_gguf"] = info
        manifest.write_text(json.dumps(m, indent=1) + "\n")
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fixtures", nargs="+", type=Path, help="fixture folders holding config.json + model.safetensors")
    ap.add_argument("--llama-cpp", type=Path, default=Path(os.environ.get("LLAMA_CPP_DIR", DEFAULT_LLAMA_CPP)),
                    help="llama.cpp source tree (the sdist's vendor/llama.cpp)")
    args = ap.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"error: {args.llama_cpp} has no convert_hf_to_gguf.py")
    failed = 0
    for fx in args.fixtures:
        try:
            info = convert(fx.resolve(), args.llama_cpp.resolve())
            print(f"{fx}: {json.dumps(info)}", flush=True)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - report and continue with the next fixture
            failed += 1
            print(f"{fx}: conversion FAILED: {type(e).__name__}: {e}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
