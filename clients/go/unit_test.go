package ratelimit

import (
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// Unit tests of the parts that need no server: what is sent, the counters' text, the breaker,
// the local fallback and the response fields. Everything that talks to Redis is tested against
// real servers in tests/.

func TestParamsArePlainDecimals(t *testing.T) {
	cases := []struct {
		a       Algorithm
		params  []string
		keyword string
		quota   int64
		window  int64
	}{
		{TokenBucket{10, 0.0000001}, []string{"10", "0.0000001"}, "TOKENBUCKET", 10, 100000000},
		{GCRA{4, 1, 2.5}, []string{"4", "1", "2.5"}, "GCRA", 5, 13},
		{FixedWindow{3, 0.5}, []string{"3", "0.5"}, "FIXEDWINDOW", 3, 1},
		{SlidingLog{100, 60}, []string{"100", "60"}, "SLIDINGLOG", 100, 60},
		{Concurrency{3, 2.5}, []string{"3", "2.5"}, "CONCURRENCY", 3, 3},
		{LeakyBucket{7, 1e21}, []string{"7", "1000000000000000000000"}, "LEAKYBUCKET", 7, 1},
	}
	for _, c := range cases {
		if got := c.a.Params(); !reflect.DeepEqual(got, c.params) {
			t.Errorf("%T params %v, want %v", c.a, got, c.params)
		}
		if c.a.Keyword() != c.keyword || c.a.Quota() != c.quota || c.a.WindowSecs() != c.window {
			t.Errorf("%T: %s %d %d", c.a, c.a.Keyword(), c.a.Quota(), c.a.WindowSecs())
		}
	}
	if (FixedWindow{3, 0.5}).RatePerSec() != 6 || functionName("RL.TOKENBUCKET") != "rl_tokenbucket" {
		t.Fatal("rate or function name")
	}
}

func TestPrometheusText(t *testing.T) {
	m := NewMetrics()
	m.Record("api", true, false)
	m.Record("api", false, true)
	m.Record(`a"b`, true, false)
	want := "# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n" +
		"# TYPE ratelimit_decisions_total counter\n" +
		"ratelimit_decisions_total{limit=\"a\\\"b\",outcome=\"allowed\"} 1\n" +
		"ratelimit_decisions_total{limit=\"a\\\"b\",outcome=\"denied\"} 0\n" +
		"ratelimit_decisions_total{limit=\"a\\\"b\",outcome=\"degraded\"} 0\n" +
		"ratelimit_decisions_total{limit=\"api\",outcome=\"allowed\"} 1\n" +
		"ratelimit_decisions_total{limit=\"api\",outcome=\"denied\"} 1\n" +
		"ratelimit_decisions_total{limit=\"api\",outcome=\"degraded\"} 1\n"
	if got := m.Prometheus(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	m.RecordSettled("api", -30)
	m.RecordSettled("api", 5)
	m.RecordSettled("api", 0)
	m.RecordShadow("new", true, false)
	m.RecordShadow("new", false, true)
	want += "ratelimit_decisions_total{limit=\"new\",outcome=\"allowed\"} 1\n" +
		"ratelimit_decisions_total{limit=\"new\",outcome=\"denied\"} 0\n" +
		"ratelimit_decisions_total{limit=\"new\",outcome=\"degraded\"} 1\n" +
		"ratelimit_decisions_total{limit=\"new\",outcome=\"shadow_denied\"} 1\n" +
		"# HELP ratelimit_settled_units_total Units given back (refunded) or taken (charged) when reservations were settled with their actual cost.\n" +
		"# TYPE ratelimit_settled_units_total counter\n" +
		"ratelimit_settled_units_total{limit=\"api\",direction=\"refunded\"} 30\n" +
		"ratelimit_settled_units_total{limit=\"api\",direction=\"charged\"} 5\n"
	if got := m.Prometheus(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	rec := httptest.NewRecorder()
	m.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Body.String() != want || rec.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("served %q %q", rec.Header(), rec.Body.String())
	}
}

func TestBreakerOpensAndHalfOpens(t *testing.T) {
	b := newBreaker(BreakerConfig{Failures: 2, Cooldown: 50 * time.Millisecond})
	steps := []bool{b.permit()}
	b.failure()
	steps = append(steps, b.isOpen(), b.permit())
	b.failure()
	steps = append(steps, b.isOpen(), b.permit())
	time.Sleep(60 * time.Millisecond)
	steps = append(steps, b.permit(), b.permit()) // one trial at a time
	b.failure()
	steps = append(steps, b.permit())
	time.Sleep(60 * time.Millisecond)
	steps = append(steps, b.permit())
	b.success()
	steps = append(steps, b.isOpen(), b.permit())
	want := []bool{true, false, true, true, false, true, false, false, true, false, true}
	if !reflect.DeepEqual(steps, want) {
		t.Fatalf("got %v, want %v", steps, want)
	}
}

// A failure counts only if Redis answered no other call since the failed call began: calls that
// outlast the timeout while Redis answers others (a busy machine) do not open the breaker.
func TestBreakerCountsFailuresWithNoAnswerSince(t *testing.T) {
	b := newBreaker(BreakerConfig{Failures: 2, Cooldown: time.Hour})
	opened := b.openedChan()
	before := b.answered()
	b.success()
	b.failureSince(before)
	b.failureSince(before)
	steps := []bool{b.isOpen()}
	seen := b.answered()
	b.failureSince(seen)
	steps = append(steps, b.isOpen())
	select {
	case <-opened:
		t.Fatal("opened is closed while the breaker is")
	default:
	}
	b.failureSince(seen)
	steps = append(steps, b.isOpen())
	select {
	case <-opened:
	default:
		t.Fatal("the breaker opened and opened is not closed")
	}
	if want := []bool{false, false, true}; !reflect.DeepEqual(steps, want) {
		t.Fatalf("got %v, want %v", steps, want)
	}
}

func TestLocalBucketsTakeRefundAndGoIntoDebt(t *testing.T) {
	l := newLocalLimiter()
	// 100 tokens here, refilling one per 10,000 s: nothing refills during the test.
	a := TokenBucket{200, 0.0002}
	if d := l.check("k", a, 2, 40); !d.Allowed || d.Remaining != 60 || d.Limit != 100 {
		t.Fatalf("%+v", d)
	}
	r := l.adjust("k", a, 2, -30)
	if !r.Allowed || r.Remaining != 90 || r.ResetAfterMs < 99_999_000 || r.ResetAfterMs > 100_000_000 {
		t.Fatalf("%+v", r)
	}
	if l.adjust("k", a, 2, -50).Remaining != 100 || l.adjust("k", a, 2, 0).Remaining != 100 {
		t.Fatal("refunds stop at the capacity")
	}
	debt := l.adjust("k", a, 2, 130)
	if debt.Remaining != 0 || debt.ResetAfterMs < 1_299_999_000 || debt.ResetAfterMs > 1_300_000_000 {
		t.Fatalf("%+v", debt)
	}
	denied := l.check("k", a, 2, 1)
	if denied.Allowed || denied.RetryAfterMs < 309_999_000 || denied.RetryAfterMs > 310_000_000 {
		t.Fatalf("%+v", denied)
	}
	if deepest := l.adjust("k", a, 2, 1000); deepest.ResetAfterMs < 1_999_999_000 ||
		deepest.ResetAfterMs > 2_000_000_000 {
		t.Fatalf("a debt is at most one capacity: %+v", deepest)
	}
	if l.adjust("new", a, 2, -5).Remaining != 100 {
		t.Fatal("an unknown key starts full")
	}
	if over := l.check("x", a, 2, 101); over.Allowed || over.RetryAfterMs != -1 {
		t.Fatalf("a cost above the local capacity never passes: %+v", over)
	}
}

func TestLocalLeasesTakeRenewReleaseAndExpire(t *testing.T) {
	l := newLocalLeases()
	c := Concurrency{4, 0.2}
	a := l.acquire("k", "a", c, 2, true)
	if !a.Allowed || a.Remaining != 1 || a.RetryAfterMs != 0 || a.Limit != 2 ||
		a.ResetAfterMs <= 150 || a.ResetAfterMs > 200 {
		t.Fatalf("%+v", a)
	}
	if !l.acquire("k", "b", c, 2, true).Allowed {
		t.Fatal("second slot")
	}
	full := l.acquire("k", "c", c, 2, true)
	if full.Allowed || full.Remaining != 0 || full.RetryAfterMs <= 150 || full.RetryAfterMs > 200 {
		t.Fatalf("%+v", full)
	}
	if l.acquire("k", "c", c, 2, false).Allowed {
		t.Fatal("a peek takes nothing and is refused when full")
	}
	if r := l.acquire("k", "a", c, 2, true); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("a holder renews without a second slot: %+v", r)
	}
	if !l.release("k", "a") || l.release("k", "a") {
		t.Fatal("released once")
	}
	if l.acquire("k", "c", c, 2, true).Remaining != 0 {
		t.Fatal("the released slot is taken")
	}
	time.Sleep(210 * time.Millisecond)
	if d := l.acquire("k", "d", c, 2, false); !d.Allowed || d.Remaining != 2 || d.ResetAfterMs != 0 {
		t.Fatalf("%+v", d)
	}
	if l.release("k", "b") || len(l.keys) != 0 {
		t.Fatal("expired leases are gone")
	}
}

func TestClientIPTrustsOnlyItsProxies(t *testing.T) {
	key := ClientIP(netip.MustParseAddr("10.0.0.1"))
	req := func(peer string, xff ...string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		for _, x := range xff {
			r.Header.Add("X-Forwarded-For", x)
		}
		return r
	}
	for _, c := range []struct {
		r    *http.Request
		want string
	}{
		{req("10.0.0.1:5000", "9.9.9.9, 1.2.3.4"), "1.2.3.4"},
		{req("5.6.7.8:5000", "1.2.3.4"), "5.6.7.8"},
		{req("10.0.0.1:5000", "4.3.2.1, 10.0.0.1"), "4.3.2.1"},
		{req("10.0.0.1:5000", "4.3.2.1", "7.7.7.7"), "7.7.7.7"},
		{req("10.0.0.1:5000", "4.3.2.1, junk"), "10.0.0.1"},
		{req("[2001:db8::1]:443"), "2001:db8::1"},
	} {
		if got, ok := key(c.r); !ok || got != c.want {
			t.Errorf("%s %v: %q, want %q", c.r.RemoteAddr, c.r.Header.Values("X-Forwarded-For"), got, c.want)
		}
	}
	if _, ok := key(httptest.NewRequest("GET", "/", nil)); !ok {
		t.Error("httptest's RemoteAddr is an address")
	}
	if _, ok := HeaderKey("X-Api-Key")(httptest.NewRequest("GET", "/", nil)); ok {
		t.Error("no header, no key")
	}
}

func TestProblemBodiesAreSerdeJSON(t *testing.T) {
	body, secs := tooMany([]Policy{NewPolicy("per \"minute\"\n", FixedWindow{2, 60})},
		MultiOutcome{DeniedBy: 1, Decisions: []Decision{{RetryAfterMs: 40_001, Limit: 2}}})
	want := `{"detail":"rate limit 'per \"minute\"\n' exceeded; retry in 41 s","limit":"per \"minute\"\n","retry_after":41,"status":429,"title":"Too Many Requests","type":"about:blank"}`
	if body != want || secs != 41 {
		t.Fatalf("%s %d", body, secs)
	}
	if got := jsonString("<a&b>\x01\u00e9"); got != `"<a&b>\u0001`+"\u00e9\"" {
		t.Fatalf("%s", got)
	}
	h := http.Header{}
	RateLimitHeaders([]Policy{NewPolicy("in flight", Concurrency{3, 30}), NewPolicy("b", GCRA{0, 1, 2.5})},
		MultiOutcome{Allowed: true, Decisions: []Decision{{Allowed: true, Remaining: 2, ResetAfterMs: 30_000, Limit: 3},
			{Allowed: true, Remaining: 0, ResetAfterMs: 2_500, Limit: 1}}, Degraded: DegradedLocal}, true, h)
	wantH := http.Header{
		"Ratelimit-Policy":    {`"in_flight";q=3;qu="concurrent-requests", "b";q=1;w=3`},
		"Ratelimit":           {`"in_flight";r=2;t=30, "b";r=0;t=3`},
		"Ratelimit-Limit":     {"1"},
		"Ratelimit-Remaining": {"0"},
		"Ratelimit-Reset":     {"3"},
		"Ratelimit-Degraded":  {"local"},
	}
	if !reflect.DeepEqual(h, wantH) {
		t.Fatalf("%v", h)
	}
}

func TestDraft12Fields(t *testing.T) {
	policies := []Policy{NewPolicy("in flight", Concurrency{3, 30}), NewPolicy("b", GCRA{0, 1, 2.5}),
		NewPolicy("new", FixedWindow{1, 60}).Shadowed()}
	outcome := MultiOutcome{Allowed: true, Decisions: []Decision{
		{Allowed: true, Remaining: 2, ResetAfterMs: 30_000, Limit: 3},
		{Allowed: true, Remaining: 0, ResetAfterMs: 2_500, Limit: 1},
		{Allowed: false, Remaining: 0, RetryAfterMs: 59_000, ResetAfterMs: 59_000, Limit: 1}}}
	h := http.Header{}
	RateLimitHeadersAs(HeaderDraft12, policies, outcome, []int64{1, 7}, true, h)
	want := http.Header{
		"Ratelimit-Policy":    {`"in_flight";q=3;qu="concurrent-requests", "b";q=1;w=3, "new";q=1;w=60`},
		"Ratelimit":           {`"in_flight";a=2;w=30;c=1, "b";a=0;w=3;c=7, "new";a=0;w=59;c=0`},
		"Ratelimit-Partition": {`"in_flight";client_id, "b";client_id, "new";client_id`},
		"Ratelimit-Limit":     {"1"},
		"Ratelimit-Remaining": {"0"},
		"Ratelimit-Reset":     {"3"},
	}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("%v", h)
	}
	// Draft-11 through either function: the same bytes, no partition, costs unused.
	h11, h11As := http.Header{}, http.Header{}
	RateLimitHeaders(policies, outcome, false, h11)
	RateLimitHeadersAs(HeaderDraft11, policies, outcome, []int64{1, 7, 7}, false, h11As)
	want11 := http.Header{
		"Ratelimit-Policy": {`"in_flight";q=3;qu="concurrent-requests", "b";q=1;w=3, "new";q=1;w=60`},
		"Ratelimit":        {`"in_flight";r=2;t=30, "b";r=0;t=3, "new";r=0;t=59`},
	}
	if !reflect.DeepEqual(h11, want11) || !reflect.DeepEqual(h11As, want11) {
		t.Fatalf("%v %v", h11, h11As)
	}
	if HeaderFormat(0) != HeaderDraft11 || HeaderDraft11.String() != "draft-11" ||
		HeaderDraft12.String() != "draft-12" {
		t.Fatal("the zero value is draft-11")
	}
}

// A limiter's words are made once per client and algorithm value, the same words Params
// gives; a pointer's are made on each call (its value may change), and past maxWords values
// (NaN parameters never find theirs) they are made without being kept.
func TestLimiterWordsAreMadeOncePerValue(t *testing.T) {
	c := New(nil, Options{})
	a := GCRA{MaxBurst: 9, CountPerPeriod: 3, PeriodSec: 0.25}
	w := c.wordsOf(a)
	if w != c.wordsOf(GCRA{MaxBurst: 9, CountPerPeriod: 3, PeriodSec: 0.25}) {
		t.Fatal("the words of an equal value were made again")
	}
	want := []interface{}{"9", "3", "0.25"}
	if !reflect.DeepEqual(w.params, want) || w.command != "RL.GCRA" ||
		w.function != "rl_gcra" || w.sha != shas[scriptGCRA] {
		t.Fatalf("%+v", w)
	}
	p := &TokenBucket{Capacity: 5, RefillPerSec: 1}
	first := c.wordsOf(p)
	p.Capacity = 6
	if second := c.wordsOf(p); first == second ||
		!reflect.DeepEqual(second.params, []interface{}{"6", "1"}) {
		t.Fatalf("a pointer's words were kept: %+v", second.params)
	}
	for i := 0; i < 2*maxWords; i++ {
		c.wordsOf(TokenBucket{Capacity: int64(i), RefillPerSec: math.NaN()})
	}
	if n := c.wordCount.Load(); n != maxWords {
		t.Fatalf("%d words kept", n)
	}
	if intWord(7) != "7" || intWord(255) != "255" || intWord(256) != "256" || intWord(-1) != "-1" {
		t.Fatal("intWord")
	}
}

// Counted from many goroutines at once, without a lock: every answer counted, exactly.
func TestMetricsCountConcurrentAnswersExactly(t *testing.T) {
	m := NewMetrics()
	done := make(chan struct{})
	for g := 0; g < 8; g++ {
		go func(g int) {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 1000; i++ {
				m.RecordAnswer("api", i%4 != 0, i%10 == 0, LocalAnswer(i%3))
				m.RecordSettled("api", int64(g%2*2-1))
			}
		}(g)
	}
	for g := 0; g < 8; g++ {
		<-done
	}
	want := Counts{Allowed: 6000, Denied: 2000, Degraded: 800, Batch: 2664, DenyCache: 2664,
		Refunded: 4000, Charged: 4000}
	if got := m.Counts("api"); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
