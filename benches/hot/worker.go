// One worker process of benches/hot/run.py for Go: `tasks` goroutines sending requests through the
// Go package's net/http middleware (Middleware.Handler, ServeHTTP called as net/http's server
// would, without sockets) on one key until the run ends; its counts as one JSON line.
//
// Built from clients/go/tests (the module that has redigo), with the Makefile's GO_ENV:
//
//	go build -o hot_worker ../../../benches/hot/worker.go
//
// With --http the requests go over HTTP/1.1 on loopback instead: a net/http server serving the
// middleware, and an http.Client of the same process (keep-alive, one connection per goroutine).
//
// Protocol (the same in every language): it prints "ready" once its client has detected the
// mode, reads the start (Unix ms) from stdin, runs --seconds from then, closes its client (what
// the batches hold goes back) and prints the JSON line. With --admissions FILE it appends one byte
// to FILE per admitted request as it happens.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

func algorithm(scenario string, aboveLimit int64) ratelimit.Algorithm {
	switch scenario {
	case "below":
		return ratelimit.TokenBucket{Capacity: 1_000_000_000_000, RefillPerSec: 1_000_000_000_000}
	case "above":
		return ratelimit.FixedWindow{Limit: aboveLimit, WindowSec: 3600}
	}
	return ratelimit.FixedWindow{Limit: 1, WindowSec: 1}
}

// bucket is the latency's bucket: 16 per power of two of nanoseconds (as hot_key.rs).
func bucket(ns uint64) int {
	if ns == 0 {
		ns = 1
	}
	exp := 63 - bits.LeadingZeros64(ns)
	mantissa := 0
	if exp >= 4 {
		mantissa = int((ns >> (exp - 4)) & 15)
	}
	return exp*16 + mantissa
}

func cpuUs() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return (ru.Utime.Nano() + ru.Stime.Nano()) / 1000
}

// writer is the least a ResponseWriter is: the header and the status.
type writer struct {
	header http.Header
	status int
}

func (w *writer) Header() http.Header { return w.header }
func (w *writer) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}
func (w *writer) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func main() {
	port := flag.Int("port", 6379, "")
	scenario := flag.String("scenario", "below", "")
	variant := flag.String("variant", "unbatched", "")
	tasks := flag.Int("tasks", 16, "")
	seconds := flag.Float64("seconds", 2, "")
	admissions := flag.String("admissions", "", "")
	limit := flag.Int64("limit", 20000, "")
	overHTTP := flag.Bool("http", false, "")
	flag.Parse()

	addr := "127.0.0.1:" + strconv.Itoa(*port)
	pool := &redis.Pool{MaxIdle: 64, IdleTimeout: time.Minute,
		Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	client := ratelimit.New(redigoadapter.New(pool), ratelimit.Options{
		// Generous: an answer of the policy would not be Redis's.
		Timeout: 2 * time.Second,
		Policy:  ratelimit.FailClosed,
	})
	if _, ok := client.Detect(context.Background()); !ok {
		fmt.Fprintln(os.Stderr, "hot worker (go): no mode detected")
		os.Exit(1)
	}
	if strings.HasPrefix(*variant, "batched") {
		// Detected hot: 100 calls a second from this process, the default.
		client = client.WithBatching(ratelimit.NewBatching())
	}
	// "no limit": the route has no limit, the middleware lets it through untouched (its
	// floor); "headers only" adds the draft fields to that (the floor with what a limit owes).
	class := "*"
	if *variant == "no limit" || *variant == "headers only" {
		class = "other"
	}
	policies := []ratelimit.Policy{ratelimit.NewPolicy("hot", algorithm(*scenario, *limit))}
	m := ratelimit.NewMiddleware(client).Key(ratelimit.HeaderKey("x-api-key")).
		Limits("*", class, policies...).DenyCache(strings.HasSuffix(*variant, "deny cache"))
	var next http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
	if *variant == "headers only" {
		// The fields an admitted request gets, written by the middleware's own function on a
		// response of a route without limits.
		outcome := ratelimit.MultiOutcome{Allowed: true, Granted: 1, Decisions: []ratelimit.Decision{{
			Allowed: true, Remaining: 999_999_999, RetryAfterMs: 0, ResetAfterMs: 1, Limit: 1_000_000_000}}}
		next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ratelimit.RateLimitHeaders(policies, outcome, false, w.Header())
			_, _ = w.Write([]byte("ok"))
		})
	}
	handler := m.Handler(next)
	// One request: its status and whether the failure policy answered it.
	serve := func(ctx context.Context) (int, bool) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://hot/", nil)
		req.Header.Set("x-api-key", "hot")
		w := &writer{header: http.Header{}}
		handler.ServeHTTP(w, req)
		return w.status, w.header.Get("RateLimit-Degraded") != ""
	}
	if *overHTTP {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		srv := &http.Server{Handler: handler}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		url := "http://" + ln.Addr().String() + "/"
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *tasks, MaxConnsPerHost: *tasks}}
		serve = func(ctx context.Context) (int, bool) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("x-api-key", "hot")
			resp, err := hc.Do(req)
			if err != nil {
				return 0, false
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode, resp.Header.Get("RateLimit-Degraded") != ""
		}
	}
	var told *os.File
	if *admissions != "" {
		f, err := os.OpenFile(*admissions, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		told = f
	}

	fmt.Println("ready")
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	startMs, _ := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	time.Sleep(time.Until(time.UnixMilli(startMs)))
	cpu0 := cpuUs()
	began := time.Now()
	steady := began.Add(time.Second)
	end := began.Add(time.Duration(*seconds * float64(time.Second)))
	var admitted, admittedAfter1s, denied, other, degraded atomic.Uint64
	hists := make([]map[int]uint64, *tasks)
	var wg sync.WaitGroup
	for t := 0; t < *tasks; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			hist := map[int]uint64{}
			ctx := context.Background()
			for time.Now().Before(end) {
				t0 := time.Now()
				status, policy := serve(ctx)
				done := time.Now()
				hist[bucket(uint64(done.Sub(t0).Nanoseconds()))]++
				if policy {
					degraded.Add(1)
				}
				switch status {
				case http.StatusOK:
					admitted.Add(1)
					if done.After(steady) {
						admittedAfter1s.Add(1)
					}
					if told != nil {
						_, _ = told.Write([]byte{'a'})
					}
				case http.StatusTooManyRequests:
					denied.Add(1)
				default:
					other.Add(1)
				}
			}
			hists[t] = hist
		}(t)
	}
	wg.Wait()
	cpu := cpuUs() - cpu0
	c := m.Client()
	stats := c.BatchStats()
	returned := c.Close(context.Background())
	hist := map[int]uint64{}
	for _, h := range hists {
		for b, n := range h {
			hist[b] += n
		}
	}
	pairs := make([][2]uint64, 0, len(hist))
	for b, n := range hist {
		pairs = append(pairs, [2]uint64{uint64(b), n})
	}
	out, _ := json.Marshal(map[string]interface{}{
		"admitted": admitted.Load(), "admitted_after_1s": admittedAfter1s.Load(),
		"denied": denied.Load(), "other": other.Load(),
		"degraded": degraded.Load(), "held_at_end": stats.Held, "returned_at_end": returned,
		"lapsed": stats.Lapsed + (stats.Held - uint64(returned)), "refills": stats.Refills,
		"cpu_us": cpu, "hist": pairs,
	})
	fmt.Println(string(out))
	pool.Close()
}
