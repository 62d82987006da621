package tests

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// What happens when Redis cannot answer: killed and restarted under each failure policy, hung
// (the breaker and the context's deadline), and the refusals that are errors and never a
// failure policy's answer.

var slowBucket = ratelimit.TokenBucket{Capacity: 10, RefillPerSec: 0.0001}

type seen struct {
	allowed   bool
	remaining int64
	limit     int64
}

func TestRedisKilledAndRestartedUnderEachPolicy(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		policy   ratelimit.FailurePolicy
		degraded ratelimit.Degraded
		down     []seen
	}{
		{ratelimit.FailOpen, ratelimit.DegradedFailOpen,
			[]seen{{true, 10, 10}, {true, 10, 10}, {true, 10, 10}, {true, 10, 10}, {true, 10, 10},
				{true, 10, 10}, {true, 10, 10}}},
		{ratelimit.FailClosed, ratelimit.DegradedFailClosed,
			[]seen{{false, 0, 10}, {false, 0, 10}, {false, 0, 10}, {false, 0, 10}, {false, 0, 10},
				{false, 0, 10}, {false, 0, 10}}},
		// Two instances share the limit: 5 here, from a full bucket.
		{ratelimit.Local(2), ratelimit.DegradedLocal,
			[]seen{{true, 4, 5}, {true, 3, 5}, {true, 2, 5}, {true, 1, 5}, {true, 0, 5},
				{false, 0, 5}, {false, 0, 5}}},
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			port := freePort()
			s := start(t, serverOpts{module: true, port: port})
			l := ratelimit.NewLimiter(client(s, ratelimit.Options{Policy: c.policy,
				Breaker: ratelimit.BreakerConfig{Failures: 1, Cooldown: 200 * time.Millisecond}}), slowBucket)
			for _, want := range []int64{9, 8, 7} {
				o, err := l.Check(ctx, "k")
				if err != nil || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != want {
					t.Fatalf("%+v %v", o, err)
				}
			}
			s.kill()
			var got []seen
			for i := 0; i < 7; i++ {
				o, err := l.Check(ctx, "k")
				if err != nil || o.Degraded != c.degraded || o.Mode != 0 {
					t.Fatalf("%+v %v", o, err)
				}
				got = append(got, seen{o.Decision.Allowed, o.Decision.Remaining, o.Decision.Limit})
			}
			if !equalSeen(got, c.down) {
				t.Fatalf("while down: %v, want %v", got, c.down)
			}
			if !l.Client().BreakerOpen() {
				t.Fatal("the breaker is closed while Redis is down")
			}
			// A server again on the same port: the client finds it by itself.
			start(t, serverOpts{module: true, port: port})
			deadline := time.Now().Add(10 * time.Second)
			for {
				o, err := l.Check(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				if o.Degraded == ratelimit.NotDegraded {
					// A fresh server without persistence: a new bucket.
					if o.Decision.Remaining != 9 || o.Mode != ratelimit.ModeModule {
						t.Fatalf("%+v", o)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("never back on Redis")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if l.Client().BreakerOpen() {
				t.Fatal("the breaker stays open once Redis answers")
			}
		})
	}
}

func equalSeen(a, b []seen) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A server that stops answering (SIGSTOP) costs the timeout only until the breaker opens; then
// calls are answered at once, and after the cooldown one trial finds the server back. A
// deadline of the caller's context that comes before the timeout is kept. (Bounds wide enough
// for a loaded machine: 30 ms against 300.)
// conns are the two ways the client sends a request: on the caller's goroutine through a
// ratelimit.DeadlineConn (the redigo adapter), and watched from a goroutine of its own to its
// deadline through any other Conn.
var conns = []struct {
	name string
	conn func(*redis.Pool) ratelimit.Conn
}{
	{"deadline", func(p *redis.Pool) ratelimit.Conn { return Redigo{p} }},
	{"watched", func(p *redis.Pool) ratelimit.Conn { return Watched{p} }},
}

func TestTheBreakerSparesTheTimeoutOfAHungServer(t *testing.T) {
	for _, c := range conns {
		t.Run(c.name, func(t *testing.T) {
			theBreakerSparesTheTimeoutOfAHungServer(t, c.conn)
		})
	}
}

func theBreakerSparesTheTimeoutOfAHungServer(t *testing.T, conn func(*redis.Pool) ratelimit.Conn) {
	ctx := context.Background()
	s := start(t, serverOpts{module: true})
	l := ratelimit.NewLimiter(ratelimit.New(conn(pool(s.addr())), ratelimit.Options{
		Timeout: 300 * time.Millisecond,
		Breaker: ratelimit.BreakerConfig{Failures: 3, Cooldown: 500 * time.Millisecond}}), slowBucket)
	if o, err := l.Check(ctx, "k"); err != nil || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != 9 {
		t.Fatalf("%+v %v", o, err)
	}
	if err := s.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.signal(syscall.SIGCONT) }()
	// The context's deadline (30 ms) comes before the timeout (300 ms).
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	began := time.Now()
	o, err := l.Check(short, "k")
	cancel()
	if took := time.Since(began); err != nil || o.Degraded != ratelimit.DegradedFailOpen ||
		took < 25*time.Millisecond || took > 250*time.Millisecond {
		t.Fatalf("%+v %v in %v", o, err, took)
	}
	for i := 0; i < 2; i++ {
		began := time.Now()
		o, err := l.Check(ctx, "k")
		if took := time.Since(began); err != nil || o.Degraded != ratelimit.DegradedFailOpen ||
			took < 295*time.Millisecond || took > 2*time.Second {
			t.Fatalf("call %d: %+v %v in %v", i, o, err, took)
		}
	}
	if !l.Client().BreakerOpen() {
		t.Fatal("three failures and the breaker is closed")
	}
	for i := 0; i < 20; i++ {
		began := time.Now()
		o, err := l.Check(ctx, "k")
		if took := time.Since(began); err != nil || o.Degraded != ratelimit.DegradedFailOpen ||
			took > 100*time.Millisecond {
			t.Fatalf("open breaker, call %d: %+v %v in %v", i, o, err, took)
		}
	}
	if err := s.signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(550 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		o, err := l.Check(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if o.Degraded == ratelimit.NotDegraded {
			if o.Mode != ratelimit.ModeModule || o.Decision.Remaining > 8 {
				t.Fatalf("%+v", o)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never recovered")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if l.Client().BreakerOpen() {
		t.Fatal("the breaker is open after a success")
	}
}

// A request on a frozen server (SIGSTOP) ends at its deadline, the client's timeout or the
// context's if sooner, whichever way it is sent; a caller that gives up while it waits gets the
// policy's answer, not counted by the breaker: at once when the client watches the request, at
// the deadline when the DeadlineConn sends it on the caller's goroutine (redigo cannot
// interrupt a read).
func TestARequestOnAFrozenServerEndsAtItsDeadline(t *testing.T) {
	for _, c := range conns {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			s := start(t, serverOpts{module: true})
			l := ratelimit.NewLimiter(ratelimit.New(c.conn(pool(s.addr())), ratelimit.Options{
				Timeout: 200 * time.Millisecond, Policy: ratelimit.FailClosed,
				Breaker: ratelimit.BreakerConfig{Failures: 1, Cooldown: time.Hour}}), slowBucket)
			if o, err := l.Check(ctx, "k"); err != nil || o.Degraded != ratelimit.NotDegraded ||
				o.Decision.Remaining != 9 {
				t.Fatalf("%+v %v", o, err)
			}
			if err := s.signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.signal(syscall.SIGCONT) }()
			// Cancelled after 30 ms.
			gone, cancel := context.WithCancel(ctx)
			timer := time.AfterFunc(30*time.Millisecond, cancel)
			began := time.Now()
			o, err := l.Check(gone, "k")
			took := time.Since(began)
			gaveUp := took
			timer.Stop()
			cancel()
			lo, hi := 200*time.Millisecond, 300*time.Millisecond
			if c.name == "watched" {
				lo, hi = 30*time.Millisecond, 130*time.Millisecond
			}
			if err != nil || o.Degraded != ratelimit.DegradedFailClosed || took < lo || took > hi {
				t.Fatalf("cancelled: %+v %v in %v, not in [%v, %v]", o, err, took, lo, hi)
			}
			if l.Client().BreakerOpen() {
				t.Fatal("a caller that gave up opened the breaker")
			}
			// The context's deadline (40 ms) before the timeout.
			short, cancel := context.WithTimeout(ctx, 40*time.Millisecond)
			began = time.Now()
			o, err = l.Check(short, "k")
			took = time.Since(began)
			cancel()
			if err != nil || o.Degraded != ratelimit.DegradedFailClosed ||
				took < 40*time.Millisecond || took > 140*time.Millisecond {
				t.Fatalf("context deadline: %+v %v in %v", o, err, took)
			}
			if !l.Client().BreakerOpen() {
				t.Fatal("a request past its deadline did not open the breaker (1 failure)")
			}
			t.Logf("cancelled after 30 ms: answered in %v; deadline of 40 ms: in %v", gaveUp, took)
		})
	}
}

// A caller that gives up (a cancelled context, such as an HTTP client gone away) gets the
// policy's answer, and its impatience is not held against Redis.
func TestACancelledCallerDoesNotTripTheBreaker(t *testing.T) {
	s := start(t, serverOpts{module: true})
	l := ratelimit.NewLimiter(client(s, ratelimit.Options{Policy: ratelimit.FailClosed,
		Breaker: ratelimit.BreakerConfig{Failures: 1, Cooldown: time.Hour}}), slowBucket)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o, err := l.Check(ctx, "k")
	if err != nil || o.Degraded != ratelimit.DegradedFailClosed {
		t.Fatalf("%+v %v", o, err)
	}
	if l.Client().BreakerOpen() {
		t.Fatal("a cancelled caller opened the breaker")
	}
	o, err = l.Check(context.Background(), "k")
	if err != nil || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != 9 {
		t.Fatalf("%+v %v", o, err)
	}
}

// assertRefused: an error naming the refusal, three times, never a policy's answer, and the
// breaker stays closed (the server answered).
func assertRefused(t *testing.T, l *ratelimit.Limiter, code string) {
	t.Helper()
	for i := 0; i < 3; i++ {
		o, err := l.Check(context.Background(), "k")
		var rejected *ratelimit.RejectedError
		if !errors.As(err, &rejected) || rejected.Code() != code ||
			!strings.HasPrefix(err.Error(), "rejected by redis: "+code+" ") {
			t.Fatalf("%s: %+v %v", code, o, err)
		}
	}
	if l.Client().BreakerOpen() {
		t.Fatalf("%s tripped the breaker", code)
	}
}

func moduleMode() ratelimit.Options {
	return ratelimit.Options{Policy: ratelimit.FailOpen, Mode: ratelimit.ChooseModule}
}

func TestRefusalsAreErrorsNotFailOpen(t *testing.T) {
	s := start(t, serverOpts{module: true})
	a := admin(t, s)
	must(t, a, "ACL", "SETUSER", "reader", "on", ">pw", "~*", "+get")
	reader := ratelimit.New(Redigo{pool(s.addr(), redis.DialUsername("reader"),
		redis.DialPassword("pw"))}, moduleMode())
	assertRefused(t, ratelimit.NewLimiter(reader, slowBucket), "NOPERM")

	replica := start(t, serverOpts{module: true})
	must(t, admin(t, replica), "REPLICAOF", "127.0.0.1", s.port)
	assertRefused(t, ratelimit.NewLimiter(client(replica, moduleMode()), slowBucket), "READONLY")

	must(t, a, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	must(t, a, "CONFIG", "SET", "maxmemory", "1")
	assertRefused(t, ratelimit.NewLimiter(client(s, moduleMode()), slowBucket), "OOM")
	must(t, a, "CONFIG", "SET", "maxmemory", "0")

	must(t, a, "CONFIG", "SET", "requirepass", "secret")
	assertRefused(t, ratelimit.NewLimiter(client(s, moduleMode()), slowBucket), "NOAUTH")
}

// The documented start with Redis down: New returns at once; while nothing listens, every
// call is the policy's answer within the deadline (the breaker soon answers at once) and no
// mode is settled; once Redis is there, Redis decides for the same clients.
func TestAClientStartedWhileRedisIsDownStartsAndRecovers(t *testing.T) {
	ctx := context.Background()
	port := freePort()
	type started struct {
		limiter  *ratelimit.Limiter
		degraded ratelimit.Degraded
		allowed  bool
	}
	var clients []started
	for _, c := range []struct {
		policy   ratelimit.FailurePolicy
		degraded ratelimit.Degraded
		allowed  bool
	}{
		{ratelimit.FailOpen, ratelimit.DegradedFailOpen, true},
		{ratelimit.FailClosed, ratelimit.DegradedFailClosed, false},
	} {
		began := time.Now()
		cl := ratelimit.New(Redigo{newPool("127.0.0.1:" + strconv.Itoa(port))},
			ratelimit.Options{Policy: c.policy})
		if took := time.Since(began); took > time.Second {
			t.Fatalf("New took %v", took)
		}
		clients = append(clients, started{ratelimit.NewLimiter(cl, slowBucket), c.degraded, c.allowed})
	}
	for _, c := range clients {
		for i := 0; i < 10; i++ {
			began := time.Now()
			o, err := c.limiter.Check(ctx, "k")
			// Within the deadline (100 ms), with room for a loaded machine.
			if took := time.Since(began); err != nil || o.Degraded != c.degraded ||
				o.Decision.Allowed != c.allowed || o.Mode != 0 || took > time.Second {
				t.Fatalf("call %d while down: %+v %v in %v", i, o, err, took)
			}
		}
		if _, known := c.limiter.Client().Mode(); known || !c.limiter.Client().BreakerOpen() {
			t.Fatal("a mode while down, or the breaker closed")
		}
	}
	start(t, serverOpts{module: true, port: port})
	for i, c := range clients {
		deadline := time.Now().Add(10 * time.Second)
		for {
			o, err := c.limiter.Check(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if o.Degraded == ratelimit.NotDegraded {
				// The second client finds the first one's call in the bucket.
				if o.Mode != ratelimit.ModeModule || o.Decision.Remaining != int64(9-i) {
					t.Fatalf("client %d back on Redis: %+v", i, o)
				}
				break
			}
			if o.Degraded != c.degraded || time.Now().After(deadline) {
				t.Fatalf("client %d never back on Redis: %+v", i, o)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if m, known := c.limiter.Client().Mode(); !known || m != ratelimit.ModeModule ||
			c.limiter.Client().BreakerOpen() {
			t.Fatalf("client %d: mode %v %v, breaker open %v", i, m, known,
				c.limiter.Client().BreakerOpen())
		}
	}
}

// A burst of 200 calls on a server that stops answering (SIGSTOP), through a cold client (its
// detection gets no answer) and a warm one (its requests get none): every call is the policy's
// answer, and the breaker opens. The cold client's callers wait for the one detection (one
// deadline, 100 ms); the warm client's first 16 requests each wait out their deadline, and the
// calls queued behind them are answered once the breaker opens (a few may have sent a request
// of their own first: two deadlines). Bound: 1 s, for a loaded machine.
func TestABurstOnAFrozenServerIsAnsweredByThePolicyWithinTheDeadline(t *testing.T) {
	ctx := context.Background()
	s := start(t, serverOpts{module: true})
	type limiter struct {
		name string
		l    *ratelimit.Limiter
	}
	var limiters []limiter
	for _, c := range conns {
		warm := ratelimit.NewLimiter(ratelimit.New(c.conn(pool(s.addr())), ratelimit.Options{}),
			slowBucket)
		if o, err := warm.Check(ctx, "k"); err != nil || o.Degraded != ratelimit.NotDegraded {
			t.Fatalf("%+v %v", o, err)
		}
		cold := ratelimit.NewLimiter(ratelimit.New(c.conn(pool(s.addr())), ratelimit.Options{}),
			slowBucket)
		limiters = append(limiters, limiter{"cold " + c.name, cold}, limiter{"warm " + c.name, warm})
	}
	if err := s.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.signal(syscall.SIGCONT) }()
	for _, c := range limiters {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var slowest time.Duration
		var problems []string
		ready := make(chan struct{})
		for i := 0; i < 200; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				began := time.Now()
				o, err := c.l.Check(ctx, "k")
				took := time.Since(began)
				mu.Lock()
				defer mu.Unlock()
				if took > slowest {
					slowest = took
				}
				if err != nil || o.Degraded != ratelimit.DegradedFailOpen || !o.Decision.Allowed {
					problems = append(problems, fmt.Sprintf("%+v %v", o, err))
				}
			}()
		}
		close(ready)
		wg.Wait()
		if len(problems) > 0 || slowest > time.Second {
			t.Fatalf("%s: %d not the policy's answer (%v), the slowest in %v", c.name,
				len(problems), problems[:minInt(3, len(problems))], slowest)
		}
		if !c.l.Client().BreakerOpen() {
			t.Fatalf("%s: the breaker is closed", c.name)
		}
		t.Logf("%s: 200 answers by the policy, the slowest in %v", c.name, slowest)
	}
	for _, c := range limiters {
		if _, known := c.l.Client().Mode(); strings.HasPrefix(c.name, "cold") && known {
			t.Fatalf("%s: a mode detected on a frozen server", c.name)
		}
	}
}
