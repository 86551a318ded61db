#!/usr/bin/env bash
# Regenerate the golden-master fixtures.
#   tools/reference/make-fixtures.sh [--family glm5_next|deepseek4] [--only NAME] [--no-sensitivity]
# Without --family, every family is regenerated (glm5_next, then deepseek4);
# --only and --no-sensitivity are passed to each family's script.
# Creates tools/reference/.venv on first use (PyPI, ~5 GB: the PyPI torch wheel
# pulls the CUDA runtime libraries it links against; everything runs on the CPU).
# deepseek4 (and glm5_next for real_layout) also remakes llamacpp.gguf next to each
# f32 checkpoint with llama.cpp's converter (tools/reference/llamacpp_convert.py); it needs the
# llama.cpp tree of the llama-cpp-python 0.3.36 sdist: $LLAMA_CPP_DIR, default
# /work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$here/.venv"

families=(glm5_next deepseek4)
args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --family)
            [[ $# -ge 2 ]] || { echo "error: --family needs a value (glm5_next or deepseek4)" >&2; exit 2; }
            case "$2" in
                glm5_next|deepseek4) families=("$2") ;;
                *) echo "error: unknown family '$2' (glm5_next or deepseek4)" >&2; exit 2 ;;
            esac
            shift 2 ;;
        --family=*)
            case "${1#--family=}" in
                glm5_next|deepseek4) families=("${1#--family=}") ;;
                *) echo "error: unknown family '${1#--family=}' (glm5_next or deepseek4)" >&2; exit 2 ;;
            esac
            shift ;;
        *) args+=("$1"); shift ;;
    esac
done

if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet -r "$here/requirements.txt"
fi
for forbidden in fla causal_conv1d kernels; do
    if "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$forbidden') is None)"; then
        echo "error: $forbidden is installed in $venv; the reference would switch kernels" >&2
        exit 1
    fi
done

for family in "${families[@]}"; do
    case "$family" in
        glm5_next)
            out="$root/crates/engine/tests/fixtures/glm5_next"
            PYTHONUNBUFFERED=1 "$venv/bin/python" "$here/glm5_next_fixtures.py" \
                --out "$out" ${args[@]+"${args[@]}"}
            # real_layout is also converted by llama.cpp (a regenerated folder has lost its llamacpp.gguf)
            d="$out/real_layout_f32"
            if [[ -f "$d/model.safetensors" && ! -f "$d/llamacpp.gguf" ]]; then
                PYTHONUNBUFFERED=1 "$venv/bin/python" "$here/llamacpp_convert.py" "$d"
            fi
            ;;
        deepseek4)
            out="$root/crates/engine/tests/fixtures/deepseek4"
            PYTHONUNBUFFERED=1 "$venv/bin/python" "$here/deepseek4_fixtures.py" \
                --out "$out" ${args[@]+"${args[@]}"}
            # the fixture script removes a regenerated folder's old llamacpp.gguf: convert exactly those
            todo=()
            for d in "$out"/*_f32; do
                [[ -f "$d/model.safetensors" && ! -f "$d/llamacpp.gguf" ]] && todo+=("$d")
            done
            if [[ ${#todo[@]} -gt 0 ]]; then
                PYTHONUNBUFFERED=1 "$venv/bin/python" "$here/llamacpp_convert.py" "${todo[@]}"
            fi
            ;;
    esac
done
