#!/usr/bin/env bash
# Does a GGUF written by our converter load and run in llama.cpp, and does llama.cpp
# then reproduce the golden master? (issue 10, item 6; too slow for CI: the llama.cpp
# build takes ~15 min on 2 cores the first time.)
#
#   tools/reference/llamacpp_check.sh [FIXTURE_F32_DIR]
#       default crates/engine/tests/fixtures/glm5_next/real_layout_f32
#
# 1. builds libllama (CPU only, -DGGML_NATIVE=OFF, -j2) from the llama.cpp tree of the
#    llama-cpp-python 0.3.36 sdist ($LLAMA_CPP_DIR, default
#    /work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp) into $BUILD_DIR (default
#    target-llamacpp/, git-ignored), and tools/reference/llamacpp_logits.cpp against it;
# 2. converts the fixture's checkpoint with our converter (`ds4-server convert --outtype
#    f32`; $DS4_SERVER, default: `cargo build -p ds4-cli`, then target/debug/ds4-server);
# 3. runs llama.cpp on our file and on the fixture's llamacpp.gguf (llama.cpp's own
#    converter) with the fixture protocol — the prompt in one call, then the 32 decode
#    tokens one at a time — with an f32 KV cache (type_k/type_v f32; llama.cpp's default
#    f16 cache moves the logits by up to ~1) and flash attention off;
# 4. compares each run's logits with the reference's (prefill_logits.npy,
#    decode_logits.npy): max over rows of max|Δ| / max(1, std(reference row)), and the
#    greedy tokens. Fails (exit 1) when our file does not load or exceeds 1e-4.
# Needs cmake, a C++17 compiler, and tools/reference/.venv (numpy).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
fixture="$(cd "${1:-$root/crates/engine/tests/fixtures/glm5_next/real_layout_f32}" && pwd)"
llama="${LLAMA_CPP_DIR:-/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp}"
build="${BUILD_DIR:-$root/target-llamacpp}"
py="$here/.venv/bin/python"
[[ -x "$py" ]] || { echo "error: $py missing (tools/reference/make-fixtures.sh creates it)" >&2; exit 2; }
[[ -f "$llama/include/llama.h" ]] || { echo "error: no llama.cpp tree at $llama" >&2; exit 2; }
command -v cmake >/dev/null || { echo "error: cmake not found (apt-get install cmake)" >&2; exit 2; }

mkdir -p "$build"
if [[ ! -f "$build/build/src/libllama.a" ]]; then
    echo "== building libllama (CPU) in $build/build" >&2
    cmake -S "$llama" -B "$build/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF >"$build/configure.log"
    cmake --build "$build/build" --target llama -j2 >"$build/build.log"
fi
b="$build/build"
"${CXX:-g++}" -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$here/llamacpp_logits.cpp" \
    "$b/src/libllama.a" "$b/ggml/src/libggml.a" "$b/ggml/src/libggml-cpu.a" "$b/ggml/src/libggml-base.a" \
    -fopenmp -lpthread -ldl -o "$build/llamacpp_logits"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "== converting $fixture with our converter" >&2
server="${DS4_SERVER:-}"
if [[ -z "$server" ]]; then
    (cd "$root" && cargo build -q -p ds4-cli) >&2
    server="$root/target/debug/ds4-server"
fi
"$server" convert "$fixture" -o "$work/ours.gguf" --outtype f32 >&2

"$py" - "$fixture" "$work/tokens.txt" <<'EOF'
import sys, numpy as np
fx, out = sys.argv[1], sys.argv[2]
prompt = np.load(f"{fx}/prompt.npy"); dec = np.load(f"{fx}/decode_tokens.npy")
open(out, "w").write(" ".join(str(int(t)) for t in list(prompt) + list(dec[:-1])) + "\n")
EOF
n_prompt="$("$py" -c "import numpy as np,sys; print(len(np.load(sys.argv[1])))" "$fixture/prompt.npy")"

status=0
for which in ours llamacpp; do
    gguf="$work/ours.gguf"
    [[ "$which" == llamacpp ]] && gguf="$fixture/llamacpp.gguf"
    [[ -f "$gguf" ]] || { echo "$which: $gguf missing, skipped"; continue; }
    if ! "$build/llamacpp_logits" "$gguf" "$work/tokens.txt" "$n_prompt" "$work/$which.f32" 2>"$work/$which.log"; then
        echo "$which: llama.cpp FAILED to load or run $(basename "$gguf"):"; tail -5 "$work/$which.log"
        [[ "$which" == ours ]] && status=1
        continue
    fi
    "$py" - "$fixture" "$work/$which.f32" "$n_prompt" "$which" <<'EOF' || { [[ "$which" == ours ]] && status=1; }
import sys, numpy as np
fx, path, n_prompt, which = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
pre = np.load(f"{fx}/prefill_logits.npy").astype(np.float64)
dec = np.load(f"{fx}/decode_logits.npy").astype(np.float64)
toks = np.load(f"{fx}/decode_tokens.npy")
got = np.fromfile(path, dtype="<f4").astype(np.float64).reshape(-1, pre.shape[1])
def rel(a, r):
    return float((np.abs(a - r).max(-1) / np.maximum(r.std(-1), 1.0)).max())
ep, ed = rel(got[:n_prompt], pre), rel(got[n_prompt:], dec)
same = int((got[n_prompt:].argmax(-1) == toks[1:]).sum())
ok = ep <= 1e-4 and ed <= 1e-4 and same == len(dec)
print(f"{which}: llama.cpp prefill rel err {ep:.2e}, decode rel err {ed:.2e}, "
      f"greedy tokens {same}/{len(dec)} -> {'OK' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
done
exit $status
