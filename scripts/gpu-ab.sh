#!/usr/bin/env bash
# A paired comparison of gpu_check binaries on the GPU machine (the protocol of
# docs/benchmarks.md): the old binary and each new one alternated ROUNDS times per model
# in one session, then one line per model with every run's figures, old beside new.
# Decode (the default): `bench SPEC --runs 5 --decode 32 --prefill ""`, each run's device
# ms per graph replay and tok/s median. With --prefill SIZES (e.g. 512,4096): `bench SPEC
# --runs 3 --decode 4 --prefill SIZES`, each run's prefill tok/s medians, one per size.
# With --context N the decode runs follow an N-token prompt (default 16): decode at a long
# context.
#
#   scripts/gpu-ab.sh OLD_BIN NEW_BIN [NEW_BIN ...] [--rounds N] [--log FILE] [--prefill SIZES] [--context N] [--fixtures] [SPEC ...]
#
# Arguments that are executable files are the new binaries (several variants of one change
# share the old binary's runs); the others are SPECs.
#
# --fixtures first runs `gpu_check model` on the f32 golden masters that carry llama.cpp's
# file (GLM-5.3 and DeepSeek-V4) with every binary and prints, per fixture and new binary,
# whether its RESULT line (errors against the reference and the CPU, greedy agreement,
# pieces, rewind) is identical to the old one's — a kernel change that keeps the
# arithmetic must keep it.
#
# SPECs default to glm53-flash:q2 deepseek4-flash:q2. Each bench's whole output goes to
# the log (default gpu-ab.log), so nothing is lost when only the end of the output comes
# back. Every binary reads its kernels from DS4_CUDA_CACHE when it is set (warm it here
# with `gpu_check warm-cache sm_90a` for each binary and carry it).
set -u
HELP_LINES='2,25p'
[ $# -ge 2 ] || { sed -n "$HELP_LINES" "$0"; exit 2; }
OLD="$1"; shift
ROUNDS=2 LOG=gpu-ab.log PREFILL= CONTEXT=16 FIXTURES=0 SPECS=() NEWS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --log) LOG="$2"; shift 2 ;;
    --prefill) PREFILL="$2"; shift 2 ;;
    --context) CONTEXT="$2"; shift 2 ;;
    --fixtures) FIXTURES=1; shift ;;
    -h|--help) sed -n "$HELP_LINES" "$0"; exit 0 ;;
    *) if [ -f "$1" ] && [ -x "$1" ]; then NEWS+=("$1"); else SPECS+=("$1"); fi; shift ;;
  esac
done
[ ${#SPECS[@]} -gt 0 ] || SPECS=(glm53-flash:q2 deepseek4-flash:q2)
[ -x "$OLD" ] || { echo "not an executable: $OLD" >&2; exit 2; }
[ ${#NEWS[@]} -gt 0 ] || { echo "no new binary (an executable file after OLD_BIN)" >&2; exit 2; }
BINS=("$OLD" "${NEWS[@]}")
# Each binary's name in the output: old, then new (one) or the new binaries' file names.
NAMES=(old)
for b in "${NEWS[@]}"; do
  if [ ${#NEWS[@]} -gt 1 ]; then NAMES+=("$(basename "$b")"); else NAMES+=(new); fi
done
export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}"
: > "$LOG"

# One bench; prints "ms tok/s" (device ms per replay, decode median), with --prefill the
# prefill medians ("512:1105 4096:1927"), or "failed".
bench() {  # bench BIN SPEC
  local out opts=(--runs 5 --decode 32 --prefill "" --context "$CONTEXT")
  [ -n "$PREFILL" ] && opts=(--runs 3 --decode 4 --prefill "$PREFILL")
  out=$(timeout "${BENCH_TIMEOUT:-300}" "$1" bench "$2" "${opts[@]}" 2>&1)
  { echo "== $1 bench $2"; echo "$out"; } >> "$LOG"
  if [ -n "$PREFILL" ]; then
    local fig
    fig=$(sed -n 's/^prefill \([0-9]*\) tok: median \([0-9.]*\) tok\/s.*/\1:\2/p' <<< "$out" | paste -sd' ')
    if [ -n "$fig" ]; then echo "$fig"; else echo "failed"; fi
    return
  fi
  local ms tps
  ms=$(sed -n 's/^decode step: \([0-9.]*\) ms on the device per graph replay.*/\1/p' <<< "$out")
  tps=$(sed -n 's/^decode [0-9]* tok: median \([0-9.]*\) tok\/s.*/\1/p' <<< "$out")
  if [ -n "$ms" ] && [ -n "$tps" ]; then echo "$ms $tps"; else echo "failed"; fi
}

if [ "$FIXTURES" = 1 ]; then
  for fx in crates/engine/tests/fixtures/*/*_f32; do
    [ -f "$fx/llamacpp.gguf" ] || continue
    r=()
    for b in "${BINS[@]}"; do
      out=$(timeout "${MODEL_TIMEOUT:-300}" "$b" model "$fx" "$fx/llamacpp.gguf" 2>&1)
      { echo "== $b model $fx"; echo "$out"; } >> "$LOG"
      r+=("$(grep '^RESULT ' <<< "$out" | head -1)")
    done
    for ((i = 1; i < ${#BINS[@]}; i++)); do
      if [ -z "${r[0]}" ] || [ -z "${r[i]}" ]; then verdict="failed (see $LOG)"
      elif [ "${r[0]}" = "${r[i]}" ]; then verdict="identical"
      else verdict="DIFFERENT"; fi
      name=""; [ ${#NEWS[@]} -gt 1 ] && name=" (${NAMES[i]})"
      echo "fixture $fx$name: $verdict"
    done
  done
fi

for spec in "${SPECS[@]}"; do
  runs=()
  for _ in $(seq "$ROUNDS"); do
    for i in "${!BINS[@]}"; do runs[i]+="${runs[i]:+,}$(bench "${BINS[$i]}" "$spec")"; done
  done
  what="ms per replay, tok/s"; [ -n "$PREFILL" ] && what="prefill tokens:tok/s"
  line="$spec:"
  for i in "${!BINS[@]}"; do
    [ "$i" -gt 0 ] && line+=" |"
    line+=" ${NAMES[i]} ${runs[i]}"
  done
  printf '%s   (%s; log %s)\n' "$line" "$what" "$LOG"
done
