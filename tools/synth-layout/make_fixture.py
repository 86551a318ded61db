#!/usr/bin/env python3
"""Records the GGUF layout that `synth_gguf.py --shape SHAPE` writes (`glm53-flash`,
`deepseek4-flash`), for `crates/cuda/tests/synth_layout.rs` (our `glm53-flash:q2` and
`deepseek4-flash:q2` must write the same files).

For each layer window it runs synth_gguf.py's own plan and writer up to the end of the
tensor directory (the weights are never generated: the writer is stopped at the first
tensor's data), extends the file sparsely to its full size, reads it back with gguf-py
and records: the header (everything before the data section: metadata and tensor
directory, zero-padded to the alignment) as length and sha256, every metadata key with
its type and value (arrays of more than 64 values as their length only), every tensor
(name, ggml dims, type), the weight bytes and the weight bytes one decode token reads
(synth_gguf.py's own `decode_read`). Windows: real layers 0..3 and 2..4 with the full
tensor list; the whole model (45 or 43 layers) with header, sizes and tensor count only.

usage (numpy and the gguf-py of llama.cpp 0c1e5709, see ../shared/tools/README.md):
  PYTHONPATH=.../llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py \\
    python tools/synth-layout/make_fixture.py [--shape glm53-flash|deepseek4-flash] \\
    [--synth-gguf ../shared/tools/synth_gguf.py] [-o crates/cuda/tests/fixtures/synth_<shape>.json]
"""
import argparse
import hashlib
import importlib.util
import json
import os
import tempfile

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# (first layer, layers, full tensor list), the last the whole model.
WINDOWS = [(0, 4, True), (2, 3, True)]
LAYERS = {"glm53-flash": 45, "deepseek4-flash": 43}


class HeaderWritten(Exception):
    """Raised in place of the first tensor's data: the header is on disk."""


def load_synth(path):
    spec = importlib.util.spec_from_file_location("synth_gguf", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def type_name(field):
    t = field.types
    if t[0] == gguf.GGUFValueType.ARRAY:
        return f"ARRAY[{t[1].name}]"
    return t[0].name


def value(field):
    t = field.types
    if t[0] == gguf.GGUFValueType.ARRAY:
        if len(field.data) > 64:
            return {"len": len(field.data)}
        if t[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i][0].item() for i in field.data]
    if t[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]][0].item()


def record(sg, shape, first, n_layer, with_tensors):
    p = sg.SHAPES[shape](first, n_layer)
    weight = read = 0
    for name, ne, qtype, _ in p.tensors:
        nb = sg.tensor_nbytes(qtype, ne)
        weight += nb
        read += sg.decode_read(p, name, ne, nb)

    def stop(*_):
        raise HeaderWritten()

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "header.gguf")
        make_data, sg.make_data = sg.make_data, stop
        try:
            sg.write(p, path, sg.tokenizer_minimal(p.n_vocab), seed=0)
        except HeaderWritten:
            pass
        finally:
            sg.make_data = make_data
        n = os.path.getsize(path)
        align = gguf.GGUF_DEFAULT_ALIGNMENT
        data_offset = (n + align - 1) // align * align
        with open(path, "rb") as f:
            header = f.read() + bytes(data_offset - n)
        padded = sum(
            (sg.tensor_nbytes(q, ne) + align - 1) // align * align for _, ne, q, _ in p.tensors
        )
        os.truncate(path, data_offset + padded)
        r = gguf.GGUFReader(path)
        metadata = [
            [f.name, type_name(f), value(f)]
            for f in r.fields.values()
            if not f.name.startswith("GGUF.")
        ]
        tensors = [[t.name, [int(x) for x in t.shape], t.tensor_type.name] for t in r.tensors]
        del r
    out = {
        "first_layer": first,
        "layers": n_layer,
        "header_len": len(header),
        "header_sha256": hashlib.sha256(header).hexdigest(),
        "weight_bytes": weight,
        "decode_bytes": read,
        "n_tensors": len(tensors),
    }
    if with_tensors:
        out["metadata"] = metadata
        out["tensors"] = tensors
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--synth-gguf",
        default=os.path.join(ROOT, "..", "shared", "tools", "synth_gguf.py"),
    )
    ap.add_argument("--shape", default="glm53-flash", choices=sorted(LAYERS))
    ap.add_argument("-o", "--out")
    a = ap.parse_args()
    out = a.out or os.path.join(
        ROOT, "crates", "cuda", "tests", "fixtures", f"synth_{a.shape.replace('-', '_')}.json"
    )
    sg = load_synth(a.synth_gguf)
    windows = [
        record(sg, a.shape, k, n, full)
        for k, n, full in WINDOWS + [(0, LAYERS[a.shape], False)]
    ]
    with open(out, "w") as f:
        json.dump({"shape": a.shape, "windows": windows}, f, indent=1)
        f.write("\n")
    print(f"wrote {out}: {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
