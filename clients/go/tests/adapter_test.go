package tests

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// The package's redigo adapter (clients/go/redigoadapter) against a real server, with Debian's
// redigo 1.8.3: replies, error replies, and the context as far as 1.8.3 lets it through.

var _ ratelimit.Conn = redigoadapter.Pool{}

// commandCalls is the calls of command (lower case, as INFO commandstats names it) since the
// last CONFIG RESETSTAT.
func commandCalls(t *testing.T, c redis.Conn, command string) int64 {
	t.Helper()
	info, err := redis.String(c.Do("INFO", "commandstats"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if rest := strings.TrimPrefix(line, "cmdstat_"+command+":calls="); rest != line {
			n := int64(0)
			for _, ch := range rest {
				if ch < '0' || ch > '9' {
					break
				}
				n = n*10 + int64(ch-'0')
			}
			return n
		}
	}
	return 0
}

func TestTheRedigoAdapterReturnsRepliesAndErrorReplies(t *testing.T) {
	s := start(t, serverOpts{module: true})
	conn := redigoadapter.New(pool(s.addr()))
	ctx := context.Background()
	if v, err := conn.Do(ctx, "SET", "k", "v1"); err != nil || v != "OK" {
		t.Fatalf("SET: %#v, %v", v, err)
	}
	if v, err := conn.Do(ctx, "GET", "k"); err != nil || string(v.([]byte)) != "v1" {
		t.Fatalf("GET: %#v, %v", v, err)
	}
	v, err := conn.Do(ctx, "RL.TOKENBUCKET", "tb", 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := redis.Int64s(v, nil); len(got) != 5 || got[0] != 1 || got[1] != 4 || got[4] != 5 {
		t.Fatalf("RL.TOKENBUCKET: %#v", v)
	}
	_, err = conn.Do(ctx, "RL.TOKENBUCKET", "tb", 0, 1)
	var reply redis.Error
	if !errors.As(err, &reply) || !strings.HasPrefix(string(reply), "ERR") {
		t.Fatalf("an error reply is a redis.Error: %#v", err)
	}
	if _, err := conn.Do(ctx); !errors.Is(err, redigoadapter.ErrNoCommand) {
		t.Fatalf("no command: %v", err)
	}
	if _, err := conn.Do(ctx, 42); err == nil || !strings.Contains(err.Error(), "int") {
		t.Fatalf("a command name that is no string: %v", err)
	}
	// And the package through it: decided by the module, an error reply a *RejectedError.
	client := ratelimit.New(conn, ratelimit.Options{})
	out, err := client.Check(ctx, "tb2", ratelimit.TokenBucket{Capacity: 3, RefillPerSec: 0.001}, 2)
	if err != nil || !out.Decision.Allowed || out.Decision.Remaining != 1 || out.Mode != ratelimit.ModeModule {
		t.Fatalf("%+v, %v", out, err)
	}
	_, err = client.Check(ctx, "tb2", ratelimit.TokenBucket{Capacity: 0, RefillPerSec: 1}, 1)
	var rejected *ratelimit.RejectedError
	if !errors.As(err, &rejected) || rejected.Code() != "ERR" {
		t.Fatalf("capacity 0: %v", err)
	}
}

func TestTheRedigoAdapterSendsNothingForADoneContext(t *testing.T) {
	s := start(t, serverOpts{})
	a := admin(t, s)
	conn := redigoadapter.New(pool(s.addr()))
	must(t, a, "CONFIG", "RESETSTAT")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := conn.Do(cancelled, "SET", "k", "v"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel2()
	if _, err := conn.Do(expired, "SET", "k", "v"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired: %v", err)
	}
	if n := commandCalls(t, a, "set"); n != 0 {
		t.Fatalf("%d SET sent for done contexts", n)
	}
	if v, _ := a.Do("EXISTS", "k"); v != int64(0) {
		t.Fatalf("EXISTS k: %v", v)
	}
}

func TestTheRedigoAdapterWaitsForTheReplyUntilTheDeadline(t *testing.T) {
	s := start(t, serverOpts{})
	p := pool(s.addr())
	conn := redigoadapter.New(p)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	began := time.Now()
	_, err := conn.Do(ctx, "BLPOP", "nothing", 10) // Redis answers in 10 s
	took := time.Since(began)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("BLPOP past the deadline: %v", err)
	}
	if time.Now().Before(deadline) || took > 3*time.Second {
		t.Fatalf("gave up after %v, the deadline was %v after the call", took, deadline.Sub(began))
	}
	if n := p.IdleCount(); n != 0 {
		t.Fatalf("the timed-out connection went back to the pool (%d idle)", n)
	}
	// Without a deadline, the connection's own read timeout.
	p2 := pool(s.addr(), redis.DialReadTimeout(150*time.Millisecond))
	began = time.Now()
	_, err = redigoadapter.New(p2).Do(context.Background(), "BLPOP", "nothing", 10)
	if !errors.As(err, &ne) || !ne.Timeout() || time.Since(began) > 3*time.Second {
		t.Fatalf("BLPOP without a deadline, read timeout 150 ms: %v after %v", err, time.Since(began))
	}
}

func TestTheRedigoAdapterWaitsForAPoolConnectionUntilTheDeadline(t *testing.T) {
	s := start(t, serverOpts{})
	p := pool(s.addr())
	p.MaxActive, p.Wait = 1, true
	held := p.Get()
	defer held.Close()
	if _, err := held.Do("PING"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := redigoadapter.New(p).Do(ctx, "PING")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(began) > 3*time.Second {
		t.Fatalf("the pool's one connection held: %v after %v", err, time.Since(began))
	}
}
