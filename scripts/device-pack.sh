#!/usr/bin/env bash
# Packs this working tree's build for a GPU machine without a Rust toolchain or NVRTC
# cache: gpu_check (and with --server ds4-server, which converts the bf16 fixtures),
# stripped, in DIR/NAME.tgz, and the kernels compiled for the H200 by every binary packed
# into DIR so far in DIR/cache.tgz (NVRTC from PyPI's wheels, scripts/nvrtc-tools.sh), so
# that the GPU machine spends no time compiling. Pack the old build under one NAME and the
# new one under another (check out, pack, check out again), carry DIR, then there:
#
#   for f in DIR/*.tgz; do tar xzf "$f" -C DIR; done
#   DS4_CUDA_CACHE=$PWD/DIR/cache scripts/gpu-ab.sh DIR/old/gpu_check DIR/new/gpu_check ...
#
#   scripts/device-pack.sh NAME [--server] [--dir DIR]      (DIR default .device)
#
# The unpacked binaries and cache stay in ~/.cache/ds4-server/device-pack/DIR-name, out
# of the carried folder (binaries and cache compress from about 42 MB to 13 MB).
set -euo pipefail
usage() { sed -n '2,15p' "$0"; exit "${1:-2}"; }
NAME= SERVER=0 DIR=.device
while [ $# -gt 0 ]; do
  case "$1" in
    --server) SERVER=1; shift ;;
    --dir) DIR="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) NAME="$1"; shift ;;
  esac
done
[[ "$NAME" =~ ^[A-Za-z0-9_.-]+$ ]] && [ "$NAME" != cache ] || usage
cd "$(dirname "$0")/.."
cargo build --release -p ds4-cuda --examples
[ "$SERVER" = 0 ] || cargo build --release -p ds4-cli
STAGE="$HOME/.cache/ds4-server/device-pack/$(basename "$DIR")"
rm -rf "${STAGE:?}/$NAME"
mkdir -p "$STAGE/$NAME" "$STAGE/cache" "$DIR"
cp target/release/examples/gpu_check "$STAGE/$NAME/"
[ "$SERVER" = 0 ] || cp target/release/ds4-server "$STAGE/$NAME/"
strip "$STAGE/$NAME"/*
# shellcheck source=scripts/nvrtc-tools.sh
source scripts/nvrtc-tools.sh
LD_LIBRARY_PATH="$TOOLS/lib" DS4_CUDA_CACHE="$STAGE/cache" "$STAGE/$NAME/gpu_check" warm-cache sm_90a >&2
tar czf "$DIR/$NAME.tgz" -C "$STAGE" "$NAME"
tar czf "$DIR/cache.tgz" -C "$STAGE" cache
du -h "$DIR/$NAME.tgz" "$DIR/cache.tgz"
