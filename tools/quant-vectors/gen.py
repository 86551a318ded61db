#!/usr/bin/env python3
"""Generate the reference test vectors of crates/quant (tests/vectors/).

Two independent references:

* the `gguf` Python package (pinned in requirements.txt): `gguf.quants.dequantize` for
  every type it knows, and `gguf.quants.quantize` where it implements a quantizer
  (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16, F16);
* optionally ggml itself, through the `ggml_ref` harness (ggml_ref.c, see README.md):
  the K-quant reference quantizers, the CPU backend's activation quantizers
  (Q8_0/Q8_1/Q8_K) and its dot products.

Every file is raw little-endian data; MANIFEST.txt lists them. Usage:

    python gen.py --out ../../crates/quant/tests/vectors [--ggml-ref /path/to/ggml_ref]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

SEED = 20260529

# (name, type, [f16 scale offsets that may be negative], [f16 offsets that are >= 0])
BLOCK_TYPES = [
    ("q4_0", T.Q4_0, [0], []),
    ("q4_1", T.Q4_1, [0, 2], []),
    ("q5_0", T.Q5_0, [0], []),
    ("q5_1", T.Q5_1, [0, 2], []),
    ("q8_0", T.Q8_0, [0], []),
    ("q2_k", T.Q2_K, [], [80, 82]),
    ("q3_k", T.Q3_K, [108], []),
    ("q4_k", T.Q4_K, [], [0, 2]),
    ("q5_k", T.Q5_K, [], [0, 2]),
    ("q6_k", T.Q6_K, [208], []),
    ("iq2_xxs", T.IQ2_XXS, [0], []),
]

GGUF_QUANTIZERS = [("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q5_0", T.Q5_0), ("q5_1", T.Q5_1),
                   ("q8_0", T.Q8_0), ("bf16", T.BF16), ("f16", T.F16)]

GGML_QUANTIZERS = [("q2_k", T.Q2_K), ("q3_k", T.Q3_K), ("q4_k", T.Q4_K), ("q5_k", T.Q5_K),
                   ("q6_k", T.Q6_K), ("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q5_0", T.Q5_0),
                   ("q5_1", T.Q5_1), ("q8_0", T.Q8_0)]

# weight type -> activation type (ggml's vec_dot_type)
DOT_TYPES = [("q4_0", T.Q4_0, T.Q8_0), ("q4_1", T.Q4_1, T.Q8_1), ("q5_0", T.Q5_0, T.Q8_0),
             ("q5_1", T.Q5_1, T.Q8_1), ("q8_0", T.Q8_0, T.Q8_0), ("q2_k", T.Q2_K, T.Q8_K),
             ("q3_k", T.Q3_K, T.Q8_K), ("q4_k", T.Q4_K, T.Q8_K), ("q5_k", T.Q5_K, T.Q8_K),
             ("q6_k", T.Q6_K, T.Q8_K)]

BLOCK_BYTES = {T.Q8_1: 36}  # gguf's table lists a stale Q8_1 size


def scale_values(rng: np.random.Generator, n: int, signed: bool) -> np.ndarray:
    """Realistic finite f16 scales, with a few special values mixed in."""
    mag = np.exp(rng.uniform(np.log(1e-5), np.log(2.0), n)).astype(np.float16)
    specials = np.array([0.0, 6e-8, 3e-5, 1000.0], dtype=np.float16)  # 0, subnormals, large
    pick = rng.random(n) < 0.15
    mag[pick] = rng.choice(specials, pick.sum())
    if signed:
        mag = np.where(rng.random(n) < 0.5, -mag, mag).astype(np.float16)
    return mag


def random_blocks(rng: np.random.Generator, qtype: T, signed_off: list[int], pos_off: list[int], n: int) -> bytes:
    _, size = quants.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for off, signed in [(o, True) for o in signed_off] + [(o, False) for o in pos_off]:
        blocks[:, off:off + 2] = scale_values(rng, n, signed).view(np.uint8).reshape(n, 2)
    return blocks.tobytes()


def random_halves(rng: np.random.Generator, n: int, kind: str) -> bytes:
    """Random F16/BF16 bit patterns: all finite values and infinities, no NaN."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    if kind == "f16":
        nan = (bits & 0x7C00) == 0x7C00
        bits[nan & ((bits & 0x03FF) != 0)] &= 0xFC00  # NaN -> inf
    else:
        nan = (bits & 0x7F80) == 0x7F80
        bits[nan & ((bits & 0x007F) != 0)] &= 0xFF80
    return bits.tobytes()


def quant_inputs(rng: np.random.Generator, block: int, nblocks: int) -> np.ndarray:
    """Blocks of varied distributions: normal at several scales, uniform, heavy tails,
    sparse, all-zero, constant, and one with a single outlier."""
    x = np.empty((nblocks, block), dtype=np.float32)
    for i in range(nblocks):
        kind = i % 8
        if kind == 0:
            x[i] = rng.normal(0, 1, block)
        elif kind == 1:
            x[i] = rng.normal(0, 0.02, block)
        elif kind == 2:
            x[i] = rng.uniform(-3, 5, block)
        elif kind == 3:
            x[i] = rng.standard_t(2, block) * 0.1
        elif kind == 4:
            x[i] = np.where(rng.random(block) < 0.8, 0, rng.normal(0, 1, block))
        elif kind == 5:
            x[i] = 0
        elif kind == 6:
            x[i] = 0.37
        else:
            x[i] = rng.normal(0, 0.01, block)
            x[i, rng.integers(block)] = -7.5
    return x


def act_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Activation rows; the last 256 values hold exact rounding ties (|max| = 127 makes
    the Q8 multiplier exactly ±1, so x.5 stays a tie)."""
    x = rng.normal(0, 1.5, n).astype(np.float32)
    x[-256:] = np.float32(0.5) + rng.integers(-60, 60, 256).astype(np.float32)
    x[-256] = -127.0
    x[-32] = 127.0
    return x


class GgmlRef:
    def __init__(self, exe: str):
        self.exe = exe
        self.tmp = Path(tempfile.mkdtemp())

    def run(self, *args: str) -> None:
        subprocess.run([self.exe, *args], check=True)

    def quant(self, qtype: T, x: np.ndarray) -> bytes:
        (self.tmp / "in").write_bytes(x.astype(np.float32).tobytes())
        self.run("quant", str(int(qtype)), str(x.shape[-1]), str(x.size // x.shape[-1]), str(self.tmp / "in"), str(self.tmp / "out"))
        return (self.tmp / "out").read_bytes()

    def act(self, qtype: T, x: np.ndarray) -> bytes:
        (self.tmp / "in").write_bytes(x.astype(np.float32).tobytes())
        self.run("act", str(int(qtype)), str(x.size), str(self.tmp / "in"), str(self.tmp / "out"))
        return (self.tmp / "out").read_bytes()

    def dot(self, qtype: T, n: int, nrows: int, w: bytes, a: bytes) -> np.ndarray:
        (self.tmp / "w").write_bytes(w)
        (self.tmp / "a").write_bytes(a)
        self.run("dot", str(int(qtype)), str(n), str(nrows), str(self.tmp / "w"), str(self.tmp / "a"), str(self.tmp / "out"))
        return np.frombuffer((self.tmp / "out").read_bytes(), dtype=np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ggml-ref", help="path to the ggml_ref harness (optional)")
    args = ap.parse_args()
    out: Path = args.out
    rng = np.random.default_rng(SEED)
    written: list[str] = []

    def write(name: str, data: bytes) -> None:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(f"{name} {len(data)}")

    # 1. Dequantization against gguf.
    for name, qtype, signed_off, pos_off in BLOCK_TYPES:
        raw = random_blocks(rng, qtype, signed_off, pos_off, 8)
        expect = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype)
        write(f"dequant/{name}.blocks", raw)
        write(f"dequant/{name}.f32", expect.astype(np.float32).tobytes())
    for name, qtype in [("f16", T.F16), ("bf16", T.BF16)]:
        raw = random_halves(rng, 4096, name)
        expect = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype)
        write(f"dequant/{name}.blocks", raw)
        write(f"dequant/{name}.f32", expect.astype(np.float32).tobytes())

    # 2. Quantization against gguf.
    for name, qtype in GGUF_QUANTIZERS:
        x = quant_inputs(rng, 32, 32)
        q = quants.quantize(x, qtype)
        write(f"quant/{name}.in.f32", x.tobytes())
        write(f"quant/{name}.gguf.bin", np.ascontiguousarray(q).view(np.uint8).tobytes())

    if args.ggml_ref:
        ref = GgmlRef(args.ggml_ref)
        # 3. Reference quantizers of ggml (rows of 512 values).
        for name, qtype in GGML_QUANTIZERS:
            x = quant_inputs(rng, 256, 16).reshape(8, 512)
            write(f"quant/{name}.ggml.in.f32", x.tobytes())
            write(f"quant/{name}.ggml.bin", ref.quant(qtype, x))
        # 4. Activation quantizers of the CPU backend.
        for name, qtype in [("q8_0", T.Q8_0), ("q8_1", T.Q8_1), ("q8_k", T.Q8_K)]:
            x = act_inputs(rng, 2048)
            write(f"act/{name}.in.f32", x.tobytes())
            write(f"act/{name}.ggml.bin", ref.act(qtype, x))
        # 5. Dot products of the CPU backend: 4 rows of 1024 with one activation row.
        for name, wtype, atype in DOT_TYPES:
            w = rng.normal(0, 1, (4, 1024)).astype(np.float32)
            wq = ref.quant(wtype, w)
            x = rng.normal(0, 1, 1024).astype(np.float32)
            a = ref.act(atype, x)
            write(f"dot/{name}.w.bin", wq)
            write(f"dot/{name}.act.f32", x.tobytes())
            write(f"dot/{name}.ggml.f32", ref.dot(wtype, 1024, 4, wq, a).tobytes())
        # ggml quantizes IQ2_XXS only with an importance matrix: dot random valid blocks.
        wq = random_blocks(rng, T.IQ2_XXS, [0], [], 16)
        x = rng.normal(0, 1, 1024).astype(np.float32)
        write("dot/iq2_xxs.w.bin", wq)
        write("dot/iq2_xxs.act.f32", x.tobytes())
        write("dot/iq2_xxs.ggml.f32", ref.dot(T.IQ2_XXS, 1024, 4, wq, ref.act(T.Q8_K, x)).tobytes())

    (out / "MANIFEST.txt").write_text(
        "# name bytes — generated by tools/quant-vectors/gen.py, seed %d\n" % SEED + "\n".join(written) + "\n")


if __name__ == "__main__":
    main()
