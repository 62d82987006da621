package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// The examples run against a server of their own, started on first use: the module loaded with
// the test clock, which stands still (at 2027-01-15 08:00 UTC), so that every number they print
// is exact. In an application the pool dials the application's Redis.

var (
	exampleOnce   sync.Once
	exampleServer *server
	exampleErr    error
)

func exampleAddr() string {
	exampleOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ratelimit-examples")
		if err != nil {
			exampleErr = err
			return
		}
		exampleServer, exampleErr = launch(dir, serverOpts{module: true, testClock: true})
		if exampleErr != nil {
			return
		}
		c, err := redis.Dial("tcp", exampleServer.addr())
		if err != nil {
			exampleErr = err
			return
		}
		defer c.Close()
		_, exampleErr = c.Do("RL.TESTCLOCK", "SET", t0)
	})
	if exampleErr != nil {
		panic(exampleErr)
	}
	return exampleServer.addr()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if exampleServer != nil {
		exampleServer.kill()
		os.RemoveAll(exampleServer.dir)
	}
	os.Exit(code)
}

// newPool is how an application makes its redigo pool.
func newPool(addr string) *redis.Pool {
	return &redis.Pool{
		MaxIdle:     64,
		IdleTimeout: time.Minute,
		Dial:        func() (redis.Conn, error) { return redis.Dial("tcp", addr) },
	}
}

// A token bucket of 10 refilling 5 per second: a burst of 12 calls.
func Example_tokenBucket() {
	client := ratelimit.New(redigoadapter.New(newPool(exampleAddr())), ratelimit.Options{Policy: ratelimit.Local(4)})
	limiter := ratelimit.NewLimiter(client, ratelimit.TokenBucket{Capacity: 10, RefillPerSec: 5})
	ctx := context.Background()
	allowed, retry := 0, int64(-1)
	for i := 0; i < 12; i++ {
		out, err := limiter.Check(ctx, "user:42")
		if err != nil {
			fmt.Println(err)
			return
		}
		if out.Decision.Allowed {
			allowed++
		} else if retry < 0 {
			retry = out.Decision.RetryAfterMs
		}
	}
	fmt.Printf("burst: %d of 12 allowed, by the %s\n", allowed, mode(client))
	fmt.Printf("first denial: retry in %d ms\n", retry)
	peek, _ := limiter.Peek(ctx, "user:42")
	fmt.Printf("a peek takes nothing: %d left, full again in %d ms\n", peek.Decision.Remaining,
		peek.Decision.ResetAfterMs)
	// Output:
	// burst: 10 of 12 allowed, by the module
	// first denial: retry in 200 ms
	// a peek takes nothing: 0 left, full again in 2000 ms
}

func mode(c *ratelimit.Client) string {
	m, _ := c.Mode()
	return m.String()
}

// A route limit and a client limit in one call (RL.ALL): all or nothing.
func Example_severalLimits() {
	client := ratelimit.New(redigoadapter.New(newPool(exampleAddr())), ratelimit.Options{})
	limits := []ratelimit.Limit{
		{Key: "{client:1.2.3.4}:login", Algorithm: ratelimit.TokenBucket{Capacity: 3, RefillPerSec: 0.1}},
		{Key: "{client:1.2.3.4}:all", Algorithm: ratelimit.SlidingLog{Limit: 100, WindowSec: 60}},
	}
	for i := 0; i < 4; i++ {
		out, err := client.CheckAll(context.Background(), limits, 1)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(out.Allowed, out.DeniedBy, out.Decisions[0].Remaining, out.Decisions[1].Remaining)
	}
	// Output:
	// true 0 2 99
	// true 0 1 98
	// true 0 0 97
	// false 1 0 97
}

// At most 2 exports at once per tenant: a lease holds a slot until it is released.
func Example_lease() {
	client := ratelimit.New(redigoadapter.New(newPool(exampleAddr())), ratelimit.Options{})
	exports := ratelimit.Concurrency{Limit: 2, LeaseSec: 30}
	ctx := context.Background()
	var held []*ratelimit.Lease
	for i := 0; i < 3; i++ {
		out, err := client.Acquire(ctx, "exports:acme", exports)
		if err != nil {
			fmt.Println(err)
			return
		}
		if out.Lease == nil {
			fmt.Printf("full: a slot frees in %d ms\n", out.Outcome.Decision.RetryAfterMs)
			continue
		}
		held = append(held, out.Lease)
		fmt.Printf("export %d runs, %d slot(s) left\n", i+1, out.Outcome.Decision.Remaining)
	}
	for _, l := range held {
		freed, _ := l.Release(ctx)
		fmt.Println("released:", freed)
	}
	// Output:
	// export 1 runs, 1 slot(s) left
	// export 2 runs, 0 slot(s) left
	// full: a slot frees in 30000 ms
	// released: true
	// released: true
}

// A language model's token budget: 4,000 tokens reserved, 1,200 used, the rest given back.
func Example_reservation() {
	client := ratelimit.New(redigoadapter.New(newPool(exampleAddr())), ratelimit.Options{})
	tokens := ratelimit.TokenBucket{Capacity: 10000, RefillPerSec: 100}
	ctx := context.Background()
	out, err := client.Reserve(ctx, "tokens:acme", tokens, 4000)
	if err != nil || out.Reservation == nil {
		fmt.Println("denied", err)
		return
	}
	fmt.Println("reserved, left:", out.Outcome.Decision.Remaining)
	settled, err := out.Reservation.Settle(ctx, 1200)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("settled, left:", settled.Decisions[0].Remaining)
	// Output:
	// reserved, left: 6000
	// settled, left: 8800
}

// net/http middleware: 2 requests per minute per API key, the third refused.
func Example_middleware() {
	client := ratelimit.New(redigoadapter.New(newPool(exampleAddr())), ratelimit.Options{})
	limits := ratelimit.NewMiddleware(client).
		Key(ratelimit.HeaderKey("X-Api-Key")).
		Limits("*", "*", ratelimit.NewPolicy("per-minute", ratelimit.FixedWindow{Limit: 2, WindowSec: 60}))
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello")
	})
	srv := httptest.NewServer(limits.Handler(app))
	defer srv.Close()
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-Api-Key", "alice")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit"))
		if resp.StatusCode == http.StatusTooManyRequests {
			fmt.Println("Retry-After:", resp.Header.Get("Retry-After"))
			fmt.Println(string(body))
		}
	}
	// Output:
	// 200 "per-minute";r=1;t=60
	// 200 "per-minute";r=0;t=60
	// 429 "per-minute";r=0;t=60
	// Retry-After: 60
	// {"detail":"rate limit 'per-minute' exceeded; retry in 60 s","limit":"per-minute","retry_after":60,"status":429,"title":"Too Many Requests","type":"about:blank"}
}

// The same middleware with the fields of the draft's next revision (HeaderDraft12): a, w and c in
// RateLimit, and RateLimit-Partition.
func Example_middlewareDraft12() {
	client := ratelimit.New(redigoadapter.New(newPool(exampleAddr())), ratelimit.Options{})
	limits := ratelimit.NewMiddleware(client).
		Key(ratelimit.HeaderKey("X-Api-Key")).
		Limits("*", "*", ratelimit.NewPolicy("per-minute", ratelimit.FixedWindow{Limit: 2, WindowSec: 60})).
		Options(ratelimit.MiddlewareOptions{HeaderFormat: ratelimit.HeaderDraft12})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello")
	})
	srv := httptest.NewServer(limits.Handler(app))
	defer srv.Close()
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-Api-Key", "carol")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit"))
		if resp.StatusCode == http.StatusTooManyRequests {
			fmt.Println("Retry-After:", resp.Header.Get("Retry-After"))
		}
		if i == 0 {
			fmt.Println(resp.Header.Get("RateLimit-Policy"))
			fmt.Println(resp.Header.Get("RateLimit-Partition"))
		}
	}
	// Output:
	// 200 "per-minute";a=1;w=60;c=1
	// "per-minute";q=2;w=60
	// "per-minute";client_id
	// 200 "per-minute";a=0;w=60;c=1
	// 429 "per-minute";a=0;w=60;c=0
	// Retry-After: 60
}

// The keys with the most denials on the server (RL.TOP), for an operator.
func Example_top() {
	client := ratelimit.New(redigoadapter.New(newPool(exampleAddr())), ratelimit.Options{})
	ctx := context.Background()
	if err := client.ResetTop(ctx); err != nil {
		fmt.Println(err)
		return
	}
	login := ratelimit.FixedWindow{Limit: 1, WindowSec: 3600}
	for i := 0; i < 4; i++ {
		_, _ = client.Check(ctx, "login:1.2.3.4", login, 1)
	}
	_, _ = client.Check(ctx, "login:5.6.7.8", login, 1)
	_, _ = client.Check(ctx, "login:5.6.7.8", login, 1)
	top, err := client.Top(ctx, 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range top {
		fmt.Printf("%s: %d denials (by %s, latest at %s)\n", e.Key, e.Denied, e.Command,
			time.UnixMilli(e.LastDeniedMs).UTC().Format(time.RFC3339))
	}
	// Output:
	// login:1.2.3.4: 3 denials (by RL.FIXEDWINDOW, latest at 2027-01-15T08:00:00Z)
	// login:5.6.7.8: 1 denials (by RL.FIXEDWINDOW, latest at 2027-01-15T08:00:00Z)
}
