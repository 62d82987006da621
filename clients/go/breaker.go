package ratelimit

import (
	"sync"
	"time"
)

// BreakerConfig configures the circuit breaker: after Failures calls in a row that Redis did not
// answer, calls skip Redis for Cooldown (the failure policy answers them at once); then one
// trial call goes through: its success closes the breaker, its failure opens it again.
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
}

func newBreaker(c BreakerConfig) *breaker {
	if c.Failures < 1 {
		c.Failures = 1
	}
	return &breaker{config: c}
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

func (b *breaker) success() {
	b.mu.Lock()
	b.state, b.failures = breakerClosed, 0
	b.mu.Unlock()
}

func (b *breaker) failure() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerClosed && b.failures+1 < b.config.Failures {
		b.failures++
		return
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
