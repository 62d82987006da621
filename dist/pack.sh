#!/usr/bin/env bash
# Packs a release: the module, its SHA-256, the Lua twins, a redis.conf snippet, the licence and
# the README, in one directory and one tarball.
#
#   dist/pack.sh MODULE.so OUT_DIR   ->  OUT_DIR/redis-rate-limiter-<version>-<arch>-linux.tar.gz
set -euo pipefail
module=$1
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
name="redis-rate-limiter-$version-$(uname -m)-linux"
stage="$out/$name"
rm -rf "$stage" "$out/$name.tar.gz"
mkdir -p "$stage/lua"
cp "$module" "$stage/libredis_rate_limiter.so"
cp "$root"/lua-reference/*.lua "$stage/lua/"
cp "$root/dist/redis.conf" "$root/LICENSE" "$root/README.md" "$stage/"
(cd "$stage" && sha256sum libredis_rate_limiter.so lua/*.lua > SHA256SUMS)
tar -C "$out" -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz"
