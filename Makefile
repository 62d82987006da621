# Two commands matter: `make run` and `make test`. Both install what is missing first.
PORT ?= 6379
MODULE := target/release/libredis_rate_limiter.so
CARGO ?= cargo

# Debian packages: the server and CLI tools, and libclang for redis-module's bindgen.
APT_PACKAGES := redis-server redis-tools libclang-dev

.PHONY: deps build run test check-containers soak lint bench clean

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

test: deps check-containers
	$(CARGO) test --all-targets

# The container backend of the tests (`--features containers`) runs only where a Docker engine
# is; compiling it here keeps it from rotting.
check-containers: deps
	$(CARGO) check --tests --features containers

# Long variants: a million keys, and the differential suites with 10x more generated calls.
soak: deps
	RL_DIFF_SCALE=10 $(CARGO) test --release --all-targets -- --include-ignored

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features containers -- -D warnings

clean:
	$(CARGO) clean
