# Two commands matter: `make run` and `make test`. Both install what is missing first.
PORT ?= 6379
MODULE := target/release/libredis_rate_limiter.so
CARGO ?= cargo

# Debian packages: the server and CLI tools, and libclang for redis-module's bindgen.
APT_PACKAGES := redis-server redis-tools libclang-dev

.PHONY: deps build run test soak fuzz fuzz-deps lint bench clean

deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v redis-benchmark >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi
	@# Debian starts a redis-server service on install; the tests start their own servers.
	@if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server >/dev/null 2>&1 || true; fi

build: deps
	$(CARGO) build --release

run: build
	redis-server --port $(PORT) --bind 127.0.0.1 --save "" --appendonly no \
		--loadmodule $(CURDIR)/$(MODULE)

test: deps
	$(CARGO) test --all-targets
	$(MAKE) fuzz FUZZ_SECONDS=15

# Long variants: a million keys, and the differential suites with 10x more generated calls.
soak: deps
	RL_DIFF_SCALE=10 $(CARGO) test --release --all-targets -- --include-ignored

# Coverage-guided fuzzing (libFuzzer via cargo-fuzz) of every argument parser, stored-value reader
# and decision path. Stable Rust: no sanitizer, panics and assertion failures are the findings.
FUZZ_SECONDS ?= 300
FUZZ_TARGETS := arguments decisions

fuzz-deps:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz

fuzz: deps fuzz-deps
	cd fuzz && $(CARGO) fuzz build --sanitizer none -O
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		$(CARGO) fuzz run --sanitizer none -O $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

# Micro-benchmarks of the pure core (criterion), then the server benchmark (module vs Lua twin vs
# HSET, 3-4 minutes). `make bench BENCH_ARGS=--quick` for a short run.
BENCH_TARGET := $(or $(CARGO_TARGET_DIR),target)
BENCH_ARGS ?=

bench: deps
	$(CARGO) build --release
	$(CARGO) bench --bench core -- --warm-up-time 1 --measurement-time 2
	python3 benches/server_bench.py --module $(BENCH_TARGET)/release/libredis_rate_limiter.so \
		--criterion-dir $(BENCH_TARGET)/criterion $(BENCH_ARGS)

clean:
	$(CARGO) clean
