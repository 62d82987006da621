package tests

import (
	"context"
	"strconv"
	"testing"
	"time"

	"redis-rate-limiter/ratelimit"
)

// The rate helpers and the waits as durations, against the module with its clock stopped, so
// that every wait is exact; and the scripts, whose clock is the server's.

func TestPerSecondIsTheModulesGCRA(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true})
	a := admin(t, s)
	setClock(t, a, t0)
	ctx := context.Background()
	for _, mode := range []ratelimit.ModeChoice{ratelimit.ChooseModule, ratelimit.ChooseScript} {
		c := client(s, ratelimit.Options{Mode: mode})
		key := "rate:" + strconv.Itoa(int(mode))
		allowed := 0
		var denied ratelimit.Outcome
		for i := 0; i < 12; i++ {
			out, err := c.Allow(ctx, key, ratelimit.PerSecond(10))
			if err != nil || out.Degraded != ratelimit.NotDegraded {
				t.Fatalf("%v: %+v, %v", mode, out, err)
			}
			if out.Decision.Allowed {
				allowed++
			} else if !denied.Decision.Allowed && denied.Decision.Limit == 0 {
				denied = out
			}
		}
		if allowed != 10 || denied.Decision.Limit != 10 {
			t.Fatalf("%v: %d of 12 allowed, first denial %+v", mode, allowed, denied)
		}
		if mode == ratelimit.ChooseModule {
			// One emission interval (1 s / 10), the whole burst back in 1 s.
			if denied.RetryAfter() != 100*time.Millisecond || denied.ResetAfter() != time.Second {
				t.Fatalf("retry %v, reset %v (%+v)", denied.RetryAfter(), denied.ResetAfter(), denied.Decision)
			}
			// The same bytes as the GCRA it maps to: the same stored state.
			same, err := c.Check(ctx, key, ratelimit.GCRA{MaxBurst: 9, CountPerPeriod: 10, PeriodSec: 1}, 1)
			if err != nil || same.Decision != denied.Decision {
				t.Fatalf("GCRA{9, 10, 1}: %+v, %v; PerSecond(10): %+v", same.Decision, err, denied.Decision)
			}
		} else if d := denied.RetryAfter(); d <= 0 || d > 100*time.Millisecond {
			t.Fatalf("script mode: retry %v", d)
		}
	}
	// PerMinute through a Limiter, with a burst of 2: 2 at once, then one every 6 s.
	l := ratelimit.NewLimiter(client(s, ratelimit.Options{}), ratelimit.PerMinute(10).WithBurst(2))
	for i, want := range []bool{true, true, false} {
		out, err := l.Check(ctx, "rate:minute")
		if err != nil || out.Decision.Allowed != want {
			t.Fatalf("call %d: %+v, %v", i, out, err)
		}
		if !want && (out.RetryAfter() != 6*time.Second || out.Decision.Limit != 2) {
			t.Fatalf("call %d: retry %v, %+v", i, out.RetryAfter(), out.Decision)
		}
	}
	// A token bucket of the same rate.
	out, err := client(s, ratelimit.Options{}).AllowN(ctx, "rate:tb", ratelimit.PerSecond(4).TokenBucket(), 5)
	if err != nil || out.Decision.Allowed || out.Decision.RetryAfterMs != -1 || out.RetryAfter() != -time.Millisecond {
		t.Fatalf("5 of a bucket of 4: %+v, %v", out, err)
	}
}

func TestALeasesWaitIsOneCallAway(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true})
	a := admin(t, s)
	setClock(t, a, t0)
	ctx := context.Background()
	c := client(s, ratelimit.Options{})
	exports := ratelimit.Concurrency{Limit: 1, LeaseSec: 30}
	held, err := c.Acquire(ctx, "exports:acme", exports)
	if err != nil || held.Lease == nil || held.RetryAfter() != 0 {
		t.Fatalf("first: %+v, %v", held, err)
	}
	defer held.Lease.Release(ctx)
	advanceClock(t, a, 10_000_000) // 10 s into the lease
	full, err := c.Acquire(ctx, "exports:acme", exports)
	if err != nil || full.Lease != nil {
		t.Fatalf("second: %+v, %v", full, err)
	}
	if full.RetryAfter() != 20*time.Second ||
		full.RetryAfter() != time.Duration(full.Outcome.Decision.RetryAfterMs)*time.Millisecond {
		t.Fatalf("a slot frees in %v (%d ms)", full.RetryAfter(), full.Outcome.Decision.RetryAfterMs)
	}
}
