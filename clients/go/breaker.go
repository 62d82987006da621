package ratelimit

import (
	"sync"
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

type breakerState int

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

type breaker struct {
	config   BreakerConfig
	mu       sync.Mutex
	state    breakerState
	failures int
	until    time.Time
	// Closed when the breaker opens; a new one when it closes again.
	opened chan struct{}
	// Calls Redis answered so far.
	answers uint64
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
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case breakerClosed:
		return true
	case breakerOpen:
		if !time.Now().Before(b.until) {
			b.state = breakerHalfOpen
			return true
		}
	}
	return false
}

// answered is the number of calls Redis has answered so far (for failureSince).
func (b *breaker) answered() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answers
}

func (b *breaker) success() {
	b.mu.Lock()
	b.answers++
	if b.state != breakerClosed {
		b.opened = make(chan struct{})
	}
	b.state, b.failures = breakerClosed, 0
	b.mu.Unlock()
}

// failureSince is the failure of a call that began when answered() was seen: not counted if
// Redis has answered another call since, while the breaker is closed.
func (b *breaker) failureSince(seen uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerClosed && b.answers != seen {
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
	if b.state == breakerClosed && b.failures+1 < b.config.Failures {
		b.failures++
		return
	}
	if b.state == breakerClosed {
		close(b.opened)
	}
	b.state, b.failures, b.until = breakerOpen, 0, time.Now().Add(b.config.Cooldown)
}

// neutral ends a trial call that told nothing about Redis (the caller gave up first): the next
// call may try again.
func (b *breaker) neutral() {
	b.mu.Lock()
	if b.state == breakerHalfOpen {
		b.state, b.until = breakerOpen, time.Time{}
	}
	b.mu.Unlock()
}

func (b *breaker) isOpen() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state != breakerClosed
}
