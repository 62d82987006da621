package tests

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// The deny cache against the module with its clock stopped: the server's waits are exact, and
// the cache counts them down on the process's clock.

func TestTheDenyCacheAnswersUntilTheWaitAndProbesOnce(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true})
	a := admin(t, s)
	setClock(t, a, t0)
	ctx := context.Background()
	base := client(s, ratelimit.Options{Mode: ratelimit.ChooseModule, Timeout: time.Second})
	if _, ok := base.DenyCacheCapacity(); ok {
		t.Fatal("a plain client has a deny cache")
	}
	c := base.WithDenyCache(2)
	if n, ok := c.DenyCacheCapacity(); !ok || n != 2 {
		t.Fatalf("capacity %d, %v", n, ok)
	}
	// A window of 400 ms: the server, whose clock stands still, denies for 400 ms each time.
	window := ratelimit.FixedWindow{Limit: 1, WindowSec: 0.4}
	first, err := c.Check(ctx, "dc", window, 1)
	if err != nil || !first.Decision.Allowed || first.AnsweredLocally != ratelimit.NotLocal {
		t.Fatalf("first: %+v, %v", first, err)
	}
	sent := time.Now()
	denied, err := c.Check(ctx, "dc", window, 1)
	if err != nil || denied.Decision != (ratelimit.Decision{RetryAfterMs: 400, ResetAfterMs: 400, Limit: 1}) ||
		denied.AnsweredLocally != ratelimit.NotLocal || denied.Granted != 0 {
		t.Fatalf("denied by Redis: %+v, %v", denied, err)
	}
	until, ok := c.DeniedUntil([]ratelimit.Limit{{Key: "dc", Algorithm: window}}, 1)
	if !ok || until.Sub(sent) < 400*time.Millisecond || until.Sub(time.Now()) > 400*time.Millisecond {
		t.Fatalf("denied until %v after the call", until.Sub(sent))
	}
	// Twenty checks from the cache: no call, the waits counted down, never below 1 ms.
	for i := 0; i < 20; i++ {
		o, err := c.Check(ctx, "dc", window, 1)
		d := o.Decision
		if err != nil || o.AnsweredLocally != ratelimit.LocalDenyCache || d.Allowed || d.RetryAfterMs < 1 ||
			d.RetryAfterMs > 400 || d.ResetAfterMs > 400 || d.Limit != 1 || o.Mode != ratelimit.ModeModule {
			t.Fatalf("check %d: %+v, %v", i, o, err)
		}
	}
	if n := calls(t, a, "rl.fixedwindow"); n != 2 {
		t.Fatalf("%d calls for 22 checks, want 2", n)
	}
	// A plain client sharing the connection asks Redis.
	if o, _ := c.WithoutDenyCache().Check(ctx, "dc", window, 1); o.AnsweredLocally != ratelimit.NotLocal ||
		o.Decision.RetryAfterMs != 400 {
		t.Fatalf("without the cache: %+v", o)
	}
	// Past the wait, 50 checks at once: one probe asks Redis (denied again: a new entry), the
	// others are answered from the entry meanwhile.
	time.Sleep(time.Until(until) + 10*time.Millisecond)
	var wg sync.WaitGroup
	local := make(chan bool, 50)
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := c.Check(ctx, "dc", window, 1)
			if err != nil || o.Decision.Allowed {
				t.Errorf("after the wait: %+v, %v", o, err)
			}
			local <- o.AnsweredLocally == ratelimit.LocalDenyCache
		}()
	}
	wg.Wait()
	close(local)
	fromCache := 0
	for l := range local {
		if l {
			fromCache++
		}
	}
	if n := calls(t, a, "rl.fixedwindow"); n != 4 || fromCache != 49 {
		t.Fatalf("%d calls (want 4: one probe), %d of 50 from the cache", n, fromCache)
	}
	// A cost that can never be admitted (-1) is not kept; nor is a peek consulted.
	for i := 0; i < 2; i++ {
		if o, _ := c.Check(ctx, "dc", window, 2); o.Decision.RetryAfterMs != -1 || o.AnsweredLocally != ratelimit.NotLocal {
			t.Fatalf("cost 2: %+v", o)
		}
	}
	if n := calls(t, a, "rl.fixedwindow"); n != 6 {
		t.Fatalf("%d calls after two checks of cost 2, want 6", n)
	}
	// Two entries at most: a third evicts the least recently used ("dc").
	for _, k := range []string{"j", "j", "i", "i"} {
		if _, err := c.Check(ctx, k, window, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.DenyCacheLen(); n != 2 {
		t.Fatalf("%d entries, want 2", n)
	}
	if _, ok := c.DeniedUntil([]ratelimit.Limit{{Key: "dc", Algorithm: window}}, 1); ok {
		t.Fatal("dc's entry was not evicted")
	}
	if n := calls(t, a, "rl.fixedwindow"); n != 10 {
		t.Fatalf("%d calls, want 10", n)
	}
	// The server's window ends, the process's wait has not: the cache still denies j (never
	// admits); dc, evicted, asks Redis and is admitted.
	advanceClock(t, a, 400_000)
	if o, _ := c.Check(ctx, "j", window, 1); o.AnsweredLocally != ratelimit.LocalDenyCache {
		t.Fatalf("j: %+v", o)
	}
	if o, _ := c.Check(ctx, "dc", window, 1); !o.Decision.Allowed || o.AnsweredLocally != ratelimit.NotLocal {
		t.Fatalf("dc: %+v", o)
	}
	if n := calls(t, a, "rl.fixedwindow"); n != 11 {
		t.Fatalf("%d calls, want 11", n)
	}
}

func TestTheMiddlewaresDenyCacheIsOnByDefault(t *testing.T) {
	c := closedPort(ratelimit.Options{})
	m := ratelimit.NewMiddleware(c)
	if n, ok := m.Client().DenyCacheCapacity(); !ok || n != 10_000 || ratelimit.DenyCacheEntries != 10_000 {
		t.Fatalf("default: %d, %v", n, ok)
	}
	if _, ok := m.DenyCache(false).Client().DenyCacheCapacity(); ok {
		t.Fatal("off: still a deny cache")
	}
	if n, ok := m.DenyCacheEntries(5).Client().DenyCacheCapacity(); !ok || n != 5 {
		t.Fatalf("5 entries: %d, %v", n, ok)
	}
	if _, ok := c.DenyCacheCapacity(); ok {
		t.Fatal("the client given to the middleware changed")
	}
}

// The middleware's /metrics: the counters, then the breaker's gauge, 0 and then 1 once Redis
// (a closed port) failed twice.
func TestTheMiddlewareExportsTheBreakerGauge(t *testing.T) {
	c := closedPort(ratelimit.Options{Breaker: ratelimit.BreakerConfig{Failures: 2, Cooldown: time.Minute}})
	m := ratelimit.NewMiddleware(c).Key(ratelimit.HeaderKey("X-Api-Key")).
		Limits("*", "*", ratelimit.NewPolicy("pm", ratelimit.FixedWindow{Limit: 5, WindowSec: 60}))
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	metrics := func() string {
		rec := httptest.NewRecorder()
		m.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
			t.Fatalf("content-type %q", ct)
		}
		return rec.Body.String()
	}
	const help = "# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n# TYPE ratelimit_decisions_total counter\n"
	const gauge = "# HELP ratelimit_breaker_open Whether the client's circuit breaker is open: Redis failed repeatedly and the failure policy answers without asking it.\n# TYPE ratelimit_breaker_open gauge\nratelimit_breaker_open "
	if got := metrics(); got != help+gauge+"0\n" {
		t.Fatalf("before any request:\n%s", got)
	}
	for i := 0; i < 3; i++ {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Api-Key", "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || rec.Header().Get("RateLimit-Degraded") != "fail-open" {
			t.Fatalf("request %d: %d %v", i, rec.Code, rec.Header())
		}
	}
	want := help + `ratelimit_decisions_total{limit="pm",outcome="allowed"} 3` + "\n" +
		`ratelimit_decisions_total{limit="pm",outcome="denied"} 0` + "\n" +
		`ratelimit_decisions_total{limit="pm",outcome="degraded"} 3` + "\n" + gauge + "1\n"
	if got := metrics(); got != want || m.Prometheus() != want {
		t.Fatalf("after the breaker opened:\n%s", got)
	}
}

// A batch's lease ends on a timer: a fixed window's unused units go back (RL.SETTLE), a sliding
// window's lapse, and B halves; a key checked DetectPerSec times within a second is batched
// without being declared.
func TestABatchGoesBackWhenItsLeaseEnds(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true})
	a := admin(t, s)
	setClock(t, a, t0)
	ctx := context.Background()
	c := client(s, ratelimit.Options{Mode: ratelimit.ChooseModule, Timeout: time.Second}).
		WithBatching(ratelimit.NewBatching().HotKey("fw").HotKey("sw").Lease(100 * time.Millisecond))
	fw := ratelimit.FixedWindow{Limit: 100, WindowSec: 3600}
	sw := ratelimit.SlidingWindow{Limit: 100, WindowSec: 3600}
	for _, k := range []struct {
		key string
		a   ratelimit.Algorithm
	}{{"fw", fw}, {"sw", sw}} {
		o, err := c.Check(ctx, k.key, k.a, 1)
		if err != nil || !o.Decision.Allowed || o.Decision.Remaining != 99 || o.AnsweredLocally != ratelimit.NotLocal {
			t.Fatalf("%s: %+v, %v", k.key, o, err)
		}
	}
	// Two grants of 8, one unit of each used: 14 held.
	if st := c.BatchStats(); st != (ratelimit.BatchStats{Refills: 2, Granted: 16, Used: 2, Held: 14}) {
		t.Fatalf("before the leases end: %+v", st)
	}
	waitFor(t, "the leases to end", func() bool { return c.BatchStats().Held == 0 })
	waitFor(t, "the returns", func() bool { st := c.BatchStats(); return st.Returned+st.Lapsed == 14 })
	if st := c.BatchStats(); st != (ratelimit.BatchStats{Refills: 2, Granted: 16, Used: 2, Returned: 7, Lapsed: 7}) {
		t.Fatalf("after the leases ended: %+v", st)
	}
	if v, _ := redis.String(a.Do("GET", "fw")); !strings.HasPrefix(v, "fw 1 ") {
		t.Fatalf("fw holds %q: the 7 units went back", v)
	}
	for _, k := range []string{"fw", "sw"} {
		if b, ok := c.BatchSize([]ratelimit.Limit{{Key: k, Algorithm: map[string]ratelimit.Algorithm{"fw": fw, "sw": sw}[k]}}); !ok || b != 4 {
			t.Fatalf("%s: B %d, %v (8 halved)", k, b, ok)
		}
	}
	if n := calls(t, a, "rl.settle"); n != 1 {
		t.Fatalf("%d RL.SETTLE, want 1 (the sliding window's units lapse)", n)
	}

	// Detection: a key checked 5 times within a second is hot from its 5th call.
	d := client(s, ratelimit.Options{Mode: ratelimit.ChooseModule, Timeout: time.Second}).
		WithBatching(ratelimit.NewBatching().DetectPerSec(5).Lease(time.Minute))
	before := calls(t, a, "rl.fixedwindow")
	for i := 0; i < 10; i++ {
		o, err := d.Check(ctx, "detected", fw, 1)
		if err != nil || !o.Decision.Allowed || o.Decision.Remaining != int64(99-i) ||
			(o.AnsweredLocally == ratelimit.LocalBatch) != (i >= 5 && i < 12) {
			t.Fatalf("check %d: %+v, %v", i, o, err)
		}
	}
	// Four calls one by one, the fifth takes a batch of 8 (UPTO), the next five from it.
	if n := calls(t, a, "rl.fixedwindow") - before; n != 5 {
		t.Fatalf("%d calls for 10 checks, want 5", n)
	}
	if got := d.Close(ctx); got != 2 {
		t.Fatalf("close gave back %d, want 2", got)
	}
	if v, _ := redis.String(a.Do("GET", "detected")); !strings.HasPrefix(v, "fw 10 ") {
		t.Fatalf("detected holds %q", v)
	}
}

// A caller that goes away while its refill is in flight does not cancel it: the grant completes
// and is kept, the unit the caller would have used goes back, and the next check is answered
// from the batch.
func TestACallerGoneDuringARefillLosesNoUnits(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true, extra: []string{"--enable-debug-command", "yes"}})
	a := admin(t, s)
	setClock(t, a, t0)
	c := client(s, ratelimit.Options{Mode: ratelimit.ChooseModule, Timeout: 2 * time.Second}).
		WithBatching(ratelimit.NewBatching().HotKey("slow").Lease(time.Minute))
	fw := ratelimit.FixedWindow{Limit: 100, WindowSec: 3600}
	// The server busy for 400 ms.
	sleeper, err := redis.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer sleeper.Close()
	slept := make(chan error, 1)
	go func() {
		_, err := sleeper.Do("DEBUG", "SLEEP", "0.4")
		slept <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	o, err := c.Check(ctx, "slow", fw, 1)
	if err != nil || o.Degraded != ratelimit.DegradedFailOpen {
		t.Fatalf("the caller that gave up: %+v, %v", o, err)
	}
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	// The grant of 8 landed: 7 kept, the caller's unit given back.
	waitFor(t, "the caller's unit back", func() bool { return c.BatchStats().Returned == 1 })
	if st := c.BatchStats(); st != (ratelimit.BatchStats{Refills: 1, Granted: 8, Returned: 1, Held: 7}) {
		t.Fatalf("%+v", st)
	}
	if v, _ := redis.String(a.Do("GET", "slow")); !strings.HasPrefix(v, "fw 7 ") {
		t.Fatalf("slow holds %q", v)
	}
	// Its remaining: the grant's (92) plus what the batch holds after it (6).
	next, err := c.Check(context.Background(), "slow", fw, 1)
	if err != nil || next.AnsweredLocally != ratelimit.LocalBatch || next.Decision.Remaining != 92+6 {
		t.Fatalf("the next check: %+v, %v", next, err)
	}
}
