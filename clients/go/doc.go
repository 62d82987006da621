// Package ratelimit is the Go client of the redis-rate-limiter module: the module's native
// limiters (RL.TOKENBUCKET, RL.LEAKYBUCKET, RL.FIXEDWINDOW, RL.SLIDINGWINDOW, RL.SLIDINGLOG,
// RL.GCRA), several limits in one call (RL.ALL), concurrency leases (RL.ACQUIRE, RL.RELEASE),
// reservations settled with their actual cost (RL.SETTLE) and the most-denied keys (RL.TOP),
// with the same decisions, byte for byte, where the module cannot be loaded: through the
// Functions library `ratelimit` when it is loaded, else through the Lua scripts of
// lua-reference/, embedded in the package.
//
// The package uses only the standard library. It talks to Redis through Conn: a redigo pool
// through the adapter that comes with it (redis-rate-limiter/ratelimit/redigoadapter), a go-redis
// client or another through an adapter of a few lines (see Conn).
//
//	client := ratelimit.New(redigoadapter.New(pool), ratelimit.Options{Policy: ratelimit.Local(4)})
//	out, err := client.Check(ctx, "user:42", ratelimit.TokenBucket{Capacity: 10, RefillPerSec: 5}, 1)
//	if err == nil && !out.Decision.Allowed {
//		time.Sleep(out.RetryAfter()) // out.Decision.RetryAfterMs in ms
//	}
//
// Every call has a deadline (Options.Timeout, and the context's); when Redis cannot answer the
// failure policy decides (FailOpen, FailClosed, or Local: in-process buckets with the limit
// divided by the number of instances) and the outcome says so (Outcome.Degraded); a circuit
// breaker spares the timeout while Redis is down. Errors about the call itself and refusals
// that retrying cannot fix (NOPERM, NOAUTH, OOM, READONLY) are returned as a *RejectedError,
// never answered by the policy.
//
// Middleware is net/http middleware: limits per plan and route class, the IETF RateLimit-Policy
// and RateLimit response fields, 429 with Retry-After and problem+json, concurrency limits on
// requests in flight, estimates settled with the cost the handler reports, shadow policies and
// counters in Prometheus's text format.
//
// The Rust crate of the same repository (clients/rust) is its first implementation; both replay
// the table of clients/conformance/ against real servers, and docs/clients.md describes what
// every client of the module does.
package ratelimit
