# DS4Server — the two commands a new user needs:
#   make chat   build the release binary, fetch the default model if absent, start a chat
#   make test   fetch the test models and SDKs if absent, then run the whole test suite
.PHONY: chat build models test-models nextest test-setup test lint

BIN := target/release/ds4-server

# `make test` reuses this build: crates/workspace-hack (kept by `cargo hakari generate`)
# gives the binary the same dependency features as the test suite's build.
build:
	cargo build --release --bin ds4-server

chat: build
	$(BIN) pull smollm2-135m
	$(BIN) chat

# The default model (SmolLM2-135M-Instruct, Apache-2.0) for users.
models: build
	$(BIN) pull smollm2-135m

# The real models the tests compare against llama.cpp (see ../shared/fixtures/llamacpp).
test-models:
	scripts/fetch-test-models.sh

nextest:
	@command -v cargo-nextest >/dev/null || { echo "make test needs cargo-nextest: cargo install cargo-nextest --locked"; exit 1; }

# The models, the SDKs and a check of the shared fixtures (see the script); under
# CI=true a test whose model or fixture is missing fails, elsewhere it skips visibly.
test-setup:
	scripts/test-setup.sh

test: nextest test-setup
	cargo nextest run --workspace --release --no-fail-fast
	cargo test --workspace --release --doc

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
