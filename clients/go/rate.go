package ratelimit

import (
	"context"
	"time"
)

// Rate is a limit as go-redis/redis_rate's users write one: Rate calls per Period, Burst of them
// at once. It is an Algorithm: the module's GCRA (RL.GCRA key Burst-1 Rate Period), the
// algorithm redis_rate implements, so client.Allow(ctx, key, ratelimit.PerSecond(10)) reads as
// limiter.Allow(ctx, key, redis_rate.PerSecond(10)) does. The same rate in another algorithm:
// r.TokenBucket(), r.FixedWindow(), r.SlidingWindow(), r.SlidingLog().
type Rate struct {
	Rate int64
	// At most Burst at once (0: Rate).
	Burst  int64
	Period time.Duration
}

// PerSecond is rate calls per second, rate at once.
func PerSecond(rate int64) Rate { return Rate{Rate: rate, Burst: rate, Period: time.Second} }

// PerMinute is rate calls per minute, rate at once.
func PerMinute(rate int64) Rate { return Rate{Rate: rate, Burst: rate, Period: time.Minute} }

// PerHour is rate calls per hour, rate at once.
func PerHour(rate int64) Rate { return Rate{Rate: rate, Burst: rate, Period: time.Hour} }

// WithBurst is r with at most burst at once.
func (r Rate) WithBurst(burst int64) Rate {
	r.Burst = burst
	return r
}

func (r Rate) burst() int64 {
	if r.Burst == 0 {
		return r.Rate
	}
	return r.Burst
}

// GCRA is r as the module's GCRA: Burst at once (MaxBurst Burst-1), Rate per Period.
func (r Rate) GCRA() GCRA {
	return GCRA{MaxBurst: r.burst() - 1, CountPerPeriod: r.Rate, PeriodSec: r.Period.Seconds()}
}

// TokenBucket is r as a token bucket: Burst at once, refilled at Rate per Period.
func (r Rate) TokenBucket() TokenBucket {
	return TokenBucket{Capacity: r.burst(), RefillPerSec: float64(r.Rate) / r.Period.Seconds()}
}

// FixedWindow is Rate per window of Period.
func (r Rate) FixedWindow() FixedWindow {
	return FixedWindow{Limit: r.Rate, WindowSec: r.Period.Seconds()}
}

// SlidingWindow is Rate per rolling window of Period.
func (r Rate) SlidingWindow() SlidingWindow {
	return SlidingWindow{Limit: r.Rate, WindowSec: r.Period.Seconds()}
}

// SlidingLog is exactly Rate in any window of Period.
func (r Rate) SlidingLog() SlidingLog {
	return SlidingLog{Limit: r.Rate, WindowSec: r.Period.Seconds()}
}

func (r Rate) Command() string     { return r.GCRA().Command() }
func (r Rate) Keyword() string     { return r.GCRA().Keyword() }
func (r Rate) Params() []string    { return r.GCRA().Params() }
func (r Rate) Quota() int64        { return r.GCRA().Quota() }
func (r Rate) RatePerSec() float64 { return r.GCRA().RatePerSec() }
func (r Rate) WindowSecs() int64   { return r.GCRA().WindowSecs() }
func (r Rate) script() string      { return r.GCRA().script() }

// Allow is Check with a cost of 1: client.Allow(ctx, "user:42", ratelimit.PerSecond(10)).
func (c *Client) Allow(ctx context.Context, key string, a Algorithm) (Outcome, error) {
	return c.Check(ctx, key, a, 1)
}

// AllowN is Check with a cost of n.
func (c *Client) AllowN(ctx context.Context, key string, a Algorithm, n int64) (Outcome, error) {
	return c.Check(ctx, key, a, n)
}

// AllowAtMost is CheckUpto: as many of n units as are left now (at least 1), in one call;
// Outcome.Granted says how many (0 when denied), as redis_rate's AllowAtMost.
func (c *Client) AllowAtMost(ctx context.Context, key string, a Algorithm, n int64) (Outcome,
	error) {
	return c.CheckUpto(ctx, key, a, n)
}

// millis is a wait in milliseconds as a time.Duration (-1 ms stays -1 ms: never).
func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// RetryAfter is RetryAfterMs as a time.Duration: 0 when allowed, -1 ms when the cost can never
// be admitted.
func (d Decision) RetryAfter() time.Duration { return millis(d.RetryAfterMs) }

// ResetAfter is ResetAfterMs as a time.Duration.
func (d Decision) ResetAfter() time.Duration { return millis(d.ResetAfterMs) }

// RetryAfter is Decision.RetryAfter().
func (o Outcome) RetryAfter() time.Duration { return o.Decision.RetryAfter() }

// ResetAfter is Decision.ResetAfter().
func (o Outcome) ResetAfter() time.Duration { return o.Decision.ResetAfter() }

// RetryAfter is the wait of the limit that denied (0 when allowed).
func (o MultiOutcome) RetryAfter() time.Duration {
	if o.Allowed || o.DeniedBy < 1 || o.DeniedBy > len(o.Decisions) {
		return 0
	}
	return o.Decisions[o.DeniedBy-1].RetryAfter()
}

// RetryAfter is how long until a slot frees when denied (0 when admitted):
// o.Outcome.Decision.RetryAfter().
func (o LeaseOutcome) RetryAfter() time.Duration { return o.Outcome.RetryAfter() }

// RetryAfter is the wait of the limit that denied (0 when admitted).
func (o MultiLeaseOutcome) RetryAfter() time.Duration { return o.Outcome.RetryAfter() }

// RetryAfter is how long until the estimate fits when denied (0 when admitted).
func (o ReservationOutcome) RetryAfter() time.Duration { return o.Outcome.RetryAfter() }

// RetryAfter is the wait of the limit that denied (0 when admitted).
func (o MultiReservationOutcome) RetryAfter() time.Duration { return o.Outcome.RetryAfter() }
