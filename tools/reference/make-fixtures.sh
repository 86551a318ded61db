#!/usr/bin/env bash
# Regenerate every glm5_next golden-master fixture.
#   tools/reference/make-fixtures.sh [--only NAME] [--no-sensitivity]
# Creates tools/reference/.venv on first use (PyPI, ~5 GB: the PyPI torch wheel
# pulls the CUDA runtime libraries it links against; everything runs on the CPU).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$here/.venv"
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
PYTHONUNBUFFERED=1 exec "$venv/bin/python" "$here/glm5_next_fixtures.py" \
    --out "$root/crates/engine/tests/fixtures/glm5_next" "$@"
