package tests

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"redis-rate-limiter/ratelimit"
)

// The middleware served by a real net/http server over TCP, beyond what the conformance table
// shows: leases renewed while a request outlasts them, a panicking handler, a cost reported
// after the response has started, the counters served over HTTP.

// The middleware is what routers take: chi's Use, gorilla/mux's Use, echo.WrapMiddleware and
// gin's adapters all take a func(http.Handler) http.Handler.
var _ func(http.Handler) http.Handler = (*ratelimit.Middleware)(nil).Handler

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String()
}

type response struct {
	status  int
	headers http.Header
	body    string
}

func get(t *testing.T, url string, header ...string) response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

func TestLeasesAreRenewedWhileARequestOutlastsThem(t *testing.T) {
	s := start(t, serverOpts{module: true})
	a := admin(t, s)
	m := ratelimit.NewMiddleware(client(s, ratelimit.Options{})).
		Key(ratelimit.HeaderKey("X-Api-Key")).
		Limits("*", "*", ratelimit.NewPolicy("inflight", ratelimit.Concurrency{Limit: 1, LeaseSec: 0.5})).
		LeaseKeepAlive(50 * time.Millisecond)
	release := make(chan struct{})
	url := serve(t, m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Wait") != "" {
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})))
	slow := make(chan response, 1)
	go func() { slow <- get(t, url, "X-Api-Key", "gina", "X-Wait", "1") }()
	waitFor(t, "the slow request holds its slot", func() bool {
		return zcard(t, a, "rl:{gina}:default:inflight") == 1
	})
	// Three leases later the slow request still holds its slot.
	time.Sleep(1500 * time.Millisecond)
	r := get(t, url, "X-Api-Key", "gina")
	if r.status != 429 || r.headers.Get("Retry-After") != "1" {
		t.Fatalf("%d %v %s", r.status, r.headers, r.body)
	}
	close(release)
	if r := <-slow; r.status != 200 || r.body != "ok" {
		t.Fatalf("%+v", r)
	}
	// Given back when the handler returned, before the response ended.
	if n := zcard(t, a, "rl:{gina}:default:inflight"); n != 0 {
		t.Fatalf("%d leases after the response", n)
	}
	if r := get(t, url, "X-Api-Key", "gina"); r.status != 200 {
		t.Fatalf("%+v", r)
	}
}

func TestAPanickingHandlerGivesItsSlotBack(t *testing.T) {
	s := start(t, serverOpts{module: true})
	a := admin(t, s)
	m := ratelimit.NewMiddleware(client(s, ratelimit.Options{})).
		Limits("*", "*", ratelimit.NewPolicy("inflight", ratelimit.Concurrency{Limit: 1, LeaseSec: 60}))
	url := serve(t, m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("the handler failed")
		}
		_, _ = io.WriteString(w, "ok")
	})))
	if r := get(t, url+"/panic"); r.status != -1 {
		t.Fatalf("a panic answered %+v", r)
	}
	if n := zcard(t, a, "rl:{127.0.0.1}:default:inflight"); n != 0 {
		t.Fatalf("%d leases after the panic", n)
	}
	r := get(t, url+"/")
	if r.status != 200 || r.headers.Get("RateLimit") != `"inflight";r=0;t=60` {
		t.Fatalf("%+v", r)
	}
}

// A cost reported once the response has started is still settled (the counters and the next
// request see it), but the response already carried the reservation's fields.
func TestACostReportedAfterTheFirstWriteIsSettled(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true})
	setClock(t, admin(t, s), t0)
	m := ratelimit.NewMiddleware(client(s, ratelimit.Options{})).
		Limits("*", "*", ratelimit.NewPolicy("tokens", ratelimit.TokenBucket{Capacity: 10000, RefillPerSec: 100})).
		Estimate("*", 4000)
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Metrics())
	mux.Handle("/", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
		ratelimit.SetActualCost(r, 1000)
	})))
	url := serve(t, mux)
	r := get(t, url+"/")
	if r.status != 200 || r.headers.Get("RateLimit") != `"tokens";r=6000;t=40` {
		t.Fatalf("%+v", r)
	}
	r = get(t, url+"/")
	if r.status != 200 || r.headers.Get("RateLimit") != `"tokens";r=5000;t=50` {
		t.Fatalf("the first one's refund: %+v", r)
	}
	r = get(t, url+"/metrics")
	want := "# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n" +
		"# TYPE ratelimit_decisions_total counter\n" +
		"ratelimit_decisions_total{limit=\"tokens\",outcome=\"allowed\"} 2\n" +
		"ratelimit_decisions_total{limit=\"tokens\",outcome=\"denied\"} 0\n" +
		"ratelimit_decisions_total{limit=\"tokens\",outcome=\"degraded\"} 0\n" +
		"# HELP ratelimit_settled_units_total Units given back (refunded) or taken (charged) when reservations were settled with their actual cost.\n" +
		"# TYPE ratelimit_settled_units_total counter\n" +
		"ratelimit_settled_units_total{limit=\"tokens\",direction=\"refunded\"} 6000\n" +
		"ratelimit_settled_units_total{limit=\"tokens\",direction=\"charged\"} 0\n"
	if r.status != 200 || r.body != want || !strings.HasPrefix(r.headers.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("%+v", r)
	}
}

// The client goes away while its request waits in the handler: the slot comes back at once,
// before the handler returns.
func TestAClientGoneAwayGivesItsSlotBackAtOnce(t *testing.T) {
	s := start(t, serverOpts{module: true})
	a := admin(t, s)
	m := ratelimit.NewMiddleware(client(s, ratelimit.Options{})).
		Limits("*", "*", ratelimit.NewPolicy("inflight", ratelimit.Concurrency{Limit: 1, LeaseSec: 60}))
	var returned int32
	stuck := make(chan struct{})
	defer close(stuck)
	url := serve(t, m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-stuck // a handler that ignores its context
		atomic.StoreInt32(&returned, 1)
	})))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the request holds its slot", func() bool {
		return zcard(t, a, "rl:{127.0.0.1}:default:inflight") == 1
	})
	cancel()
	<-done
	waitFor(t, "the slot comes back", func() bool {
		return zcard(t, a, "rl:{127.0.0.1}:default:inflight") == 0
	})
	if atomic.LoadInt32(&returned) != 0 {
		t.Fatal("the handler returned: the slot came back with it, not with the client")
	}
}
