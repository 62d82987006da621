package ratelimit

import (
	"context"
	"sync"
	"time"
)

// LeaseOutcome is the answer to Client.Acquire: the outcome, and the lease when admitted.
type LeaseOutcome struct {
	Outcome Outcome
	// Lease is set exactly when admitted.
	Lease *Lease
}

// MultiLeaseOutcome is the answer to Client.AcquireAll: the outcome of every limit, and the
// lease holding the concurrency limits' slots when admitted.
type MultiLeaseOutcome struct {
	Outcome MultiOutcome
	// Lease is set when admitted with a cost above 0 and at least one concurrency limit.
	Lease *Lease
}

type leaseLimit struct {
	key   string
	limit Concurrency
}

// Lease is a slot held on one key (or one on each concurrency limit of Client.AcquireAll) under
// one lease id, until the lease expires or Release gives it back. Go has no destructors: call
// Release when the work ends (defer lease.Release(ctx)), or the slot stays taken until the
// lease expires. Safe for concurrent use.
type Lease struct {
	client *Client
	id     string
	limits []leaseLimit

	mu sync.Mutex
	// Where the slots are held: on Redis, in the in-process semaphore of the Local policy, or
	// nowhere (admitted by FailOpen); a renewal may add a place.
	redis, local, released bool
	lastRenewal            *Outcome
	stop                   chan struct{}
	// Renewals on their way and their requests (until the connection has returned from
	// them); drained is closed when the last ends after a release began.
	renewing int
	drained  chan struct{}
}

func newLease(c *Client, id string, limits []leaseLimit, degraded Degraded) *Lease {
	return &Lease{client: c, id: id, limits: limits, redis: degraded == NotDegraded,
		local: degraded == DegradedLocal}
}

// ID is the lease id (the sorted set's member).
func (l *Lease) ID() string { return l.id }

// Key is the key the slot is held on (the first, for a lease over several keys).
func (l *Lease) Key() string { return l.limits[0].key }

// HoldsSlot says whether a slot is held anywhere (false for a lease admitted by FailOpen and not
// renewed on Redis since, and once released).
func (l *Lease) HoldsSlot() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return (l.redis || l.local) && !l.released
}

func (l *Lease) begin() {
	l.mu.Lock()
	l.renewing++
	l.mu.Unlock()
}

func (l *Lease) end() {
	l.mu.Lock()
	l.renewing--
	if l.renewing == 0 && l.drained != nil {
		close(l.drained)
		l.drained = nil
	}
	l.mu.Unlock()
}

// Renew extends the lease to now + lease_sec by sending RL.ACQUIRE again with the same id. A
// lease that had expired meanwhile takes a slot again if one is free; denied means the slot is
// lost (others hold every slot). Over several keys: the first denial, else the key with the
// fewest free slots. The failure policy answers as for Client.Acquire. A lease whose release
// has begun is not renewed (an *UnsupportedError, nothing sent).
func (l *Lease) Renew(ctx context.Context) (Outcome, error) {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return Outcome{}, unsupported("a released lease is not renewed")
	}
	l.renewing++
	l.mu.Unlock()
	defer l.end()
	ctx = trackRequests(ctx, l)
	var answer *Outcome
	for _, ll := range l.limits {
		o, err := l.client.decideOne(ctx, ll.key, ll.limit, 1, l.id)
		if err != nil {
			return Outcome{}, err
		}
		if o.Decision.Allowed {
			l.mu.Lock()
			switch o.Degraded {
			case NotDegraded:
				l.redis = true
			case DegradedLocal:
				l.local = true
			}
			l.mu.Unlock()
		}
		switch {
		case answer != nil && !answer.Decision.Allowed:
		case answer != nil && o.Decision.Allowed &&
			answer.Decision.Remaining <= o.Decision.Remaining:
		default:
			o := o
			answer = &o
		}
	}
	l.mu.Lock()
	l.lastRenewal = answer
	l.mu.Unlock()
	return *answer, nil
}

// KeepAlive renews the lease every `every` from a goroutine until it is released (choose
// `every` well below lease_sec). Calling it again replaces the timer.
func (l *Lease) KeepAlive(every time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return
	}
	if l.stop != nil {
		close(l.stop)
	}
	stop := make(chan struct{})
	l.stop = stop
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_, _ = l.Renew(context.Background())
			}
		}
	}()
}

// LastRenewal is the outcome of the latest renewal (Renew or KeepAlive).
func (l *Lease) LastRenewal() (Outcome, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastRenewal == nil {
		return Outcome{}, false
	}
	return *l.lastRenewal, true
}

// Release gives the slot back now: whether a live lease was released (false if it had expired,
// was admitted by FailOpen, was released before, or Redis could not answer: it then expires by
// itself). It stops the keep-alive, and a renewal already on its way (KeepAlive's or a Renew
// of another goroutine) is waited for until the connection has returned from it, so that no
// renewal sent before the release lands after it and takes the slot back. If ctx ends first,
// Release returns false and the slot is given back once that renewal has ended. (A renewal
// that Redis did not answer in time, on a server that then runs it late, can still land after;
// the lease then expires after lease_sec.)
func (l *Lease) Release(ctx context.Context) (bool, error) {
	l.mu.Lock()
	if l.stop != nil {
		close(l.stop)
		l.stop = nil
	}
	already := l.released
	l.released = true
	var drained chan struct{}
	if l.renewing > 0 {
		if l.drained == nil {
			l.drained = make(chan struct{})
		}
		drained = l.drained
	}
	l.mu.Unlock()
	if drained != nil {
		select {
		case <-drained:
		case <-ctx.Done():
			if !already {
				go func() {
					<-drained
					_, _ = l.giveBack(context.Background())
				}()
			}
			return false, nil
		}
	}
	if already {
		return false, nil
	}
	return l.giveBack(ctx)
}

// giveBack frees the slots where they are held, once no renewal is on its way.
func (l *Lease) giveBack(ctx context.Context) (bool, error) {
	l.mu.Lock()
	redis, local := l.redis, l.local
	l.mu.Unlock()
	freed := false
	if local {
		for _, ll := range l.limits {
			freed = l.client.leases.release(ll.key, l.id) || freed
		}
	}
	var first error
	if redis {
		for _, ll := range l.limits {
			f, err := l.client.Release(ctx, ll.key, l.id)
			freed = freed || f
			if err != nil && first == nil {
				first = err
			}
		}
	}
	if first != nil {
		return false, first
	}
	return freed, nil
}
