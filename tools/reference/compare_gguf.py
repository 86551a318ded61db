#!/usr/bin/env python3
"""Compare two GGUF files key by key and tensor by tensor; print every difference.

    tools/reference/.venv/bin/python tools/reference/compare_gguf.py A.gguf B.gguf \\
        [--ignore-key general.name ...] [--values]

Reported, in this order:
  * metadata keys present in only one file;
  * keys whose value type differs (scalar type, or array element type), and keys whose
    values differ (strings, numbers compared exactly; arrays: length, then the first
    differing elements);
  * tensors present in only one file;
  * tensors whose ggml shape (dims fastest first) or type differ;
  * for tensors present in both with the same shape: max |A - B| of the values
    (every type dequantised to f32 with gguf-py; listed when non-zero, or for every
    tensor with --values).

Reads the files with llama.cpp's own gguf-py (`$LLAMA_CPP_DIR/gguf-py`, default the
llama-cpp-python 0.3.36 sdist's tree). Exit status 1 when a difference not covered by
--ignore-key was found (tensor value differences count only with --strict-values).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

DEFAULT_LLAMA_CPP = "/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp"
sys.path.insert(0, str(Path(os.environ.get("LLAMA_CPP_DIR", DEFAULT_LLAMA_CPP)) / "gguf-py"))
import gguf  # noqa: E402


def fields(reader: "gguf.GGUFReader") -> dict:
    out = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [t.name for t in f.types]
        out[name] = (types, f.contents())
    return out


def tensors(reader: "gguf.GGUFReader") -> dict:
    return {t.name: t for t in reader.tensors}


def values(t) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)


def short(v, n: int = 6) -> str:
    if isinstance(v, list):
        head = ", ".join(repr(x) for x in v[:n])
        return f"[{head}{', …' if len(v) > n else ''}] ({len(v)} items)"
    return repr(v)


def compare(a_path: Path, b_path: Path, ignore: set[str], show_values: bool, strict_values: bool) -> int:
    ra, rb = gguf.GGUFReader(str(a_path)), gguf.GGUFReader(str(b_path))
    fa, fb = fields(ra), fields(rb)
    n_diff = 0

    def report(key: str | None, line: str, counts: bool = True) -> None:
        nonlocal n_diff
        ignored = key is not None and key in ignore
        print(("  (ignored) " if ignored else "  ") + line)
        if counts and not ignored:
            n_diff += 1

    print(f"A = {a_path}\nB = {b_path}")
    print("metadata:")
    for k in sorted(set(fa) - set(fb)):
        report(k, f"only in A: {k} {fa[k][0]} = {short(fa[k][1])}")
    for k in sorted(set(fb) - set(fa)):
        report(k, f"only in B: {k} {fb[k][0]} = {short(fb[k][1])}")
    for k in sorted(set(fa) & set(fb)):
        (ta, va), (tb, vb) = fa[k], fb[k]
        if ta != tb:
            report(k, f"type differs: {k}: A {ta} = {short(va)}, B {tb} = {short(vb)}")
        elif va != vb:
            if isinstance(va, list) and isinstance(vb, list):
                if len(va) != len(vb):
                    report(k, f"value differs: {k}: A {len(va)} items, B {len(vb)} items")
                else:
                    idx = [i for i, (x, y) in enumerate(zip(va, vb)) if x != y]
                    shown = ", ".join(f"[{i}] {va[i]!r} vs {vb[i]!r}" for i in idx[:5])
                    report(k, f"value differs: {k}: {len(idx)} of {len(va)} items, {shown}")
            else:
                report(k, f"value differs: {k}: A {va!r}, B {vb!r}")
    print(f"  {len(set(fa) & set(fb))} keys in both, {len(fa)} in A, {len(fb)} in B")

    print("tensors:")
    ta_, tb_ = tensors(ra), tensors(rb)
    for n in sorted(set(ta_) - set(tb_)):
        t = ta_[n]
        report(None, f"only in A: {n} {[int(d) for d in t.shape]} {t.tensor_type.name}")
    for n in sorted(set(tb_) - set(ta_)):
        t = tb_[n]
        report(None, f"only in B: {n} {[int(d) for d in t.shape]} {t.tensor_type.name}")
    worst = 0.0
    for n in sorted(set(ta_) & set(tb_)):
        x, y = ta_[n], tb_[n]
        sx, sy = [int(d) for d in x.shape], [int(d) for d in y.shape]
        if sx != sy:
            report(None, f"shape differs: {n}: A {sx}, B {sy}")
        if x.tensor_type != y.tensor_type:
            report(None, f"type differs: {n}: A {x.tensor_type.name}, B {y.tensor_type.name}")
        if int(np.prod(sx)) != int(np.prod(sy)):
            continue
        d = float(np.abs(values(x) - values(y)).max()) if np.prod(sx) else 0.0
        worst = max(worst, d)
        if d != 0.0 or show_values:
            report(None, f"values: {n}: max |A - B| = {d:.3e}", counts=strict_values and d != 0.0)
    print(f"  {len(set(ta_) & set(tb_))} tensors in both, {len(ta_)} in A, {len(tb_)} in B; "
          f"max |A - B| over common tensors {worst:.3e}")
    print(f"{n_diff} difference(s)" + (f" (ignoring {sorted(ignore)})" if ignore else ""))
    return 1 if n_diff else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--ignore-key", action="append", default=[], help="a metadata key whose difference is expected")
    ap.add_argument("--values", action="store_true", help="print max |A - B| for every common tensor")
    ap.add_argument("--strict-values", action="store_true", help="count non-zero value differences as differences")
    args = ap.parse_args()
    sys.exit(compare(args.a, args.b, set(args.ignore_key), args.values, args.strict_values))


if __name__ == "__main__":
    main()
