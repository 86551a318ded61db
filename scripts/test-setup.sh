#!/usr/bin/env bash
# Everything the test suite needs that the repository does not hold (`make test` runs
# this first; so does CI through .ci/run):
# - the real models, fetched by `ds4-server pull` into its cache ($DS4_MODELS, else
#   $XDG_CACHE_HOME/ds4-server/models, else ~/.cache/ds4-server/models), where the tests
#   look (crates/testkit);
# - the official OpenAI/Anthropic SDKs for crates/server/tests/sdk.rs (scripts/sdk-venv.sh);
# - the shared fixtures ($DS4_FIXTURES, else ../shared/fixtures beside the workspace),
#   which cannot be fetched: checked here, a failure under CI when absent.
# Under CI (CI=true) a test whose model, fixture or tool is missing fails; elsewhere it
# prints a `skipped:` line, which .config/nextest.toml shows.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-test-models.sh
scripts/sdk-venv.sh
fixtures="${DS4_FIXTURES:-../shared/fixtures}"
missing=()
for f in llamacpp/smollm2-135m-instruct-q4_1.json sampler/sampler_cases.json tokenizer/ggml-vocab-qwen2.gguf; do
    [ -e "$fixtures/$f" ] || missing+=("$fixtures/$f")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "shared fixtures missing: ${missing[*]} (set DS4_FIXTURES or provide ../shared/fixtures)" >&2
    case "${CI:-}" in
        "" | 0 | false) echo "the tests that need them will skip" >&2 ;;
        *) exit 1 ;;
    esac
fi
