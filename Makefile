# Two commands matter: `make run` and `make test`. Both install what is missing first.
PORT ?= 6379
MODULE := target/release/libredis_rate_limiter.so
CARGO ?= cargo

# Debian packages: the server and CLI tools, and libclang for redis-module's bindgen.
APT_PACKAGES := redis-server redis-tools libclang-dev

.PHONY: deps build run test lint bench clean

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
