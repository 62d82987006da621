#!/usr/bin/env bash
# Packs a release: the module, its SHA-256, the Lua twins, a redis.conf snippet, the licence and
# the README, in one directory and one tarball; with a third argument, the rate limit service
# for Envoy too (ratelimit-rls, with its example configuration in rls/config/, docs/rls.md).
#
#   dist/pack.sh MODULE.so OUT_DIR [RATELIMIT_RLS]
#     ->  OUT_DIR/redis-rate-limiter-<version>-<arch>-linux.tar.gz
#
# `make dist` gives it the binaries built against glibc 2.17 (tests/release.rs checks them).
set -euo pipefail
module=$1
out=$2
rls=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
name="redis-rate-limiter-$version-$(uname -m)-linux"
stage="$out/$name"
rm -rf "$stage" "$out/$name.tar.gz"
mkdir -p "$stage/lua"
cp "$module" "$stage/libredis_rate_limiter.so"
cp "$root"/lua-reference/*.lua "$stage/lua/"
cp "$root/dist/redis.conf" "$root/LICENSE" "$root/README.md" "$stage/"
binaries=(libredis_rate_limiter.so)
if [ -n "$rls" ]; then
	cp "$rls" "$stage/ratelimit-rls"
	mkdir -p "$stage/rls/config"
	cp "$root/rls/examples/config/config.yaml" "$stage/rls/config/"
	cp "$root/docs/rls.md" "$stage/rls/"
	binaries+=(ratelimit-rls)
fi
(cd "$stage" && sha256sum "${binaries[@]}" lua/*.lua > SHA256SUMS)
tar -C "$out" -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz"
