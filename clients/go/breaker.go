package ratelimit

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerConfig configures the circuit breaker: after Failures calls in a row that Redis did not
// answer, calls skip Redis for Cooldown (the failure policy answers them at once); then one
// trial call goes through: its success closes the breaker, its failure opens it again. A call
// that fails while Redis answered another call since it began is not counted: Redis is there
// (a burst of calls that outlast the timeout on a busy machine does not open the breaker).
type BreakerConfig struct {
	// Consecutive failures that open the breaker (default 3; at least 1).
	Failures int
	// How long calls skip Redis once it is open (default 1 s).
	Cooldown time.Duration
}

type breakerState = int32

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

// breaker is read without its lock on the way of every call: a closed breaker with no failure
// counted is two atomic loads (permit, answered) and one addition (success). Its state and
// failures change under mu only.
type breaker struct {
	config BreakerConfig
	mu     sync.Mutex
	// Written under mu.
	state    atomic.Int32
	failures atomic.Int32
	until    time.Time
	// Closed when the breaker opens; a new one when it closes again.
	opened chan struct{}
	// Calls Redis answered so far.
	answers atomic.Uint64
}

func newBreaker(c BreakerConfig) *breaker {
	if c.Failures < 1 {
		c.Failures = 1
	}
	return &breaker{config: c, opened: make(chan struct{})}
}

// openedChan is closed once the breaker is open (or half open).
func (b *breaker) openedChan() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened
}

// permit says whether this call may go to Redis.
func (b *breaker) permit() bool {
	if b.state.Load() == breakerClosed {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state.Load() {
	case breakerClosed:
		return true
	case breakerOpen:
		if !time.Now().Before(b.until) {
			b.state.Store(breakerHalfOpen)
			return true
		}
	}
	return false
}

// answered is the number of calls Redis has answered so far (for failureSince).
func (b *breaker) answered() uint64 {
	return b.answers.Load()
}

func (b *breaker) success() {
	b.answers.Add(1)
	if b.state.Load() == breakerClosed && b.failures.Load() == 0 {
		return
	}
	b.mu.Lock()
	if b.state.Load() != breakerClosed {
		b.opened = make(chan struct{})
	}
	b.state.Store(breakerClosed)
	b.failures.Store(0)
	b.mu.Unlock()
}

// failureSince is the failure of a call that began when answered() was seen: not counted if
// Redis has answered another call since, while the breaker is closed.
func (b *breaker) failureSince(seen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state.Load() == breakerClosed && b.answers.Load() != seen {
		return
	}
	b.failLocked()
}

func (b *breaker) failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failLocked()
}

func (b *breaker) failLocked() {
	state := b.state.Load()
	if state == breakerClosed && int(b.failures.Load())+1 < b.config.Failures {
		b.failures.Add(1)
		return
	}
	if state == breakerClosed {
		close(b.opened)
	}
	b.until = time.Now().Add(b.config.Cooldown)
	b.failures.Store(0)
	b.state.Store(breakerOpen)
}

// neutral ends a trial call that told nothing about Redis (the caller gave up first): the next
// call may try again.
func (b *breaker) neutral() {
	b.mu.Lock()
	if b.state.Load() == breakerHalfOpen {
		b.state.Store(breakerOpen)
		b.until = time.Time{}
	}
	b.mu.Unlock()
}

func (b *breaker) isOpen() bool {
	return b.state.Load() != breakerClosed
}
