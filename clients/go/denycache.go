package ratelimit

import (
	"strconv"
	"strings"
	"sync"
	"time"
)

// The deny cache: after Redis denied a check with RetryAfterMs R, the same check (the same
// limits, keys, parameters and cost) is denied in the process until R has passed on the
// monotonic clock, without a call to Redis.
//
// It can only deny more than Redis would, never admit: what changes the key meanwhile (another
// process refunding, a limit raised, a window ending sooner by the server's clock than by this
// one) is seen at most R later. Entries are counted from the moment the denied call was sent, so
// an entry never outlives the server's own R. When it expires, one check asks Redis (a probe)
// while the others are still answered from it, for at most the client's timeout: a key denied
// again costs one call per R, not one per caller waiting at that moment.

type denied struct {
	// A check is asking Redis since the entry expired, until until (moved on by the timeout).
	probing bool
	// When the denied call was sent.
	sent    time.Time
	until   time.Time
	outcome MultiOutcome
}

// denyCache is a fixed number of denials, the least recently used evicted first.
type denyCache struct {
	mu       sync.Mutex
	entries  *lru[denied]
	capacity int
	// How long one probe may take (the client's timeout).
	probe time.Duration
}

func newDenyCache(capacity int, probe time.Duration) *denyCache {
	if capacity < 1 {
		capacity = 1
	}
	return &denyCache{entries: newLRU[denied](capacity), capacity: capacity, probe: probe}
}

func (d *denyCache) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.entries.len()
}

// lookup is the denial standing for sig at cost, its waits counted down to now (at least 1 ms).
// The first check after the entry expired gets none and asks Redis: the entry answers the others
// until that answer is recorded or the probe's time is up (then it is dropped).
func (d *denyCache) lookup(sig string, cost int64) (MultiOutcome, bool) {
	now := time.Now()
	key := entryKey(sig, cost)
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.entries.get(key)
	if !ok {
		return MultiOutcome{}, false
	}
	if !now.Before(e.until) {
		if e.probing {
			d.entries.remove(key)
		} else {
			e.probing = true
			e.until = now.Add(d.probe)
		}
		return MultiOutcome{}, false
	}
	// Whole milliseconds gone since the denial (rounded down): the waits are rounded up.
	gone := now.Sub(e.sent).Milliseconds()
	o := e.outcome
	o.Decisions = append([]Decision(nil), o.Decisions...)
	for i := range o.Decisions {
		x := &o.Decisions[i]
		if x.RetryAfterMs > 0 {
			x.RetryAfterMs -= gone
			if x.RetryAfterMs < 1 {
				x.RetryAfterMs = 1
			}
		}
		x.ResetAfterMs -= gone
		if x.ResetAfterMs < 0 {
			x.ResetAfterMs = 0
		}
	}
	o.Granted = 0
	o.AnsweredLocally = LocalDenyCache
	return o, true
}

// record remembers a denial that Redis answered (not one of the failure policy, nor one answered
// locally) whose wait is known and above 0; sent is when its call was sent. An admission by
// Redis (a probe's answer) drops the entry if it leaves the cost; if it leaves less (the next
// check would be denied, its wait unknown), the next check probes again, the others still
// answered from the entry meanwhile.
func (d *denyCache) record(sig string, cost int64, o MultiOutcome, sent time.Time) {
	if o.Degraded != NotDegraded || o.AnsweredLocally != NotLocal {
		return
	}
	key := entryKey(sig, cost)
	if o.Allowed {
		left := int64(0)
		for i, x := range o.Decisions {
			if i == 0 || x.Remaining < left {
				left = x.Remaining
			}
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		if left >= cost {
			d.entries.remove(key)
		} else if e, ok := d.entries.get(key); ok {
			e.probing = false
			e.until = time.Now()
		}
		return
	}
	i := o.DeniedBy
	if i < 1 {
		i = 1
	}
	if i > len(o.Decisions) {
		return
	}
	wait := o.Decisions[i-1].RetryAfterMs
	if wait <= 0 {
		// -1: never admitted at this cost; not kept.
		return
	}
	o.Decisions = append([]Decision(nil), o.Decisions...)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries.insert(key, denied{sent: sent, until: sent.Add(time.Duration(wait) * time.Millisecond),
		outcome: o})
}

// until is when the entry of sig at cost expires (or its probe's time is up), if there is one.
func (d *denyCache) until(sig string, cost int64) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.entries.get(entryKey(sig, cost))
	if !ok {
		return time.Time{}, false
	}
	return e.until, true
}

// entryKey is one entry per call: the limits' signature and the cost.
func entryKey(sig string, cost int64) string {
	return sig + "cost " + strconv.FormatInt(cost, 10)
}

// signature is the key of a table entry: the keys, algorithms and parameters of the limits, in
// order.
func signature(limits []Limit) string {
	var b strings.Builder
	for _, l := range limits {
		b.WriteString(strconv.Itoa(len(l.Key)))
		b.WriteByte(':')
		b.WriteString(l.Key)
		b.WriteByte(' ')
		b.WriteString(l.Algorithm.Keyword())
		for _, p := range l.Algorithm.Params() {
			b.WriteByte(' ')
			b.WriteString(p)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
