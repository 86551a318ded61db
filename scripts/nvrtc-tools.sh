#!/usr/bin/env bash
# NVIDIA's NVRTC and disassembler on a machine without the CUDA toolkit: the PyPI wheels
# nvidia-cuda-nvrtc, nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, fetched once into
# $DS4_SASS_TOOLS (default ~/.cache/ds4-server/sass-tools; bin/ and lib/). Sourced by
# scripts/sass.sh and scripts/device-pack.sh; sets TOOLS.
TOOLS="${DS4_SASS_TOOLS:-$HOME/.cache/ds4-server/sass-tools}"
if [ ! -x "$TOOLS/bin/nvdisasm" ] || ! compgen -G "$TOOLS/lib/libnvrtc.so*" > /dev/null; then
  echo "fetching NVIDIA's NVRTC and disassembler wheels into $TOOLS" >&2
  mkdir -p "$TOOLS/wheels"
  pip download --quiet --no-deps -d "$TOOLS/wheels" \
    nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
  for w in "$TOOLS"/wheels/*.whl; do python3 -m zipfile -e "$w" "$TOOLS/unpacked"; done
  mkdir -p "$TOOLS/bin" "$TOOLS/lib"
  find "$TOOLS/unpacked" -type f \( -name cuobjdump -o -name nvdisasm \) -exec cp {} "$TOOLS/bin/" \;
  find "$TOOLS/unpacked" -name 'libnvrtc*.so*' -exec cp {} "$TOOLS/lib/" \;
  chmod +x "$TOOLS"/bin/*
fi
