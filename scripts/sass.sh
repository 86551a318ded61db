#!/usr/bin/env bash
# The SASS of one CUDA kernel on a machine without a GPU or the CUDA toolkit: NVRTC
# compiles the kernels for the H200 (`gpu_check warm-cache sm_90a`, as the GPU machine
# would) and NVIDIA's disassembler reads the cubin. With --loops, one line per loop (a
# backward branch) instead: its instructions and most frequent opcodes — how a kernel
# change moves an inner loop's instruction count, read before any device time is spent.
#
#   scripts/sass.sh KERNEL [--loops] [--bin GPU_CHECK] [--cache DIR]
#
# GPU_CHECK: default target/release/examples/gpu_check (cargo build --release -p ds4-cuda
# --example gpu_check). DIR: the kernel cache to fill and read, default a folder per
# GPU_CHECK build under /tmp/ds4-sass-cache (a few minutes to fill, then reused); in a
# DIR shared by several builds the newest cubin that defines KERNEL is read.
# The tools — NVIDIA's wheels nvidia-cuda-nvrtc, nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm from PyPI — are fetched once (scripts/nvrtc-tools.sh).
set -euo pipefail
usage() { sed -n '2,15p' "$0"; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
KERNEL= LOOPS=0 BIN=target/release/examples/gpu_check CACHE=
while [ $# -gt 0 ]; do
  case "$1" in
    --loops) LOOPS=1; shift ;;
    --bin) BIN="$2"; shift 2 ;;
    --cache) CACHE="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) KERNEL="$1"; shift ;;
  esac
done
[ -n "$KERNEL" ] || usage
[ -x "$BIN" ] || { echo "no gpu_check at $BIN: cargo build --release -p ds4-cuda --example gpu_check" >&2; exit 1; }
[ -n "$CACHE" ] || CACHE=/tmp/ds4-sass-cache/$(sha256sum "$BIN" | cut -c1-16)

# shellcheck source=scripts/nvrtc-tools.sh
source "$(dirname "$0")/nvrtc-tools.sh"

mkdir -p "$CACHE"
LD_LIBRARY_PATH="$TOOLS/lib" DS4_CUDA_CACHE="$CACHE" "$BIN" warm-cache sm_90a >&2
# The newest cubin that defines the kernel (the name sits in its symbol table).
CUBIN=$(ls -t "$CACHE"/*.cubin | while read -r f; do
  if grep -qa -- "$KERNEL" "$f"; then echo "$f"; break; fi
done)
[ -n "$CUBIN" ] || { echo "no cubin in $CACHE defines $KERNEL" >&2; exit 1; }
SASS=$(PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/cuobjdump" -sass -fun "$KERNEL" "$CUBIN")
if [ "$LOOPS" = 0 ]; then echo "$SASS"; exit 0; fi
python3 - <(echo "$SASS") <<'EOF'
import collections, re, sys
ins = []
for line in open(sys.argv[1]):
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).strip()))
at = {a: i for i, (a, _) in enumerate(ins)}
for i, (a, text) in enumerate(ins):
    m = re.search(r'\bBRA\b.*?0x([0-9a-f]+)', text)
    if not m or int(m.group(1), 16) > a or int(m.group(1), 16) not in at:
        continue
    body = ins[at[int(m.group(1), 16)]:i + 1]
    ops = collections.Counter()
    for _, t in body:
        op = t.split()[1] if t.startswith('@') else t.split()[0]
        ops[op.split('.')[0]] += 1
    top = ', '.join(f'{o} {n}' for o, n in ops.most_common(10))
    print(f'loop {body[0][0]:#x}-{a:#x}: {len(body)} instructions: {top}')
EOF
