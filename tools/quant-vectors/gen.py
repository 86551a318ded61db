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
import os
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

# Matrix-product vectors: weight types, which of them ggml repacks, shapes, token counts.
MM_TYPES = [("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q5_0", T.Q5_0), ("q5_1", T.Q5_1), ("q8_0", T.Q8_0),
            ("q2_k", T.Q2_K), ("q3_k", T.Q3_K), ("q4_k", T.Q4_K), ("q5_k", T.Q5_K), ("q6_k", T.Q6_K),
            ("iq2_xxs", T.IQ2_XXS), ("f32", T.F32), ("f16", T.F16), ("bf16", T.BF16)]
MM_REPACKED = {"q4_0", "q4_k", "q2_k"}
MM_TILED = {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq2_xxs"}
MM_ROWS, MM_K, MM_TOKENS = 24, 512, 21
# An odd shape for the 32-blocks and the floats: rows not a multiple of 4 or 8 (no
# repacking, no tinyBLAS), a row length not a multiple of 64 (vec_dot's leftovers).
MM_ODD_TYPES = [("q4_0", T.Q4_0), ("q8_0", T.Q8_0), ("q5_1", T.Q5_1), ("f32", T.F32), ("f16", T.F16),
                ("bf16", T.BF16)]
MM_ODD_ROWS, MM_ODD_K = 22, 544
MM_NS = [1, 2, 3, 4, 5, 7, 8, 9, 13, 21]


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
    def __init__(self, exe: str, mm: str | None = None):
        self.exe = exe
        self.mm_exe = mm
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

    def mm(self, qtype: T, k: int, m: int, w: bytes, x: np.ndarray, repack: bool, tiled: bool, threads: int) -> bytes:
        """The whole product through ggml's CPU backend (ggml_mm.c): N x M results.
        `tiled`: ggml's tiled K-quant kernels on (GGML_CPU_TILED_MM, on by default in
        ggml since they were added) or off (the llama.cpp that recorded the fixtures had
        none)."""
        (self.tmp / "w").write_bytes(w)
        (self.tmp / "x").write_bytes(x.astype(np.float32).tobytes())
        n = x.size // k
        env = dict(os.environ, GGML_CPU_TILED_MM="1" if tiled else "0")
        subprocess.run([self.mm_exe, str(int(qtype)), str(k), str(m), str(n), str(int(repack)), str(threads),
                        str(self.tmp / "w"), str(self.tmp / "x"), str(self.tmp / "out")], check=True, env=env,
                       stderr=subprocess.DEVNULL)
        return (self.tmp / "out").read_bytes()


def mm_weights(rng: np.random.Generator, ref: GgmlRef, name: str, qtype: T, rows: int, k: int) -> bytes:
    """Weights for the matrix-product vectors: ggml-quantized normal values (random valid
    blocks for IQ2_XXS, which ggml only quantizes with an importance matrix; bit patterns
    for the float types)."""
    if qtype == T.IQ2_XXS:
        return random_blocks(rng, qtype, [0], [], rows * k // 256)
    w = rng.normal(0, 1, (rows, k)).astype(np.float32) * rng.uniform(0.01, 2, (rows, 1)).astype(np.float32)
    if qtype == T.F32:
        return w.tobytes()
    if qtype in (T.F16, T.BF16):
        return np.ascontiguousarray(quants.quantize(w, qtype)).view(np.uint8).tobytes()
    return ref.quant(qtype, w)


def mm_acts(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Activation rows of varied scales with a few outliers, as hidden states have."""
    x = rng.normal(0, 1, (n, k)).astype(np.float32) * np.exp(rng.uniform(-3, 2, (n, 1))).astype(np.float32)
    x[rng.random((n, k)) < 0.01] *= 20
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ggml-ref", help="path to the ggml_ref harness (optional)")
    ap.add_argument("--ggml-mm", help="path to the ggml_mm harness (with --ggml-ref)")
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
        ref = GgmlRef(args.ggml_ref, args.ggml_mm)
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

    if args.ggml_ref and args.ggml_mm:
        # 6. Whole matrix products through ggml's CPU backend, for every token count that
        #    changes ggml's kernel choice (vec_dot / tinyBLAS, tiled from 8 tokens,
        #    repacked GEMM for groups of 4 tokens and GEMV for the rest).
        x = mm_acts(rng, MM_TOKENS, MM_K)
        write("mm/x.f32", x.tobytes())
        for name, qtype in MM_TYPES:
            w = mm_weights(rng, ref, name, qtype, MM_ROWS, MM_K)
            write(f"mm/{name}.w.bin", w)
            configs = [("", False, False)]
            if name in MM_REPACKED:
                configs.append((".repack", True, False))
            if name in MM_TILED:
                configs.append((".tiled", False, True))
            for suffix, repack, tiled in configs:
                # the products for each n of MM_NS, concatenated (n x MM_ROWS each)
                outs = b""
                for n in MM_NS:
                    got = ref.mm(qtype, MM_K, MM_ROWS, w, x[:n], repack, tiled, 2)
                    assert got == ref.mm(qtype, MM_K, MM_ROWS, w, x[:n], repack, tiled, 1), \
                        "thread count changed ggml's result"
                    outs += got
                write(f"mm/{name}{suffix}.ggml.f32", outs)
        x = mm_acts(rng, MM_TOKENS, MM_ODD_K)
        write("mm/odd/x.f32", x.tobytes())
        for name, qtype in MM_ODD_TYPES:
            w = mm_weights(rng, ref, name, qtype, MM_ODD_ROWS, MM_ODD_K)
            write(f"mm/odd/{name}.w.bin", w)
            outs = b"".join(ref.mm(qtype, MM_ODD_K, MM_ODD_ROWS, w, x[:n], False, False, 2) for n in MM_NS)
            write(f"mm/odd/{name}.ggml.f32", outs)

    if args.ggml_ref and args.ggml_mm:
        # 7. MXFP4 (DeepSeek-V4's routed experts), added later with its own generator so
        #    that every file above keeps its bytes: dequantization, ggml's reference
        #    quantizer, vec_dot (1024 = 32 blocks, and 544 = 17 blocks: the unpaired
        #    last block), whole products plain and repacked, and the odd shape.
        mrng = np.random.default_rng(SEED + 39)
        blocks = mrng.integers(0, 256, (8, 17), dtype=np.uint8)
        blocks[:, 0] = mrng.integers(100, 150, 8)
        blocks[:3, 0] = [0, 1, 254]  # subnormal and extreme scales
        raw = blocks.tobytes()
        write("dequant/mxfp4.blocks", raw)
        (ref.tmp / "b").write_bytes(raw)
        ref.run("dequant", str(int(T.MXFP4)), str(8 * 32), str(ref.tmp / "b"), str(ref.tmp / "out"))
        write("dequant/mxfp4.f32", (ref.tmp / "out").read_bytes())
        x = quant_inputs(mrng, 256, 16).reshape(8, 512)
        write("quant/mxfp4.ggml.in.f32", x.tobytes())
        write("quant/mxfp4.ggml.bin", ref.quant(T.MXFP4, x))
        for name, n in [("mxfp4", 1024), ("mxfp4_odd", 544)]:
            w = mrng.normal(0, 1, (4, n)).astype(np.float32)
            wq = ref.quant(T.MXFP4, w)
            x = mrng.normal(0, 1, n).astype(np.float32)
            write(f"dot/{name}.w.bin", wq)
            write(f"dot/{name}.act.f32", x.tobytes())
            write(f"dot/{name}.ggml.f32", ref.dot(T.MXFP4, n, 4, wq, ref.act(T.Q8_0, x)).tobytes())
        for d, rows, k in [("", MM_ROWS, MM_K), ("odd/", MM_ODD_ROWS, MM_ODD_K)]:
            x = np.frombuffer((out / f"mm/{d}x.f32").read_bytes(), dtype=np.float32).reshape(MM_TOKENS, k)
            w = mm_weights(mrng, ref, "mxfp4", T.MXFP4, rows, k)
            write(f"mm/{d}mxfp4.w.bin", w)
            configs = [("", False)] + ([(".repack", True)] if rows % 8 == 0 else [])
            for suffix, repack in configs:
                outs = b""
                for n in MM_NS:
                    got = ref.mm(T.MXFP4, k, rows, w, x[:n], repack, False, 2)
                    assert got == ref.mm(T.MXFP4, k, rows, w, x[:n], repack, False, 1), \
                        "thread count changed ggml's result"
                    outs += got
                write(f"mm/{d}mxfp4{suffix}.ggml.f32", outs)

    (out / "MANIFEST.txt").write_text(
        "# name bytes — generated by tools/quant-vectors/gen.py, seed %d\n" % SEED + "\n".join(written) + "\n")


if __name__ == "__main__":
    main()
