package tests

import (
	"context"
	"testing"
	"time"

	"redis-rate-limiter/ratelimit"
)

// What a check costs the client beyond the bare command (benches/clients/go.go measures the time).

// A check through the adapter (on the caller's goroutine) allocates what the bare command does
// through it and two more: the argument vector and the key in it (the limiter's other words are
// made once per client). Watched from a goroutine, it allocates more (the goroutine, its
// channel, the context's timer).
func TestACheckAllocatesTheBareCommandAndItsArguments(t *testing.T) {
	s := start(t, serverOpts{module: true})
	p := pool(s.addr())
	ctx := context.Background()
	var bucket ratelimit.Algorithm = ratelimit.TokenBucket{Capacity: 1e15, RefillPerSec: 1e15}
	direct := ratelimit.New(Redigo{p}, ratelimit.Options{})
	watched := ratelimit.New(Watched{p}, ratelimit.Options{})
	for _, c := range []*ratelimit.Client{direct, watched} {
		if o, err := c.Check(ctx, "k", bucket, 1); err != nil || o.Degraded != ratelimit.NotDegraded {
			t.Fatalf("%+v %v", o, err)
		}
	}
	bare := testing.AllocsPerRun(200, func() {
		_, _ = Redigo{p}.DoBy(ctx, time.Now().Add(time.Second), "RL.TOKENBUCKET", "k",
			"1000000000000000", "1000000000000000", "1")
	})
	check := testing.AllocsPerRun(200, func() { _, _ = direct.Check(ctx, "k", bucket, 1) })
	slow := testing.AllocsPerRun(200, func() { _, _ = watched.Check(ctx, "k", bucket, 1) })
	t.Logf("allocations per call: bare command %v, check %v, check watched %v", bare, check, slow)
	if check != bare+2 || slow <= check {
		t.Fatalf("allocations per call: bare command %v, check %v, check watched %v", bare, check,
			slow)
	}
}
