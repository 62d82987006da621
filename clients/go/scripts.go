package ratelimit

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/hex"
)

// The Lua twins of lua-reference/, copied into lua/ because go:embed cannot reach outside the
// module; scripts_test.go fails when a copy differs from its source.
//
//go:generate sh -c "cp ../../lua-reference/*.lua lua/"
//go:embed lua/*.lua
var luaFiles embed.FS

func lua(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic("ratelimit: embedded script missing: " + name)
	}
	return string(b)
}

var (
	scriptTokenBucket   = lua("token_bucket.lua")
	scriptLeakyBucket   = lua("leaky_bucket.lua")
	scriptFixedWindow   = lua("fixed_window.lua")
	scriptSlidingWindow = lua("sliding_window.lua")
	scriptSlidingLog    = lua("sliding_log.lua")
	scriptGCRA          = lua("gcra.lua")
	scriptAcquire       = lua("acquire.lua")
	scriptRelease       = lua("release.lua")
	scriptAll           = lua("all.lua")
	scriptSettle        = lua("settle.lua")

	// Library is the Functions library `ratelimit` (lua-reference/ratelimit.lua): one function
	// per command (rl_tokenbucket, rl_all, ...), loaded once with FUNCTION LOAD REPLACE (see
	// LoadLibrary), kept in the RDB and the AOF and replicated.
	Library = lua("ratelimit.lua")
)

// LibraryName is the name the Functions library registers (`#!lua name=ratelimit`).
const LibraryName = "ratelimit"

var shas = map[string]string{}

func init() {
	for _, s := range []string{scriptTokenBucket, scriptLeakyBucket, scriptFixedWindow,
		scriptSlidingWindow, scriptSlidingLog, scriptGCRA, scriptAcquire, scriptRelease,
		scriptAll, scriptSettle} {
		sum := sha1.Sum([]byte(s))
		shas[s] = hex.EncodeToString(sum[:])
	}
}

// LoadLibrary loads (or replaces) the Functions library on the server behind conn: FUNCTION
// LOAD REPLACE <Library>. A client in ModeAuto then calls its functions (FCALL) wherever the
// module is not loaded. On a cluster, load it on every master.
func LoadLibrary(ctx context.Context, conn Conn) error {
	_, err := do(ctx, conn, "FUNCTION", "LOAD", "REPLACE", Library)
	return err
}
