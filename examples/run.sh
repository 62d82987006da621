#!/usr/bin/env bash
# Runs each example (Python, Node.js) against a server with the module and against one without
# it (the Lua path); each must print exactly examples/expected.txt, whose first line names the
# path taken. Go's examples are the Go package's own (clients/go/tests/example_test.go, run by
# make test-go).
#
#   examples/run.sh [MODULE.so]      (RL_REDIS_SERVER picks the server binary)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
module=$(realpath "${1:-$root/target/debug/libredis_rate_limiter.so}")
server=${RL_REDIS_SERVER:-redis-server}
work=$(mktemp -d)
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work" || true
  exit "$status"
}
trap cleanup EXIT

# The language dependencies, each pinned: redis-py from PyPI, node-redis from npm (its lock
# file).
venv=$root/.examples/venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -c 'import redis' 2>/dev/null || "$venv/bin/pip" install -q redis==8.1.0
(cd "$root/examples/node" && [ -d node_modules ] || npm ci --no-audit --no-fund --silent)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start() {
  local port=$1; shift
  "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    --logfile "$work/$port.log" "$@" &
  pids+=($!)
  for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server on $port did not start" >&2; cat "$work/$port.log" >&2; exit 1
}

with=$(free_port); start "$with" --loadmodule "$module"
without=$(free_port); start "$without"

failed=0
for path in module lua; do
  port=$with; [ "$path" = lua ] && port=$without
  expected=$(sed "1s/.*/path: $path/" "$root/examples/expected.txt")
  for example in python node; do
    case $example in
      python) cmd=("$venv/bin/python" "$root/examples/python/seed.py") ;;
      node) cmd=(node "$root/examples/node/seed.js") ;;
    esac
    got=$(REDIS_URL="redis://127.0.0.1:$port" "${cmd[@]}" 2>&1) || true
    if [ "$got" = "$expected" ]; then
      echo "ok: $example ($path)"
    else
      echo "FAILED: $example ($path)"; diff <(echo "$expected") <(echo "$got") || true
      failed=1
    fi
  done
done
exit $failed
