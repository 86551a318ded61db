#!/usr/bin/env bash
# A paired decode comparison of two gpu_check binaries on the GPU machine (the protocol of
# docs/benchmarks.md): the old and the new binary alternated ROUNDS times per model in one
# session, `bench SPEC --runs 5 --decode 32 --prefill ""` each, then one line per model
# with every run's device ms per graph replay and tok/s median, old beside new.
#
#   scripts/gpu-ab.sh OLD_BIN NEW_BIN [--rounds N] [--log FILE] [SPEC ...]
#
# SPECs default to glm53-flash:q2 deepseek4-flash:q2. Each bench's whole output goes to
# the log (default gpu-ab.log), so nothing is lost when only the end of the output comes
# back. Both binaries read their kernels from DS4_CUDA_CACHE when it is set (warm it here
# with `gpu_check warm-cache sm_90a` for each binary and carry it).
set -u
[ $# -ge 2 ] || { sed -n '2,13p' "$0"; exit 2; }
OLD="$1" NEW="$2"; shift 2
ROUNDS=2 LOG=gpu-ab.log SPECS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift 2 ;;
    --log) LOG="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) SPECS+=("$1"); shift ;;
  esac
done
[ ${#SPECS[@]} -gt 0 ] || SPECS=(glm53-flash:q2 deepseek4-flash:q2)
for b in "$OLD" "$NEW"; do [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 2; }; done
export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}"
: > "$LOG"

# One bench; prints "ms tok/s" (device ms per replay, decode median) or "failed".
bench() {  # bench BIN SPEC
  local out
  out=$(timeout "${BENCH_TIMEOUT:-300}" "$1" bench "$2" --runs 5 --decode 32 --prefill "" 2>&1)
  { echo "== $1 bench $2"; echo "$out"; } >> "$LOG"
  local ms tps
  ms=$(sed -n 's/^decode step: \([0-9.]*\) ms on the device per graph replay.*/\1/p' <<< "$out")
  tps=$(sed -n 's/^decode [0-9]* tok: median \([0-9.]*\) tok\/s.*/\1/p' <<< "$out")
  if [ -n "$ms" ] && [ -n "$tps" ]; then echo "$ms $tps"; else echo "failed"; fi
}

for spec in "${SPECS[@]}"; do
  old=() new=()
  for _ in $(seq "$ROUNDS"); do
    old+=("$(bench "$OLD" "$spec")")
    new+=("$(bench "$NEW" "$spec")")
  done
  printf '%s: old %s | new %s   (ms per replay, tok/s; log %s)\n' "$spec" \
    "$(IFS=,; echo "${old[*]}")" "$(IFS=,; echo "${new[*]}")" "$LOG"
done
