package ratelimit

import (
	"math"
	"sort"
	"sync"
	"time"
)

// The in-process fallback of the Local policy, used while Redis cannot answer: a token bucket
// per key with the limit and the rate divided by the expected number of instances (settled
// reservations give tokens back or take more, into debt if need be), and for concurrency
// limits a counting semaphore per key with the limit divided alike, whose leases expire as on
// Redis.

const localMaxKeys = 100_000

type bucket struct {
	tokens float64
	at     time.Time
}

type localLimiter struct {
	mu      sync.Mutex
	buckets map[string]bucket
}

func newLocalLimiter() *localLimiter {
	return &localLimiter{buckets: map[string]bucket{}}
}

// share is the capacity and rate of the local share of a for instances instances.
func share(a Algorithm, instances int) (int64, float64) {
	n := int64(instances)
	if n < 1 {
		n = 1
	}
	capacity := a.Quota() / n
	if capacity < 1 {
		capacity = 1
	}
	return capacity, a.RatePerSec() / float64(n)
}

// clampInt converts a float to int64 the way Rust's `as` does: saturating, NaN as 0.
func clampInt(f float64) int64 {
	switch {
	case f != f:
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	case f <= math.MinInt64:
		return math.MinInt64
	}
	return int64(f)
}

// clampUint is clampInt for values that cannot be negative (Rust's `as u64`).
func clampUint(f float64) int64 {
	if f < 0 {
		return 0
	}
	return clampInt(f)
}

func (l *localLimiter) check(key string, a Algorithm, instances int, cost int64) Decision {
	capacity, rate := share(a, instances)
	cap := float64(capacity)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, known := l.buckets[key]; !known && len(l.buckets) >= localMaxKeys {
		for k, b := range l.buckets {
			if b.tokens+now.Sub(b.at).Seconds()*rate >= cap {
				delete(l.buckets, k)
			}
		}
	}
	b, known := l.buckets[key]
	if !known {
		b = bucket{cap, now}
		l.buckets[key] = b
	}
	tokens := math.Min(cap, b.tokens+now.Sub(b.at).Seconds()*rate)
	c := float64(cost)
	allowed := c <= tokens
	left := tokens
	if allowed && cost > 0 {
		left = tokens - c
		l.buckets[key] = bucket{left, now}
	}
	var retry int64
	switch {
	case allowed:
	case cost > capacity:
		retry = -1
	default:
		retry = clampInt(math.Ceil((c - tokens) * 1000 / rate))
	}
	return Decision{
		Allowed:      allowed,
		Remaining:    clampUint(math.Floor(left)),
		RetryAfterMs: retry,
		ResetAfterMs: clampUint(math.Ceil((cap - left) * 1000 / rate)),
		Limit:        capacity,
	}
}

// grant is a partial grant from the in-process bucket: what it has left (whole units), at most
// n; nothing left is the denial of one unit. The units granted (0 when denied).
func (l *localLimiter) grant(key string, a Algorithm, instances int, n int64) (Decision, int64) {
	g := l.check(key, a, instances, 0).Remaining
	if g > n {
		g = n
	}
	if g < 1 {
		g = 1
	}
	d := l.check(key, a, instances, g)
	if !d.Allowed {
		return d, 0
	}
	return d, g
}

// adjust gives back -delta tokens (never above the capacity) or takes delta more, below zero if
// need be, down to minus the capacity (as the module's token bucket): a bucket in debt denies
// until it has refilled past it.
func (l *localLimiter) adjust(key string, a Algorithm, instances int, delta int64) Decision {
	capacity, rate := share(a, instances)
	cap := float64(capacity)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, known := l.buckets[key]
	if !known {
		b = bucket{cap, now}
		l.buckets[key] = b
	}
	tokens := math.Min(cap, b.tokens+now.Sub(b.at).Seconds()*rate)
	left := math.Max(-cap, math.Min(cap, tokens-float64(delta)))
	if delta != 0 {
		l.buckets[key] = bucket{left, now}
	}
	return Decision{
		Allowed:      true,
		Remaining:    clampUint(math.Floor(math.Max(left, 0))),
		ResetAfterMs: clampUint(math.Ceil((cap - left) * 1000 / rate)),
		Limit:        capacity,
	}
}

// msUntil is the whole milliseconds from now to t, rounded up, 0 if past.
func msUntil(t, now time.Time) int64 {
	d := t.Sub(now)
	if d <= 0 {
		return 0
	}
	us := d.Microseconds()
	return (us + 999) / 1000
}

// localLeases holds the live leases per key: lease id -> expiry.
type localLeases struct {
	mu   sync.Mutex
	keys map[string]map[string]time.Time
}

func newLocalLeases() *localLeases {
	return &localLeases{keys: map[string]map[string]time.Time{}}
}

func leaseShare(c Concurrency, instances int) int64 {
	n := int64(instances)
	if n < 1 {
		n = 1
	}
	s := c.Limit / n
	if s < 1 {
		s = 1
	}
	return s
}

// acquire takes (or renews) a slot of key for id; with take false it only says whether it would.
func (l *localLeases) acquire(key, id string, c Concurrency, instances int, take bool) Decision {
	share := leaseShare(c, instances)
	lease := time.Duration(0)
	if c.LeaseSec > 0 && c.LeaseSec < math.MaxInt64/float64(time.Second) {
		lease = time.Duration(c.LeaseSec * float64(time.Second))
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, known := l.keys[key]; !known && len(l.keys) >= localMaxKeys {
		for k, leases := range l.keys {
			live := false
			for _, t := range leases {
				live = live || t.After(now)
			}
			if !live {
				delete(l.keys, k)
			}
		}
	}
	leases := l.keys[key]
	if leases == nil {
		leases = map[string]time.Time{}
		l.keys[key] = leases
	}
	for k, t := range leases {
		if !t.After(now) {
			delete(leases, k)
		}
	}
	_, held := leases[id]
	allowed := held || int64(len(leases)) < share
	if allowed && take {
		leases[id] = now.Add(lease)
	}
	expiries := make([]time.Time, 0, len(leases))
	for _, t := range leases {
		expiries = append(expiries, t)
	}
	sort.Slice(expiries, func(i, j int) bool { return expiries[i].Before(expiries[j]) })
	live := int64(len(expiries))
	var retry int64
	if !allowed {
		// The slot frees when live - share + 1 leases have expired.
		if i := live - share; i >= 0 && i < live {
			retry = msUntil(expiries[i], now)
		}
	}
	d := Decision{Allowed: allowed, RetryAfterMs: retry, Limit: share}
	if share > live {
		d.Remaining = share - live
	}
	if live > 0 {
		d.ResetAfterMs = msUntil(expiries[live-1], now)
	}
	if len(leases) == 0 {
		delete(l.keys, key)
	}
	return d
}

// release frees id's slot of key; whether it held a live one.
func (l *localLeases) release(key, id string) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	leases := l.keys[key]
	if leases == nil {
		return false
	}
	t, ok := leases[id]
	delete(leases, id)
	for k, e := range leases {
		if !e.After(now) {
			delete(leases, k)
		}
	}
	if len(leases) == 0 {
		delete(l.keys, key)
	}
	return ok && t.After(now)
}
