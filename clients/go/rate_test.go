package ratelimit

import (
	"reflect"
	"testing"
	"time"
)

func TestRateHelpersAreTheModulesAlgorithms(t *testing.T) {
	cases := []struct {
		r      Rate
		params []string
		quota  int64
	}{
		{PerSecond(10), []string{"9", "10", "1"}, 10},
		{PerMinute(100), []string{"99", "100", "60"}, 100},
		{PerHour(5), []string{"4", "5", "3600"}, 5},
		{PerSecond(10).WithBurst(30), []string{"29", "10", "1"}, 30},
		{Rate{Rate: 3, Period: 500 * time.Millisecond}, []string{"2", "3", "0.5"}, 3},
	}
	for _, c := range cases {
		if c.r.Command() != "RL.GCRA" || c.r.Keyword() != "GCRA" ||
			!reflect.DeepEqual(c.r.Params(), c.params) || c.r.Quota() != c.quota {
			t.Errorf("%+v: %s %s %v %d", c.r, c.r.Command(), c.r.Keyword(), c.r.Params(), c.r.Quota())
		}
		if c.r.script() != scriptGCRA {
			t.Errorf("%+v: not the GCRA script", c.r)
		}
	}
	r := PerMinute(120)
	if got := r.TokenBucket(); got != (TokenBucket{Capacity: 120, RefillPerSec: 2}) {
		t.Errorf("TokenBucket: %+v", got)
	}
	if got := r.FixedWindow(); got != (FixedWindow{Limit: 120, WindowSec: 60}) {
		t.Errorf("FixedWindow: %+v", got)
	}
	if got := r.SlidingWindow(); got != (SlidingWindow{Limit: 120, WindowSec: 60}) {
		t.Errorf("SlidingWindow: %+v", got)
	}
	if got := r.SlidingLog(); got != (SlidingLog{Limit: 120, WindowSec: 60}) {
		t.Errorf("SlidingLog: %+v", got)
	}
	if r.RatePerSec() != 2 || r.WindowSecs() != 60 {
		t.Errorf("rate %v, window %d", r.RatePerSec(), r.WindowSecs())
	}
}

func TestWaitsAsDurations(t *testing.T) {
	d := Decision{Allowed: false, RetryAfterMs: 250, ResetAfterMs: 1500}
	if d.RetryAfter() != 250*time.Millisecond || d.ResetAfter() != 1500*time.Millisecond {
		t.Fatalf("%v %v", d.RetryAfter(), d.ResetAfter())
	}
	if never := (Decision{RetryAfterMs: -1}).RetryAfter(); never != -time.Millisecond {
		t.Fatalf("never: %v", never)
	}
	o := Outcome{Decision: d}
	if o.RetryAfter() != 250*time.Millisecond || o.ResetAfter() != 1500*time.Millisecond {
		t.Fatalf("outcome: %v %v", o.RetryAfter(), o.ResetAfter())
	}
	if (LeaseOutcome{Outcome: o}).RetryAfter() != 250*time.Millisecond ||
		(ReservationOutcome{Outcome: o}).RetryAfter() != 250*time.Millisecond {
		t.Fatal("lease or reservation outcome")
	}
	m := MultiOutcome{Allowed: false, DeniedBy: 2,
		Decisions: []Decision{{Allowed: true, RetryAfterMs: 0}, {RetryAfterMs: 700}}}
	if m.RetryAfter() != 700*time.Millisecond ||
		(MultiLeaseOutcome{Outcome: m}).RetryAfter() != 700*time.Millisecond ||
		(MultiReservationOutcome{Outcome: m}).RetryAfter() != 700*time.Millisecond {
		t.Fatalf("multi: %v", m.RetryAfter())
	}
	if (MultiOutcome{Allowed: true, Decisions: m.Decisions}).RetryAfter() != 0 {
		t.Fatal("allowed multi")
	}
}
