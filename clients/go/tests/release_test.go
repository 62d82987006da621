package tests

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"redis-rate-limiter/ratelimit"
)

// A release on a renewal tick: the keep-alive's renewal is on its way (its RL.ACQUIRE held back
// 100 ms on the way to a real server, as a slow network would) when the lease is released. The
// release returns only once that renewal has landed, then gives the slot back: it stays free,
// for Lease.Release and for the middleware's kept-alive leases.

// slowRenewals passes every command to a real server, but holds back each RL.ACQUIRE of key
// after the first (the renewals), saying when one is held and when it has been answered.
type slowRenewals struct {
	Redigo
	key      string
	delay    time.Duration
	mu       sync.Mutex
	acquires int
	held     chan struct{} // a renewal is held back (once)
	answered chan struct{} // that renewal has been answered
}

func newSlowRenewals(addr, key string) *slowRenewals {
	return &slowRenewals{Redigo: Redigo{pool(addr)}, key: key, delay: 100 * time.Millisecond,
		held: make(chan struct{}), answered: make(chan struct{})}
}

func (s *slowRenewals) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	return s.pass(args, func() (interface{}, error) { return s.Redigo.Do(ctx, args...) })
}

// DoBy is Do on the caller's goroutine (a ratelimit.DeadlineConn, as the adapter is).
func (s *slowRenewals) DoBy(ctx context.Context, deadline time.Time,
	args ...interface{}) (interface{}, error) {
	return s.pass(args, func() (interface{}, error) { return s.Redigo.DoBy(ctx, deadline, args...) })
}

// pass sends a command with send, the first renewal held back.
func (s *slowRenewals) pass(args []interface{}, send func() (interface{}, error)) (interface{},
	error) {
	first := false
	if len(args) > 1 && args[0] == "RL.ACQUIRE" && args[1] == s.key {
		s.mu.Lock()
		s.acquires++
		first = s.acquires == 2
		s.mu.Unlock()
	}
	if !first {
		return send()
	}
	close(s.held)
	time.Sleep(s.delay)
	v, err := send()
	close(s.answered)
	return v, err
}

// landed waits until the held renewal has been answered (at most 5 s).
func (s *slowRenewals) landed(t *testing.T) {
	t.Helper()
	select {
	case <-s.answered:
	case <-time.After(5 * time.Second):
		t.Fatal("the held renewal was never answered")
	}
}

func TestAReleaseOnARenewalTickStaysReleased(t *testing.T) {
	ctx := context.Background()
	s := start(t, serverOpts{module: true})
	a := admin(t, s)
	const key = "renewed"
	conn := newSlowRenewals(s.addr(), key)
	cl := ratelimit.New(conn, ratelimit.Options{Timeout: 2 * time.Second})
	one := ratelimit.Concurrency{Limit: 1, LeaseSec: 2}
	out, err := cl.Acquire(ctx, key, one)
	if err != nil || out.Lease == nil {
		t.Fatalf("%+v %v", out, err)
	}
	lease := out.Lease
	lease.KeepAlive(20 * time.Millisecond)
	<-conn.held
	began := time.Now()
	freed, err := lease.Release(ctx)
	took := time.Since(began)
	if err != nil || !freed {
		t.Fatalf("release: %v %v", freed, err)
	}
	conn.landed(t)
	if n := zcard(t, a, key); n != 0 {
		t.Fatalf("the renewal on its way took the slot back after the release (%d held, "+
			"released in %v)", n, took)
	}
	if lease.HoldsSlot() {
		t.Fatal("a released lease holds its slot")
	}
	// Nothing renews it afterwards.
	time.Sleep(100 * time.Millisecond)
	if n := zcard(t, a, key); n != 0 {
		t.Fatalf("%d held after the release", n)
	}
	if _, err := lease.Renew(ctx); err == nil || zcard(t, a, key) != 0 {
		t.Fatalf("a released lease was renewed (%v)", err)
	}
	other, err := cl.Acquire(ctx, key, one)
	if err != nil || other.Lease == nil {
		t.Fatalf("the slot is not free: %+v %v", other, err)
	}
	if freed, err := other.Lease.Release(ctx); err != nil || !freed {
		t.Fatalf("%v %v", freed, err)
	}
}

func TestAMiddlewareReleaseOnARenewalTickStaysReleased(t *testing.T) {
	s := start(t, serverOpts{module: true})
	a := admin(t, s)
	const key = "rl:{127.0.0.1}:default:inflight"
	conn := newSlowRenewals(s.addr(), key)
	m := ratelimit.NewMiddleware(ratelimit.New(conn, ratelimit.Options{Timeout: 2 * time.Second})).
		Limits("*", "*", ratelimit.NewPolicy("inflight", ratelimit.Concurrency{Limit: 1, LeaseSec: 2})).
		LeaseKeepAlive(20 * time.Millisecond)
	url := serve(t, m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Wait") != "" {
			<-conn.held // returns on a renewal tick
		}
		_, _ = io.WriteString(w, "ok")
	})))
	if r := get(t, url, "X-Wait", "1"); r.status != 200 || r.body != "ok" {
		t.Fatalf("%+v", r)
	}
	conn.landed(t)
	if n := zcard(t, a, key); n != 0 {
		t.Fatalf("the renewal on its way took the slot back after the response (%d held)", n)
	}
	r := get(t, url)
	if r.status != 200 || r.headers.Get("RateLimit") != `"inflight";r=0;t=2` {
		t.Fatalf("the next request: %d %s", r.status, strconv.Quote(r.headers.Get("RateLimit")))
	}
}
