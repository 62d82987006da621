package tests

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// 200 goroutines, each on a connection of its own from the pool, race for a fresh key: exactly
// the limit is admitted, in every mode; the same for two limits in one call and for the slots
// of a concurrency limit. A limiter bug here is silent over-admission.
func TestTwoHundredGoroutinesAdmitExactlyTheLimit(t *testing.T) {
	s := start(t, serverOpts{module: true})
	loadLibrary(t, s)
	a := admin(t, s)
	const racers = 200
	race := func(f func() (bool, error)) int64 {
		var admitted int64
		var wg sync.WaitGroup
		ready := make(chan struct{})
		errs := make(chan error, racers)
		for i := 0; i < racers; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				ok, err := f()
				if err != nil {
					errs <- err
				} else if ok {
					atomic.AddInt64(&admitted, 1)
				}
			}()
		}
		close(ready)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		return admitted
	}
	ctx := context.Background()
	for _, mode := range []ratelimit.ModeChoice{ratelimit.ChooseModule, ratelimit.ChooseFunction,
		ratelimit.ChooseScript} {
		// A generous timeout: 200 connections are dialed at once.
		cl := client(s, ratelimit.Options{Mode: mode, Timeout: 5 * time.Second})
		check := func(key string, a ratelimit.Algorithm, limit int64) {
			got := race(func() (bool, error) {
				o, err := cl.Check(ctx, key, a, 1)
				if err == nil && o.Degraded != ratelimit.NotDegraded {
					err = fmt.Errorf("degraded: %+v", o)
				}
				return o.Decision.Allowed, err
			})
			if got != limit {
				t.Errorf("mode %d, %s: %d admitted, not %d", mode, a.Command(), got, limit)
			}
		}
		p := fmt.Sprintf("m%d:", mode)
		check(p+"tb", ratelimit.TokenBucket{Capacity: 37, RefillPerSec: 0.0001}, 37)
		check(p+"lb", ratelimit.LeakyBucket{Capacity: 41, LeakPerSec: 0.0001}, 41)
		check(p+"fw", ratelimit.FixedWindow{Limit: 50, WindowSec: 3600}, 50)
		check(p+"sw", ratelimit.SlidingWindow{Limit: 43, WindowSec: 3600}, 43)
		check(p+"sl", ratelimit.SlidingLog{Limit: 29, WindowSec: 3600}, 29)
		check(p+"gc", ratelimit.GCRA{MaxBurst: 30, CountPerPeriod: 1, PeriodSec: 3600}, 31)
		both := []ratelimit.Limit{
			{Key: "{" + p + "}:a", Algorithm: ratelimit.FixedWindow{Limit: 100, WindowSec: 3600}},
			{Key: "{" + p + "}:b", Algorithm: ratelimit.TokenBucket{Capacity: 23, RefillPerSec: 0.0001}},
		}
		got := race(func() (bool, error) {
			o, err := cl.CheckAll(ctx, both, 1)
			return o.Allowed, err
		})
		if got != 23 {
			t.Errorf("mode %d, RL.ALL: %d admitted, not 23", mode, got)
		}
		window, err := redis.String(a.Do("GET", "{"+p+"}:a"))
		// The window's value: its tag, then the count and the window's start.
		if err != nil || !strings.HasPrefix(window, "fw 23 ") {
			t.Errorf("mode %d: the window counted %q, not the 23 admitted (%v)", mode, window, err)
		}
		var mu sync.Mutex
		var leases []*ratelimit.Lease
		got = race(func() (bool, error) {
			o, err := cl.Acquire(ctx, p+"slots", ratelimit.Concurrency{Limit: 7, LeaseSec: 60})
			if o.Lease != nil {
				mu.Lock()
				leases = append(leases, o.Lease)
				mu.Unlock()
			}
			return o.Outcome.Decision.Allowed, err
		})
		if got != 7 || zcard(t, a, p+"slots") != 7 {
			t.Errorf("mode %d, leases: %d admitted, %d held, not 7", mode, got, zcard(t, a, p+"slots"))
		}
		for _, l := range leases {
			if freed, err := l.Release(ctx); err != nil || !freed {
				t.Errorf("release: %v %v", freed, err)
			}
		}
		if n := zcard(t, a, p+"slots"); n != 0 {
			t.Errorf("%d leases left after every release", n)
		}
	}
}
