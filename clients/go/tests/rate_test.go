package tests

import (
	"context"
	"errors"
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

// AllowAtMost (redis_rate's name for CheckUpto): as many of n as are left, Granted says how many.
func TestAllowAtMostGrantsWhatIsLeft(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true})
	a := admin(t, s)
	setClock(t, a, t0)
	ctx := context.Background()
	c := client(s, ratelimit.Options{})
	type want struct {
		n, granted, remaining, retryMs int64
		allowed                        bool
	}
	for i, w := range []want{{4, 4, 6, 0, true}, {100, 6, 0, 0, true}, {1, 0, 0, 100, false}} {
		out, err := c.AllowAtMost(ctx, "atmost", ratelimit.PerSecond(10), w.n)
		if err != nil || out.Granted != w.granted || out.Decision.Allowed != w.allowed ||
			out.Decision.Remaining != w.remaining || out.Decision.RetryAfterMs != w.retryMs ||
			out.Decision.Limit != 10 || out.Mode != ratelimit.ModeModule {
			t.Fatalf("call %d (at most %d): %+v, %v", i, w.n, out, err)
		}
	}
	// A plain check carries Granted too: its cost when admitted, 0 when denied.
	if out, err := c.AllowN(ctx, "atmost:plain", ratelimit.PerSecond(10), 3); err != nil || out.Granted != 3 {
		t.Fatalf("AllowN 3: %+v, %v", out, err)
	}
	if out, err := c.AllowN(ctx, "atmost:plain", ratelimit.PerSecond(10), 8); err != nil || out.Granted != 0 ||
		out.Decision.Allowed {
		t.Fatalf("AllowN 8 of 7 left: %+v, %v", out, err)
	}
	// Refused before sending: n of 0, a concurrency limit.
	var u *ratelimit.UnsupportedError
	if _, err := c.AllowAtMost(ctx, "atmost", ratelimit.PerSecond(10), 0); !errors.As(err, &u) {
		t.Fatalf("n of 0: %v", err)
	}
	if _, err := c.CheckUpto(ctx, "atmost:c", ratelimit.Concurrency{Limit: 2, LeaseSec: 1}, 2); !errors.As(err, &u) {
		t.Fatalf("concurrency: %v", err)
	}
	// Redis unreachable: FailOpen grants n, FailClosed none.
	open, err := closedPort(ratelimit.Options{}).CheckUpto(ctx, "k", ratelimit.PerSecond(10), 7)
	if err != nil || open.Granted != 7 || !open.Decision.Allowed || open.Degraded != ratelimit.DegradedFailOpen {
		t.Fatalf("fail-open: %+v, %v", open, err)
	}
	closed, err := closedPort(ratelimit.Options{Policy: ratelimit.FailClosed}).CheckAllUpto(ctx,
		[]ratelimit.Limit{{Key: "{k}:a", Algorithm: ratelimit.PerSecond(10)}, {Key: "{k}:b", Algorithm: ratelimit.PerSecond(5)}}, 7)
	if err != nil || closed.Granted != 0 || closed.Allowed || closed.DeniedBy != 1 ||
		closed.Degraded != ratelimit.DegradedFailClosed {
		t.Fatalf("fail-closed: %+v, %v", closed, err)
	}
}
