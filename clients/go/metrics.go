package ratelimit

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Counts are one limit's counters.
type Counts struct {
	Allowed  uint64
	Denied   uint64
	Degraded uint64
	// Requests a shadow limit would have refused (and let through).
	ShadowDenied uint64
	// Whether the limit has been evaluated as a shadow limit.
	Shadow bool
	// Units given back by settlements (an actual cost below the estimate).
	Refunded uint64
	// Units taken by settlements (an actual cost above the estimate).
	Charged uint64
	// Admissions answered from a leased batch, without a call to Redis (among Allowed).
	Batch uint64
	// Denials answered by the deny cache, without a call to Redis (among Denied, or
	// ShadowDenied for a shadow limit).
	DenyCache uint64
}

// Metrics counts the middleware's decisions per limit, for Prometheus's text format. Safe for
// concurrent use, and without a lock on the way of a request: a limit's counters are found
// without one and counted with atomic additions (a reader may see one of an answer's counts
// before another). It is also an http.Handler serving that text (for /metrics).
type Metrics struct {
	// Limit name to *counters.
	byLimit sync.Map
}

// counters are one limit's Counts, each counted atomically.
type counters struct {
	allowed, denied, degraded, shadowDenied, refunded, charged, batch, denyCache atomic.Uint64
	shadow                                                                       atomic.Bool
}

// NewMetrics is an empty set of counters.
func NewMetrics() *Metrics {
	return &Metrics{}
}

func (m *Metrics) entry(limit string) *counters {
	if c, ok := m.byLimit.Load(limit); ok {
		return c.(*counters)
	}
	c, _ := m.byLimit.LoadOrStore(limit, &counters{})
	return c.(*counters)
}

// Record counts an enforced limit's answer.
func (m *Metrics) Record(limit string, allowed, degraded bool) {
	m.RecordAnswer(limit, allowed, degraded, NotLocal)
}

// RecordAnswer is Record and RecordLocal at once.
func (m *Metrics) RecordAnswer(limit string, allowed, degraded bool, local LocalAnswer) {
	c := m.entry(limit)
	if allowed {
		c.allowed.Add(1)
	} else {
		c.denied.Add(1)
	}
	if degraded {
		c.degraded.Add(1)
	}
	c.countLocal(local)
}

// RecordLocal counts an answer made in the process for limit (counted besides allowed or
// denied): outcome="batch" or outcome="deny_cache".
func (m *Metrics) RecordLocal(limit string, local LocalAnswer) {
	m.entry(limit).countLocal(local)
}

func (c *counters) countLocal(local LocalAnswer) {
	switch local {
	case LocalBatch:
		c.batch.Add(1)
	case LocalDenyCache:
		c.denyCache.Add(1)
	}
}

// RecordShadow counts a shadow limit's answer: allowed counts as allowed, a denial as
// shadow_denied (the request went through), never as denied.
func (m *Metrics) RecordShadow(limit string, allowed, degraded bool) {
	c := m.entry(limit)
	c.shadow.Store(true)
	if allowed {
		c.allowed.Add(1)
	} else {
		c.shadowDenied.Add(1)
	}
	if degraded {
		c.degraded.Add(1)
	}
}

// RecordSettled counts a settlement of delta units on limit: below 0 refunded, above 0 charged.
func (m *Metrics) RecordSettled(limit string, delta int64) {
	c := m.entry(limit)
	if delta < 0 {
		c.refunded.Add(uint64(-(delta + 1)) + 1)
	} else {
		c.charged.Add(uint64(delta))
	}
}

func (c *counters) counts() Counts {
	return Counts{Allowed: c.allowed.Load(), Denied: c.denied.Load(),
		Degraded: c.degraded.Load(), ShadowDenied: c.shadowDenied.Load(), Shadow: c.shadow.Load(),
		Refunded: c.refunded.Load(), Charged: c.charged.Load(), Batch: c.batch.Load(),
		DenyCache: c.denyCache.Load()}
}

// Counts are limit's counters (zero for a limit never counted).
func (m *Metrics) Counts(limit string) Counts {
	if c, ok := m.byLimit.Load(limit); ok {
		return c.(*counters).counts()
	}
	return Counts{}
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// Prometheus is the counters in Prometheus's text format:
// ratelimit_decisions_total{limit="...",outcome="allowed|denied|degraded"}, and for a limit
// evaluated as a shadow limit also outcome="shadow_denied", outcome="batch" once a limit has had
// an admission answered from a batch, outcome="deny_cache" once it has had a denial answered by
// the deny cache; then, once a settlement changed
// something, ratelimit_settled_units_total{limit="...",direction="refunded|charged"} for the
// limits that settled. Limits in byte order of their names.
func (m *Metrics) Prometheus() string {
	var names []string
	byName := map[string]Counts{}
	m.byLimit.Range(func(k, v interface{}) bool {
		n := k.(string)
		names = append(names, n)
		byName[n] = v.(*counters).counts()
		return true
	})
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n# TYPE ratelimit_decisions_total counter\n")
	line := func(metric, name, label, value string, v uint64) {
		b.WriteString(metric + `{limit="` + escapeLabel(name) + `",` + label + `="` + value + `"} ` +
			strconv.FormatUint(v, 10) + "\n")
	}
	settled := false
	for _, n := range names {
		c := byName[n]
		line("ratelimit_decisions_total", n, "outcome", "allowed", c.Allowed)
		line("ratelimit_decisions_total", n, "outcome", "denied", c.Denied)
		line("ratelimit_decisions_total", n, "outcome", "degraded", c.Degraded)
		if c.Shadow {
			line("ratelimit_decisions_total", n, "outcome", "shadow_denied", c.ShadowDenied)
		}
		// (batch and deny_cache: admissions and denials among those answered in the process.)
		if c.Batch > 0 {
			line("ratelimit_decisions_total", n, "outcome", "batch", c.Batch)
		}
		if c.DenyCache > 0 {
			line("ratelimit_decisions_total", n, "outcome", "deny_cache", c.DenyCache)
		}
		settled = settled || c.Refunded > 0 || c.Charged > 0
	}
	if settled {
		b.WriteString("# HELP ratelimit_settled_units_total Units given back (refunded) or taken (charged) when reservations were settled with their actual cost.\n# TYPE ratelimit_settled_units_total counter\n")
	}
	for _, n := range names {
		c := byName[n]
		if c.Refunded > 0 || c.Charged > 0 {
			line("ratelimit_settled_units_total", n, "direction", "refunded", c.Refunded)
			line("ratelimit_settled_units_total", n, "direction", "charged", c.Charged)
		}
	}
	return b.String()
}

// ServeHTTP serves Prometheus's text format.
func (m *Metrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(m.Prometheus()))
}
