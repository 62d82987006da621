package ratelimit

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Policy is a named limit of the HTTP middleware.
type Policy struct {
	Name      string
	Algorithm Algorithm
	// Shadow: evaluated and reported, never denying (see Shadowed).
	Shadow bool
}

// NewPolicy is an enforced policy.
func NewPolicy(name string, a Algorithm) Policy {
	return Policy{Name: name, Algorithm: a}
}

// Shadowed is this policy in shadow mode, for rolling a new limit out: it is evaluated on the
// requests that the route's enforced limits admit, each shadow policy in a call of its own after
// theirs, consuming as it would if it were enforced; its state is in the response's RateLimit
// fields and its answers in the counters (outcome="shadow_denied" for the requests it would have
// refused), but it never refuses a request, and the enforced limits decide and consume exactly
// as if it were not there. A request refused by an enforced limit is not counted against it (it
// is only peeked at, for the response fields).
func (p Policy) Shadowed() Policy {
	p.Shadow = true
	return p
}

// KeyFunc says who a request is counted against; false: nobody in particular (the key is then
// "anonymous").
type KeyFunc func(r *http.Request) (string, bool)

// visibleASCII says whether a header value is only visible ASCII and tabs.
func visibleASCII(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c > 0x7e {
			return false
		}
	}
	return true
}

// HeaderKey counts requests against the value of a header (an API key, a user id set by an
// authentication layer).
func HeaderKey(name string) KeyFunc {
	return func(r *http.Request) (string, bool) {
		v := r.Header.Get(name)
		if v == "" || !visibleASCII(v) {
			return "", false
		}
		return v, true
	}
}

// ClientIP counts requests against the client's IP: the peer address (Request.RemoteAddr), or,
// when the peer is one of trustedProxies, the rightmost address in X-Forwarded-For that is not a
// trusted proxy. X-Forwarded-For from anyone else is ignored.
func ClientIP(trustedProxies ...netip.Addr) KeyFunc {
	trusted := func(a netip.Addr) bool {
		for _, t := range trustedProxies {
			if t == a {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, bool) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil {
			return "", false
		}
		peer := ap.Addr().WithZone("")
		if !trusted(peer) {
			return peer.String(), true
		}
		var chain []netip.Addr
		for _, v := range r.Header.Values("X-Forwarded-For") {
			if !visibleASCII(v) {
				continue
			}
			for _, part := range strings.Split(v, ",") {
				a, err := netip.ParseAddr(strings.TrimSpace(part))
				if err != nil {
					chain = nil
					goto chosen
				}
				chain = append(chain, a)
			}
		}
	chosen:
		for i := len(chain) - 1; i >= 0; i-- {
			if !trusted(chain[i]) {
				return chain[i].String(), true
			}
		}
		return peer.String(), true
	}
}

type costKey struct{}

type costReport struct {
	mu    sync.Mutex
	set   bool
	units int64
}

// SetActualCost reports what the request really cost, in the units of its route's limits: the
// middleware settles the route's estimate with it (RL.SETTLE) before the response's header
// leaves, so call it before writing the response (a report after the first write is still
// settled, but the response's RateLimit field shows the reservation). Without it the estimate
// stands. r is the request the handler was given.
func SetActualCost(r *http.Request, units int64) {
	if rep, ok := r.Context().Value(costKey{}).(*costReport); ok && units >= 0 {
		rep.mu.Lock()
		rep.set, rep.units = true, units
		rep.mu.Unlock()
	}
}

// HeaderFormat is the format of the IETF RateLimit response fields (MiddlewareOptions).
type HeaderFormat int

const (
	// HeaderDraft11 is draft-ietf-httpapi-ratelimit-headers-11 (the zero value, the default until
	// the RFC): RateLimit-Policy: "per-minute";q=2;w=60 and RateLimit: "per-minute";r=1;t=60.
	HeaderDraft11 HeaderFormat = iota
	// HeaderDraft12 is the fields of the draft's next revision as its editors' text describes
	// them (pull request 166 of the working group's repository): RateLimit-Policy as in
	// draft-11; RateLimit with a (available, draft-11's r), w (effective window, draft-11's t)
	// and c (the units this request took from the policy: the route's estimate, 1 for a
	// concurrency limit, 0 on a 429 or for a shadow policy that would have refused it), as in
	// "per-minute";a=1;w=60;c=1; and RateLimit-Partition, one "<name>";client_id per policy
	// (each quota is the caller's own; the caller's key itself is not sent). Receivers ignore
	// parameters they do not know.
	HeaderDraft12
)

// String is "draft-11" or "draft-12".
func (f HeaderFormat) String() string {
	if f == HeaderDraft12 {
		return "draft-12"
	}
	return "draft-11"
}

// MiddlewareOptions are settings of the middleware given as one value (Middleware.Options); the
// zero value of each field is its default.
type MiddlewareOptions struct {
	// HeaderFormat is the format of the RateLimit fields: HeaderDraft11 (the zero value) or
	// HeaderDraft12. The legacy fields, Retry-After, RateLimit-Degraded and the bodies are the
	// same in both.
	HeaderFormat HeaderFormat
}

// Middleware limits HTTP requests: limits per route class and plan, the IETF RateLimit-Policy
// and RateLimit response fields (draft-ietf-httpapi-ratelimit-headers-11 by default, the next
// revision's fields with HeaderDraft12), optionally the older RateLimit-Limit / -Remaining /
// -Reset, 429 with Retry-After and a problem+json body,
// RateLimit-Degraded when Redis could not decide, and counters per limit. Configure it with its
// methods before serving, then wrap handlers with Handler (a func(http.Handler) http.Handler,
// for chi, gorilla/mux and the adapters of echo and gin).
type Middleware struct {
	// The client given to NewMiddleware, and the one the middleware decides with (with its
	// deny cache, or without one).
	base       *Client
	client     *Client
	key        KeyFunc
	routeClass func(*http.Request) string
	plan       func(*http.Request) string
	table      map[[2]string][]Policy
	limitsFn   func(plan, class string) []Policy
	estimates  map[string]int64
	legacy     bool
	format     HeaderFormat
	prefix     string
	keepAlive  time.Duration
	metrics    *Metrics
	onShadow   func(r *http.Request, names []string)
	detect     sync.Once
}

// NewMiddleware is a middleware deciding with c: every request counted against its client IP
// (no trusted proxy), route class and plan "default", no limits yet.
func NewMiddleware(c *Client) *Middleware {
	return &Middleware{
		base:       c,
		client:     c.WithDenyCache(DenyCacheEntries),
		key:        ClientIP(),
		routeClass: func(*http.Request) string { return "default" },
		plan:       func(*http.Request) string { return "default" },
		table:      map[[2]string][]Policy{},
		estimates:  map[string]int64{},
		prefix:     "rl",
		metrics:    NewMetrics(),
	}
}

// Key sets who requests are counted against (HeaderKey, ClientIP or a function).
func (m *Middleware) Key(f KeyFunc) *Middleware { m.key = f; return m }

// RouteClass sets the route class of a request (default "default" for every request).
func (m *Middleware) RouteClass(f func(*http.Request) string) *Middleware {
	m.routeClass = f
	return m
}

// Plan sets the plan of the request's client, looked up on every request (default "default").
func (m *Middleware) Plan(f func(*http.Request) string) *Middleware { m.plan = f; return m }

// Limits sets the limits of plan on route class ("*" matches any); all of them apply at once,
// the enforced ones in one RL.ALL. A request's limits are those of (plan, class), else ("*",
// class), else (plan, "*"), else ("*", "*").
func (m *Middleware) Limits(plan, class string, policies ...Policy) *Middleware {
	m.table[[2]string{plan, class}] = policies
	return m
}

// LimitsFunc computes the limits per request from (plan, class), instead of the table.
func (m *Middleware) LimitsFunc(f func(plan, class string) []Policy) *Middleware {
	m.limitsFn = f
	return m
}

// Estimate sets the units a request of route class ("*": any class without its own) consumes
// from each of its limits before the handler runs (default 1). A handler that reports its true
// cost with SetActualCost has the difference refunded or charged once it has produced its
// response's header; with no report the estimate stands. An estimate of 0 admits while a limit
// is not in debt and charges everything afterwards (on a route with a concurrency limit it
// would only peek at it: keep at least 1 there).
func (m *Middleware) Estimate(class string, units int64) *Middleware {
	m.estimates[class] = units
	return m
}

// LegacyHeaders also sends RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (default
// off).
func (m *Middleware) LegacyHeaders(on bool) *Middleware { m.legacy = on; return m }

// Options sets the settings given as one value (MiddlewareOptions: the RateLimit fields'
// HeaderFormat).
func (m *Middleware) Options(o MiddlewareOptions) *Middleware {
	m.format = o.HeaderFormat
	return m
}

// Prefix sets the prefix of the Redis keys (default "rl"): rl:{client}:class:limit, one hash
// tag per client so that a request's keys share a cluster slot.
func (m *Middleware) Prefix(p string) *Middleware { m.prefix = p; return m }

// LeaseKeepAlive renews the concurrency leases of requests still in flight every `every`
// (default: never; a request that outlasts lease_sec then loses its slot to the next request).
func (m *Middleware) LeaseKeepAlive(every time.Duration) *Middleware {
	m.keepAlive = every
	return m
}

// ShareMetrics counts into metrics (shared with another middleware or an exporter).
func (m *Middleware) ShareMetrics(metrics *Metrics) *Middleware { m.metrics = metrics; return m }

// OnShadowDenials is called with the names of the shadow policies that would have refused a
// request (in the route's order), for a log.
func (m *Middleware) OnShadowDenials(f func(r *http.Request, names []string)) *Middleware {
	m.onShadow = f
	return m
}

// DenyCache turns the deny cache on or off (on by default, DenyCacheEntries entries): a request
// denied by Redis with RetryAfterMs R is denied again in the process, without calling Redis,
// until R has passed (outcome="deny_cache"). Off: every request asks Redis (a deny cache of the
// client given to NewMiddleware is not used either). It counts down on the process's clock: a
// test that moves the server's clock turns it off.
func (m *Middleware) DenyCache(on bool) *Middleware {
	switch {
	case !on:
		m.client = m.base.WithoutDenyCache()
	case m.client.denies == nil:
		m.client = m.base.WithDenyCache(DenyCacheEntries)
	}
	return m
}

// DenyCacheEntries sets the deny cache's entries at most, the least recently used evicted first
// (turns it on).
func (m *Middleware) DenyCacheEntries(entries int) *Middleware {
	m.client = m.base.WithDenyCache(entries)
	return m
}

// Client is the client the middleware decides with (its deny cache included).
func (m *Middleware) Client() *Client { return m.client }

// Metrics are the middleware's counters.
func (m *Middleware) Metrics() *Metrics { return m.metrics }

// Prometheus is what to serve on /metrics: the middleware's counters (Metrics().Prometheus()),
// then the gauge ratelimit_breaker_open, 1 while the client's circuit breaker is open (Redis
// failed repeatedly and the failure policy answers without asking it), else 0
// (docs/monitoring/client_alerts.yml alerts on it).
func (m *Middleware) Prometheus() string {
	open := "0"
	if m.client.BreakerOpen() {
		open = "1"
	}
	return m.metrics.Prometheus() + "# HELP ratelimit_breaker_open Whether the client's circuit breaker is open: Redis failed repeatedly and the failure policy answers without asking it.\n# TYPE ratelimit_breaker_open gauge\nratelimit_breaker_open " + open + "\n"
}

// MetricsHandler serves Prometheus (the counters and the breaker's gauge) in Prometheus's text
// format, for /metrics.
func (m *Middleware) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(m.Prometheus()))
	})
}

func (m *Middleware) limitsFor(plan, class string) []Policy {
	if m.limitsFn != nil {
		return m.limitsFn(plan, class)
	}
	for _, k := range [][2]string{{plan, class}, {"*", class}, {plan, "*"}, {"*", "*"}} {
		if p, ok := m.table[k]; ok {
			return p
		}
	}
	return nil
}

func (m *Middleware) estimate(class string) int64 {
	if e, ok := m.estimates[class]; ok {
		return e
	}
	if e, ok := m.estimates["*"]; ok {
		return e
	}
	return 1
}

// Handler wraps next: requests with limits are checked before next runs. The first Handler
// of a middleware starts the client's mode detection in the background (Client.Detect), so
// that the first requests find it done or on its way; requests wait for it as any call does.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	m.detect.Do(func() {
		go m.client.Detect(context.Background())
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(next, w, r)
	})
}

// decide makes one call for limits: RL.ALL ... LEASE with a lease when a concurrency limit is
// among them, else a plain check.
func (m *Middleware) decide(ctx context.Context, limits []Limit, cost int64) (MultiOutcome,
	*Lease, error) {
	if hasConcurrency(limits) {
		o, err := m.client.AcquireAll(ctx, limits, cost)
		return o.Outcome, o.Lease, err
	}
	o, err := m.client.CheckAll(ctx, limits, cost)
	return o, nil, err
}

// shadowAnswer is a shadow policy's answer: its index, its outcome, whether it consumed.
type shadowAnswer struct {
	index    int
	outcome  MultiOutcome
	consumed bool
}

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	who, ok := m.key(r)
	if !ok {
		who = "anonymous"
	}
	class := m.routeClass(r)
	plan := m.plan(r)
	policies := m.limitsFor(plan, class)
	if len(policies) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	limits := make([]Limit, len(policies))
	for i, p := range policies {
		limits[i] = Limit{m.prefix + ":{" + who + "}:" + class + ":" + p.Name, p.Algorithm}
	}
	estimate := m.estimate(class)
	var enforced, shadows []int
	for i, p := range policies {
		if p.Shadow {
			shadows = append(shadows, i)
		} else {
			enforced = append(enforced, i)
		}
	}
	ePolicies := make([]Policy, len(enforced))
	eLimits := make([]Limit, len(enforced))
	for j, i := range enforced {
		ePolicies[j], eLimits[j] = policies[i], limits[i]
	}
	ctx := r.Context()
	outcome := MultiOutcome{Allowed: true}
	var leases []*Lease
	if len(eLimits) > 0 {
		o, lease, err := m.decide(ctx, eLimits, estimate)
		if err != nil {
			writeProblem(w, http.StatusInternalServerError, `{"detail":`+jsonString("rate limiter: "+
				err.Error())+`,"status":500,"title":"Internal Server Error","type":"about:blank"}`)
			return
		}
		outcome = o
		if lease != nil {
			leases = append(leases, lease)
		}
	}
	for i, p := range ePolicies {
		deniedHere := !outcome.Allowed && outcome.DeniedBy == i+1
		if outcome.Allowed || deniedHere {
			m.metrics.RecordAnswer(p.Name, outcome.Allowed, outcome.Degraded != NotDegraded,
				outcome.AnsweredLocally)
		}
	}
	var shadowed []shadowAnswer
	var denials []string
	if outcome.Allowed {
		for _, i := range shadows {
			// A shadow limit that Redis refuses is left out; it never fails a request.
			o, lease, err := m.decide(ctx, limits[i:i+1], estimate)
			if err != nil {
				continue
			}
			name := policies[i].Name
			m.metrics.RecordShadow(name, o.Allowed, o.Degraded != NotDegraded)
			if o.AnsweredLocally != NotLocal {
				m.metrics.RecordLocal(name, o.AnsweredLocally)
			}
			if !o.Allowed {
				denials = append(denials, name)
			}
			if lease != nil {
				leases = append(leases, lease)
			}
			shadowed = append(shadowed, shadowAnswer{i, o, o.Allowed})
		}
	} else if len(shadows) > 0 {
		sLimits := make([]Limit, len(shadows))
		for j, i := range shadows {
			sLimits[j] = limits[i]
		}
		if o, err := m.client.CheckAll(ctx, sLimits, 0); err == nil {
			for j, i := range shadows {
				d := o.Decisions[j]
				one := MultiOutcome{Allowed: d.Allowed, Decisions: []Decision{d},
					Degraded: o.Degraded, Mode: o.Mode}
				if !d.Allowed {
					one.DeniedBy = 1
				}
				shadowed = append(shadowed, shadowAnswer{i, one, false})
			}
		}
	}
	if m.keepAlive > 0 {
		for _, l := range leases {
			l.KeepAlive(m.keepAlive)
		}
	}
	if len(denials) > 0 && m.onShadow != nil {
		m.onShadow(r, denials)
	}
	// The fields list every policy answered for, in the route's order.
	fields := func(h http.Header, outcome MultiOutcome, shadowed []shadowAnswer) {
		// took: whether the request took units from the limit. Every enforced limit took them
		// when the request was admitted (one call, all or nothing), none when it was refused; a
		// shadow limit when it admitted the request too, and only then.
		type answer struct {
			index    int
			decision Decision
			took     bool
		}
		answers := make([]answer, 0, len(policies))
		for j, i := range enforced {
			answers = append(answers, answer{i, outcome.Decisions[j], outcome.Allowed})
		}
		degraded := outcome.Degraded
		for _, s := range shadowed {
			answers = append(answers, answer{s.index, s.outcome.Decisions[0],
				outcome.Allowed && s.consumed})
			if degraded == NotDegraded {
				degraded = s.outcome.Degraded
			}
		}
		sort.SliceStable(answers, func(a, b int) bool { return answers[a].index < answers[b].index })
		all := MultiOutcome{Allowed: outcome.Allowed, Degraded: degraded, Mode: outcome.Mode}
		shown := make([]Policy, len(answers))
		for k, a := range answers {
			shown[k] = policies[a.index]
			all.Decisions = append(all.Decisions, a.decision)
			if outcome.DeniedBy > 0 && a.index == enforced[outcome.DeniedBy-1] {
				all.DeniedBy = k + 1
			}
		}
		if m.format != HeaderDraft12 {
			RateLimitHeaders(shown, all, m.legacy, h)
			return
		}
		costs := make([]int64, len(answers))
		for k, a := range answers {
			if !a.took {
				continue
			}
			if _, ok := concurrencyOf(shown[k].Algorithm); ok {
				costs[k] = 1
			} else {
				costs[k] = estimate
			}
		}
		RateLimitHeadersAs(HeaderDraft12, shown, all, costs, m.legacy, h)
	}
	if !outcome.Allowed {
		h := w.Header()
		body, secs := tooMany(ePolicies, outcome)
		h.Set("Retry-After", strconv.FormatInt(secs, 10))
		fields(h, outcome, shadowed)
		writeProblem(w, http.StatusTooManyRequests, body)
		return
	}

	var once sync.Once
	release := func() {
		once.Do(func() {
			for _, l := range leases {
				_, _ = l.Release(context.Background())
			}
		})
	}
	defer release()
	if len(leases) > 0 {
		// The client went away: the slots come back at once, whatever the handler does.
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-ctx.Done():
				release()
			case <-done:
			}
		}()
	}
	report := &costReport{}
	settled := false
	// Settles the reported cost, once: when the response's header is about to leave, else
	// (reported after the first write) when the handler has returned.
	settleReported := func() {
		report.mu.Lock()
		set, actual := report.set, report.units
		report.mu.Unlock()
		if settled || !set {
			return
		}
		settled = true
		if actual == estimate {
			return
		}
		m.settle(ePolicies, eLimits, estimate, actual, &outcome)
		for k := range shadowed {
			if s := &shadowed[k]; s.consumed {
				i := s.index
				m.settle(policies[i:i+1], limits[i:i+1], estimate, actual, &s.outcome)
			}
		}
	}
	lw := &limitedWriter{ResponseWriter: w}
	lw.finalize = func(h http.Header) {
		settleReported()
		fields(h, outcome, shadowed)
	}
	next.ServeHTTP(lw, r.WithContext(context.WithValue(ctx, costKey{}, report)))
	lw.finish()
	settleReported()
}

// settle settles the request's estimate with its actual cost on every limit but the
// concurrency ones, and puts the state after settlement into outcome for the response fields.
// A settlement that could not be made where the estimate was taken (Redis did not answer)
// leaves outcome as it was, and a refusal too: the estimate then stands. A reservation made by
// the Local policy is settled in its in-process buckets.
func (m *Middleware) settle(policies []Policy, limits []Limit, estimate, actual int64,
	outcome *MultiOutcome) {
	var settled []int
	for i, l := range limits {
		if _, ok := concurrencyOf(l.Algorithm); !ok {
			settled = append(settled, i)
		}
	}
	// Admitted by FailOpen: nothing was taken, nothing to settle.
	if len(settled) == 0 || !(outcome.Degraded == NotDegraded || outcome.Degraded == DegradedLocal) {
		return
	}
	these := make([]Limit, len(settled))
	for j, i := range settled {
		these[j] = limits[i]
	}
	r := &Reservation{client: m.client, limits: these, estimate: estimate, charged: outcome.Degraded}
	s, err := r.Settle(context.Background(), actual)
	if err != nil || s.Degraded != outcome.Degraded {
		return
	}
	decisions := append([]Decision(nil), outcome.Decisions...)
	for j, i := range settled {
		decisions[i] = s.Decisions[j]
		m.metrics.RecordSettled(policies[i].Name, actual-estimate)
	}
	outcome.Decisions = decisions
}

func ceilMs(ms int64) int64 {
	if ms <= 0 {
		return 0
	}
	return ms/1000 + boolInt(ms%1000 != 0)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// sfString keeps a policy name to the characters a structured-field string may hold.
func sfString(name string) string {
	var b strings.Builder
	for _, c := range name {
		if c > ' ' && c < 0x7f && c != '"' && c != '\\' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// RateLimitHeaders sets the response fields for these policies and decisions (one decision per
// policy, in order) in the default format (HeaderDraft11): RateLimit-Policy and RateLimit, with
// legacy RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset from the limit that decided
// (the one that denied, else the enforced one with the fewest units left), and
// RateLimit-Degraded when the outcome did not come from Redis. A concurrency limit's policy has
// the quota unit qu="concurrent-requests" and no window.
func RateLimitHeaders(policies []Policy, outcome MultiOutcome, legacy bool, h http.Header) {
	RateLimitHeadersAs(HeaderDraft11, policies, outcome, nil, legacy, h)
}

// RateLimitHeadersAs sets the response fields as RateLimitHeaders does, in format: with
// HeaderDraft12, RateLimit's items carry a, w and c (costs: the units the request took from
// each policy, in the same order; a missing one is 0) and RateLimit-Partition is set.
func RateLimitHeadersAs(format HeaderFormat, policies []Policy, outcome MultiOutcome,
	costs []int64, legacy bool, h http.Header) {
	draft12 := format == HeaderDraft12
	policy := make([]string, 0, len(policies))
	state := make([]string, 0, len(policies))
	var partition []string
	for i, p := range policies {
		if i >= len(outcome.Decisions) {
			break
		}
		d := outcome.Decisions[i]
		name := `"` + sfString(p.Name) + `"`
		if _, ok := concurrencyOf(p.Algorithm); ok {
			policy = append(policy, name+";q="+integer(d.Limit)+`;qu="concurrent-requests"`)
		} else {
			policy = append(policy, name+";q="+integer(d.Limit)+";w="+
				integer(p.Algorithm.WindowSecs()))
		}
		if !draft12 {
			state = append(state, name+";r="+integer(d.Remaining)+";t="+
				integer(ceilMs(d.ResetAfterMs)))
			continue
		}
		var c int64
		if i < len(costs) {
			c = costs[i]
		}
		state = append(state, name+";a="+integer(d.Remaining)+";w="+
			integer(ceilMs(d.ResetAfterMs))+";c="+integer(c))
		partition = append(partition, name+";client_id")
	}
	h.Set("RateLimit-Policy", strings.Join(policy, ", "))
	h.Set("RateLimit", strings.Join(state, ", "))
	if draft12 {
		h.Set("RateLimit-Partition", strings.Join(partition, ", "))
	}
	if d, ok := tightest(policies, outcome); legacy && ok {
		h.Set("RateLimit-Limit", integer(d.Limit))
		h.Set("RateLimit-Remaining", integer(d.Remaining))
		h.Set("RateLimit-Reset", integer(ceilMs(d.ResetAfterMs)))
	}
	if outcome.Degraded != NotDegraded {
		h.Set("RateLimit-Degraded", outcome.Degraded.String())
	}
}

// tightest is the limit that decided: the one that denied, else the enforced one with the
// fewest units left (shadow policies never decide; with no enforced policy there is none).
func tightest(policies []Policy, outcome MultiOutcome) (Decision, bool) {
	if outcome.DeniedBy > 0 {
		if outcome.DeniedBy <= len(outcome.Decisions) {
			return outcome.Decisions[outcome.DeniedBy-1], true
		}
		return Decision{}, false
	}
	var best Decision
	found := false
	for i, p := range policies {
		if p.Shadow || i >= len(outcome.Decisions) {
			continue
		}
		if d := outcome.Decisions[i]; !found || d.Remaining < best.Remaining {
			best, found = d, true
		}
	}
	return best, found
}

// jsonString writes s as a JSON string the way the Rust middleware does (serde_json): quotes,
// backslashes and control characters escaped, everything else as it is.
func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range strings.ToValidUTF8(s, "\uFFFD") {
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte("0123456789abcdef"[c>>4])
				b.WriteByte("0123456789abcdef"[c&0xf])
			} else {
				b.WriteRune(c)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// tooMany is the problem+json body of a 429 and its Retry-After in whole seconds (rounded up, at
// least 1): the time until the denying limit admits the request, or until it is idle again
// when it never can.
func tooMany(policies []Policy, outcome MultiOutcome) (string, int64) {
	i := outcome.DeniedBy - 1
	if i < 0 {
		i = 0
	}
	d := outcome.Decisions[i]
	name := policies[i].Name
	wait := d.RetryAfterMs
	if wait < 0 {
		wait = d.ResetAfterMs
	}
	secs := ceilMs(wait)
	if secs < 1 {
		secs = 1
	}
	s := integer(secs)
	body := `{"detail":` + jsonString("rate limit '"+name+"' exceeded; retry in "+s+" s") +
		`,"limit":` + jsonString(name) + `,"retry_after":` + s +
		`,"status":429,"title":"Too Many Requests","type":"about:blank"}`
	return body, secs
}

func writeProblem(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// limitedWriter holds the response's header back until the handler writes (or returns), so
// that the RateLimit fields can show the state after the settlement of its actual cost.
type limitedWriter struct {
	http.ResponseWriter
	finalize func(http.Header)
	wrote    bool
}

func (w *limitedWriter) WriteHeader(code int) {
	if !w.wrote && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.wrote = true
		w.finalize(w.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *limitedWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Flush sends what was written so far (http.Flusher), the header first.
func (w *limitedWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands the connection over (http.Hijacker), the fields unsent.
func (w *limitedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		w.wrote = true
		return h.Hijack()
	}
	return nil, nil, errors.New("ratelimit: the response writer cannot be hijacked")
}

// Unwrap is the writer underneath (for http.ResponseController).
func (w *limitedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish sends the header of a handler that wrote nothing.
func (w *limitedWriter) finish() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
}
