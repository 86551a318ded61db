#!/usr/bin/env bash
# Makes (or keeps) the Python virtual environment with the official OpenAI and Anthropic
# SDKs that crates/server/tests/sdk.rs drives the server with (versions pinned in
# crates/server/tests/sdk/requirements.txt). `make test-setup` runs it before the tests;
# the test runs it again, which does nothing when the environment is up to date.
# Usage: scripts/sdk-venv.sh [VENV]   (default: the target directory's tmp/sdk-venv,
# where the test looks)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
req="$root/crates/server/tests/sdk/requirements.txt"
target="${CARGO_TARGET_DIR:-target}"
[[ "$target" = /* ]] || target="$root/$target"
venv="${1:-$target/tmp/sdk-venv}"
stamp="$venv/.requirements.txt"
if [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp"; then
    exit 0
fi
command -v python3 >/dev/null || { echo "python3 is not installed" >&2; exit 1; }
python3 -m venv --clear "$venv" ||
    { echo "\`python3 -m venv $venv\` failed (is the venv module installed? Debian: python3-venv)" >&2; exit 1; }
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" ||
    { echo "pip install -r $req failed (offline?)" >&2; exit 1; }
cp "$req" "$stamp"
echo "SDKs installed in $venv"
