package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// The conformance table (clients/conformance/cases.json, format in its README.md) replayed
// through this package against a real server under the test clock, in the module, Functions and
// script modes, with the middleware served over TCP by net/http: every answer must be the one
// the table records, which is what the Rust crate answers. CONFORMANCE_CASE=<text> replays only
// the cases whose name contains it.

var modes = []string{"module", "function", "script"}

// fields are the response fields the table records, when present.
var fields = []string{"ratelimit-policy", "ratelimit", "ratelimit-partition", "ratelimit-limit",
	"ratelimit-remaining", "ratelimit-reset", "ratelimit-degraded", "retry-after", "content-type"}

type obj = map[string]interface{}

func str(v interface{}) string {
	s, _ := v.(string)
	return s
}

func num(v interface{}) float64 {
	f, _ := v.(float64)
	return f
}

func i64(v interface{}) int64 { return int64(num(v)) }

func algorithm(v obj) ratelimit.Algorithm {
	switch str(v["algorithm"]) {
	case "token_bucket":
		return ratelimit.TokenBucket{Capacity: i64(v["capacity"]), RefillPerSec: num(v["refill_per_sec"])}
	case "leaky_bucket":
		return ratelimit.LeakyBucket{Capacity: i64(v["capacity"]), LeakPerSec: num(v["leak_per_sec"])}
	case "fixed_window":
		return ratelimit.FixedWindow{Limit: i64(v["limit"]), WindowSec: num(v["window_sec"])}
	case "sliding_window":
		return ratelimit.SlidingWindow{Limit: i64(v["limit"]), WindowSec: num(v["window_sec"])}
	case "sliding_log":
		return ratelimit.SlidingLog{Limit: i64(v["limit"]), WindowSec: num(v["window_sec"])}
	case "gcra":
		return ratelimit.GCRA{MaxBurst: i64(v["max_burst"]), CountPerPeriod: i64(v["count_per_period"]),
			PeriodSec: num(v["period_sec"])}
	case "concurrency":
		return ratelimit.Concurrency{Limit: i64(v["limit"]), LeaseSec: num(v["lease_sec"])}
	}
	panic(fmt.Sprintf("unknown algorithm %v", v["algorithm"]))
}

// batching is a case's options.batching.
func batching(b obj) ratelimit.Batching {
	cfg := ratelimit.NewBatching()
	if keys, ok := b["hot_keys"].([]interface{}); ok {
		for _, k := range keys {
			cfg = cfg.HotKey(str(k))
		}
	}
	if v, ok := b["initial"]; ok {
		cfg = cfg.Initial(i64(v))
	}
	if v, ok := b["max_batch"]; ok {
		cfg = cfg.MaxBatch(i64(v))
	}
	if v, ok := b["remaining_share"]; ok {
		cfg = cfg.RemainingShare(i64(v))
	}
	if v, ok := b["lease_ms"]; ok {
		cfg = cfg.Lease(time.Duration(i64(v)) * time.Millisecond)
	}
	if v, ok := b["detect_per_sec"]; ok {
		cfg = cfg.DetectPerSec(int(i64(v)))
	}
	return cfg
}

func caseOptions(c obj, mode string) ratelimit.Options {
	o, _ := c["options"].(obj)
	opts := ratelimit.Options{}
	switch str(o["policy"]) {
	case "fail_closed":
		opts.Policy = ratelimit.FailClosed
	case "local":
		opts.Policy = ratelimit.Local(int(i64(o["instances"])))
	}
	switch mode {
	case "module":
		opts.Mode = ratelimit.ChooseModule
	case "function":
		opts.Mode = ratelimit.ChooseFunction
	default:
		opts.Mode = ratelimit.ChooseScript
	}
	if v, ok := o["timeout_ms"]; ok {
		opts.Timeout = time.Duration(i64(v)) * time.Millisecond
	}
	if v, ok := o["fail_closed_retry_ms"]; ok {
		opts.FailClosedRetryMs = i64(v)
	}
	if v, ok := o["breaker_failures"]; ok {
		opts.Breaker.Failures = int(i64(v))
	}
	if v, ok := o["breaker_cooldown_ms"]; ok {
		opts.Breaker.Cooldown = time.Duration(i64(v)) * time.Millisecond
	}
	return opts
}

func decision(d ratelimit.Decision) []interface{} {
	a := 0
	if d.Allowed {
		a = 1
	}
	return []interface{}{a, d.Remaining, d.RetryAfterMs, d.ResetAfterMs, d.Limit}
}

func decisions(ds []ratelimit.Decision) []interface{} {
	out := make([]interface{}, len(ds))
	for i, d := range ds {
		out[i] = decision(d)
	}
	return out
}

func errorObs(err error) obj {
	var rejected *ratelimit.RejectedError
	var unsupported *ratelimit.UnsupportedError
	switch {
	case errors.As(err, &rejected):
		return obj{"error": "rejected", "message": rejected.Message}
	case errors.As(err, &unsupported):
		return obj{"error": "unsupported"}
	case errors.Is(err, ratelimit.ErrUnavailable):
		return obj{"error": "unavailable"}
	}
	panic(fmt.Sprintf("an error of no class: %v", err))
}

// replyJSON is a reply of the admin connection as the table writes it.
func replyJSON(v interface{}) interface{} {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case []interface{}:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = replyJSON(e)
		}
		return out
	}
	return v
}

// canonical is v as the table's JSON reads back (numbers as float64).
func canonical(v interface{}) interface{} {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out interface{}
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

// matches says whether got is what expect says: equal, where [min, max] stands for a number in
// that range.
func matches(expect, got interface{}) bool {
	switch e := expect.(type) {
	case []interface{}:
		if n, ok := got.(float64); ok {
			if len(e) != 2 {
				return false
			}
			lo, ok1 := e[0].(float64)
			hi, ok2 := e[1].(float64)
			return ok1 && ok2 && lo <= n && n <= hi
		}
		g, ok := got.([]interface{})
		if !ok || len(g) != len(e) {
			return false
		}
		for i := range e {
			if !matches(e[i], g[i]) {
				return false
			}
		}
		return true
	case obj:
		g, ok := got.(obj)
		if !ok || len(g) != len(e) {
			return false
		}
		for k, x := range e {
			y, ok := g[k]
			if !ok || !matches(x, y) {
				return false
			}
		}
		return true
	}
	return expect == got
}

func expectation(step obj, mode string) interface{} {
	e := step["expect"]
	if o, ok := e.(obj); ok {
		for _, m := range modes {
			if _, ok := o[m]; ok {
				return o[mode]
			}
		}
	}
	return e
}

// gate holds a request in its handler: entered closes when the handler runs, release lets it
// return.
type gate struct {
	entered, release chan struct{}
}

type gates struct {
	mu     sync.Mutex
	byName map[string]*gate
}

func (g *gates) get(name string) *gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byName[name] == nil {
		g.byName[name] = &gate{make(chan struct{}), make(chan struct{})}
	}
	return g.byName[name]
}

// handler is the table's handler: "ok", the actual cost from x-used, held while x-hold names a
// gate, and /stream never ends (a line every 20 ms until the client goes away).
func handler(g *gates) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := r.Header.Get("X-Hold"); name != "" {
			held := g.get(name)
			close(held.entered)
			<-held.release
		}
		if used := r.Header.Get("X-Used"); used != "" {
			n, _ := strconv.ParseInt(used, 10, 64)
			ratelimit.SetActualCost(r, n)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if r.URL.Path != "/stream" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := io.WriteString(w, "tick\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	})
}

// middleware builds the case's layer on c; shadow denials are kept per request id.
func middleware(c obj, cl *ratelimit.Client, denials *sync.Map) *ratelimit.Middleware {
	l := c["layer"].(obj)
	limits, _ := c["limits"].(obj)
	m := ratelimit.NewMiddleware(cl)
	if key, ok := l["key"].(obj); ok {
		if h, ok := key["header"].(string); ok {
			m.Key(ratelimit.HeaderKey(h))
		} else if proxies, ok := key["client_ip"].([]interface{}); ok {
			var trusted []netip.Addr
			for _, p := range proxies {
				trusted = append(trusted, netip.MustParseAddr(str(p)))
			}
			m.Key(ratelimit.ClientIP(trusted...))
		}
	}
	if plan, ok := l["plan"].(obj); ok {
		h, def := str(plan["header"]), str(plan["default"])
		if def == "" {
			def = "default"
		}
		m.Plan(func(r *http.Request) string {
			if v := r.Header.Get(h); v != "" {
				return v
			}
			return def
		})
	}
	switch rc := l["route_class"].(type) {
	case string:
		m.RouteClass(func(r *http.Request) string { return strings.TrimLeft(r.URL.Path, "/") })
	case obj:
		prefixes, _ := rc["prefixes"].([]interface{})
		def := str(rc["default"])
		m.RouteClass(func(r *http.Request) string {
			for _, p := range prefixes {
				pair := p.([]interface{})
				if strings.HasPrefix(r.URL.Path, str(pair[0])) {
					return str(pair[1])
				}
			}
			return def
		})
	}
	for _, e := range l["limits"].([]interface{}) {
		entry := e.(obj)
		var policies []ratelimit.Policy
		for _, p := range entry["policies"].([]interface{}) {
			po := p.(obj)
			policy := ratelimit.NewPolicy(str(po["name"]), algorithm(limits[str(po["limit"])].(obj)))
			if po["shadow"] == true {
				policy = policy.Shadowed()
			}
			policies = append(policies, policy)
		}
		m.Limits(str(entry["plan"]), str(entry["class"]), policies...)
	}
	if est, ok := l["estimates"].(obj); ok {
		for class, units := range est {
			m.Estimate(class, i64(units))
		}
	}
	m.LegacyHeaders(l["legacy_headers"] == true)
	// Off unless the case turns it on: it counts down on the process's clock, not the test's.
	m.DenyCache(l["deny_cache"] == true)
	switch f := l["header_format"]; f {
	case nil, "draft-11":
		m.Options(ratelimit.MiddlewareOptions{HeaderFormat: ratelimit.HeaderDraft11})
	case "draft-12":
		m.Options(ratelimit.MiddlewareOptions{HeaderFormat: ratelimit.HeaderDraft12})
	default:
		panic(fmt.Sprintf("header_format %v", f))
	}
	m.OnShadowDenials(func(r *http.Request, names []string) {
		denials.Store(r.Header.Get("X-Request-Id"), append([]string(nil), names...))
	})
	return m
}

// run is one mode's replay of a case.
type run struct {
	t            *testing.T
	c            obj
	mode         string
	client       *ratelimit.Client
	admin        redis.Conn
	leases       map[string]*ratelimit.Lease
	reservations map[string]*ratelimit.Reservation
	mw           *ratelimit.Middleware
	httpAddr     string
	gates        *gates
	held         map[string]chan obj
	denials      *sync.Map
	requests     int
	problems     []string
}

func (r *run) algorithm(name interface{}) ratelimit.Algorithm {
	limits := r.c["limits"].(obj)
	l, ok := limits[str(name)].(obj)
	if !ok {
		panic(fmt.Sprintf("no limit %v", name))
	}
	return algorithm(l)
}

func (r *run) limits(v interface{}) []ratelimit.Limit {
	var out []ratelimit.Limit
	for _, p := range v.([]interface{}) {
		pair := p.([]interface{})
		out = append(out, ratelimit.Limit{Key: str(pair[0]), Algorithm: r.algorithm(pair[1])})
	}
	return out
}

// provenance adds degraded when the answer did not come from Redis, and otherwise checks that
// the run's mode answered.
func (r *run) provenance(o obj, degraded ratelimit.Degraded, mode ratelimit.Mode) obj {
	if degraded != ratelimit.NotDegraded {
		o["degraded"] = degraded.String()
	} else if mode.String() != r.mode {
		r.problems = append(r.problems, fmt.Sprintf("answered by %v in %s mode", mode, r.mode))
	}
	return o
}

func (r *run) holdLease(arg obj, admitted bool, lease *ratelimit.Lease, o obj) {
	if (lease != nil) != admitted {
		r.problems = append(r.problems, fmt.Sprintf("lease %v, admitted %v", lease != nil, admitted))
	}
	if lease == nil {
		return
	}
	if !lease.HoldsSlot() {
		o["holds_slot"] = false
	}
	name := str(arg["lease"])
	if name == "" {
		name = str(arg["id"])
	}
	if id, ok := arg["id"].(string); ok && (lease.ID() != id || lease.Key() != str(arg["key"])) {
		r.problems = append(r.problems, fmt.Sprintf("lease %s on %s", lease.ID(), lease.Key()))
	}
	r.leases[name] = lease
}

func (r *run) holdReservation(arg obj, admitted bool, res *ratelimit.Reservation) {
	if (res != nil) != admitted {
		r.problems = append(r.problems, fmt.Sprintf("reservation %v, admitted %v", res != nil, admitted))
	}
	if res != nil {
		r.reservations[str(arg["reservation"])] = res
	}
}

func cost(arg obj, name string) int64 {
	if v, ok := arg[name]; ok {
		return i64(v)
	}
	return 1
}

func (r *run) multi(o ratelimit.MultiOutcome) obj {
	return r.local(r.provenance(obj{"allowed": o.Allowed, "denied_by": o.DeniedBy,
		"decisions": decisions(o.Decisions)}, o.Degraded, o.Mode), o.AnsweredLocally)
}

// local adds answered_locally when the client answered without calling Redis.
func (r *run) local(o obj, l ratelimit.LocalAnswer) obj {
	if l != ratelimit.NotLocal {
		o["answered_locally"] = l.String()
	}
	return o
}

// step replays one step: its observation, to compare with its expect.
func (r *run) step(op string, v interface{}) interface{} {
	ctx := context.Background()
	arg, _ := v.(obj)
	switch op {
	case "check", "peek":
		a := r.algorithm(arg["limit"])
		var o ratelimit.Outcome
		var err error
		if op == "peek" {
			o, err = ratelimit.NewLimiter(r.client, a).Peek(ctx, str(arg["key"]))
		} else {
			o, err = r.client.Check(ctx, str(arg["key"]), a, cost(arg, "cost"))
		}
		if err != nil {
			return errorObs(err)
		}
		return r.local(r.provenance(obj{"decision": decision(o.Decision)}, o.Degraded, o.Mode),
			o.AnsweredLocally)
	case "check_all":
		o, err := r.client.CheckAll(ctx, r.limits(arg["limits"]), cost(arg, "cost"))
		if err != nil {
			return errorObs(err)
		}
		return r.multi(o)
	case "flush":
		return obj{"returned": r.client.Flush(ctx)}
	case "close":
		return obj{"returned": r.client.Close(ctx)}
	case "check_upto":
		o, err := r.client.CheckUpto(ctx, str(arg["key"]), r.algorithm(arg["limit"]), i64(arg["upto"]))
		if err != nil {
			return errorObs(err)
		}
		return r.provenance(obj{"decision": decision(o.Decision), "granted": o.Granted}, o.Degraded,
			o.Mode)
	case "check_all_upto":
		o, err := r.client.CheckAllUpto(ctx, r.limits(arg["limits"]), i64(arg["upto"]))
		if err != nil {
			return errorObs(err)
		}
		m := r.multi(o)
		m["granted"] = o.Granted
		return m
	case "acquire":
		c := r.algorithm(arg["limit"]).(ratelimit.Concurrency)
		var o ratelimit.LeaseOutcome
		var err error
		if id, ok := arg["id"].(string); ok {
			o, err = r.client.AcquireAs(ctx, str(arg["key"]), c, id)
		} else {
			o, err = r.client.Acquire(ctx, str(arg["key"]), c)
		}
		if err != nil {
			return errorObs(err)
		}
		obs := r.provenance(obj{"decision": decision(o.Outcome.Decision)}, o.Outcome.Degraded,
			o.Outcome.Mode)
		r.holdLease(arg, o.Outcome.Decision.Allowed, o.Lease, obs)
		return obs
	case "acquire_all":
		n := cost(arg, "cost")
		o, err := r.client.AcquireAll(ctx, r.limits(arg["limits"]), n)
		if err != nil {
			return errorObs(err)
		}
		obs := r.multi(o.Outcome)
		r.holdLease(arg, o.Outcome.Allowed && n > 0, o.Lease, obs)
		return obs
	case "renew":
		lease := r.leases[str(v)]
		if lease == nil {
			return obj{"no_lease": true}
		}
		o, err := lease.Renew(ctx)
		if err != nil {
			return errorObs(err)
		}
		if last, ok := lease.LastRenewal(); !ok || last != o {
			r.problems = append(r.problems, "LastRenewal is not the renewal")
		}
		return r.provenance(obj{"decision": decision(o.Decision)}, o.Degraded, o.Mode)
	case "release":
		lease := r.leases[str(v)]
		if lease == nil {
			return obj{"no_lease": true}
		}
		delete(r.leases, str(v))
		b, err := lease.Release(ctx)
		if err != nil {
			return errorObs(err)
		}
		return obj{"released": b}
	case "release_id":
		b, err := r.client.Release(ctx, str(arg["key"]), str(arg["id"]))
		if err != nil {
			return errorObs(err)
		}
		return obj{"released": b}
	case "reserve":
		o, err := r.client.Reserve(ctx, str(arg["key"]), r.algorithm(arg["limit"]), i64(arg["estimate"]))
		if err != nil {
			return errorObs(err)
		}
		r.holdReservation(arg, o.Outcome.Decision.Allowed, o.Reservation)
		return r.provenance(obj{"decision": decision(o.Outcome.Decision)}, o.Outcome.Degraded,
			o.Outcome.Mode)
	case "reserve_all":
		o, err := r.client.ReserveAll(ctx, r.limits(arg["limits"]), i64(arg["estimate"]))
		if err != nil {
			return errorObs(err)
		}
		r.holdReservation(arg, o.Outcome.Allowed, o.Reservation)
		return r.multi(o.Outcome)
	case "settle":
		name := str(arg["reservation"])
		res := r.reservations[name]
		if res == nil {
			return obj{"no_reservation": true}
		}
		delete(r.reservations, name)
		s, err := res.Settle(ctx, i64(arg["actual"]))
		if err != nil {
			return errorObs(err)
		}
		return r.provenance(obj{"decisions": decisions(s.Decisions)}, s.Degraded, s.Mode)
	case "settle_delta":
		s, err := r.client.Settle(ctx, r.limits(arg["limits"]), i64(arg["delta"]))
		if err != nil {
			return errorObs(err)
		}
		return r.provenance(obj{"decisions": decisions(s.Decisions)}, s.Degraded, s.Mode)
	case "top":
		entries, err := r.client.Top(ctx, int(i64(v)))
		if err != nil {
			return errorObs(err)
		}
		out := []interface{}{}
		for _, e := range entries {
			out = append(out, []interface{}{e.Key, e.Denied, e.Error, e.Command, e.FirstDeniedMs,
				e.LastDeniedMs})
		}
		return obj{"entries": out}
	case "reset_top":
		if err := r.client.ResetTop(ctx); err != nil {
			return errorObs(err)
		}
		return obj{}
	case "redis":
		args := v.([]interface{})
		var rest []interface{}
		for _, a := range args[1:] {
			if s, ok := a.(string); ok {
				rest = append(rest, s)
			} else {
				rest = append(rest, strconv.FormatFloat(num(a), 'f', -1, 64))
			}
		}
		reply, err := r.admin.Do(str(args[0]), rest...)
		if err != nil {
			return obj{"error": err.Error()}
		}
		return obj{"reply": replyJSON(reply)}
	case "request":
		if hold := str(arg["hold"]); hold != "" {
			g := r.gates.get(hold)
			answered := make(chan obj, 1)
			go func() { answered <- r.send(arg) }()
			select {
			case <-g.entered:
				r.held[hold] = answered
			case resp := <-answered:
				// Answered without reaching the handler: finish gives this response.
				done := make(chan obj, 1)
				done <- resp
				r.held[hold] = done
			case <-time.After(5 * time.Second):
				r.t.Fatalf("%s never reached its handler", hold)
			}
			return nil
		}
		return r.send(arg)
	case "finish":
		name := str(v)
		close(r.gates.get(name).release)
		answered := r.held[name]
		delete(r.held, name)
		return <-answered
	case "wait_leases":
		key, want := str(arg["key"]), i64(arg["count"])
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, _ := redis.Int64(r.admin.Do("ZCARD", key))
			if n == want {
				return nil
			}
			if time.Now().After(deadline) {
				return obj{"leases": n}
			}
			time.Sleep(2 * time.Millisecond)
		}
	case "metrics":
		return r.mw.Metrics().Prometheus()
	case "keys":
		keys, _ := redis.Strings(r.admin.Do("KEYS", "*"))
		sort.Strings(keys)
		out := []interface{}{}
		for _, k := range keys {
			out = append(out, k)
		}
		return out
	case "calls":
		info, _ := redis.String(r.admin.Do("INFO", "commandstats"))
		calls := func(command string) int {
			prefix := "cmdstat_" + command + ":calls="
			for _, line := range strings.Split(info, "\r\n") {
				if strings.HasPrefix(line, prefix) {
					n, _ := strconv.Atoi(strings.SplitN(line[len(prefix):], ",", 2)[0])
					return n
				}
			}
			return 0
		}
		counts := obj{}
		list, _ := arg[r.mode].([]interface{})
		for _, c := range list {
			n := calls(str(c))
			if str(c) == "evalsha" {
				// After NOSCRIPT the table's client loads the script (SCRIPT LOAD) and runs it by
				// EVALSHA again; this package runs it by EVAL, which loads it: its EVAL is that
				// second EVALSHA (docs/clients.md, "Modes").
				n += calls("eval")
			}
			counts[str(c)] = n
		}
		return counts
	}
	panic("unknown step " + op)
}

// send makes one request of the table over TCP, from its peer address; a stream is read up to
// its first line, then the connection is closed (the client goes away).
func (r *run) send(arg obj) obj {
	r.requests++
	id := strconv.Itoa(r.requests)
	peer := str(arg["peer"])
	if peer == "" {
		peer = "127.0.0.1"
	}
	path := str(arg["path"])
	if path == "" {
		path = "/"
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(peer)}, Timeout: 5 * time.Second}
	conn, err := dialer.Dial("tcp", r.httpAddr)
	if err != nil {
		return obj{"http_error": err.Error()}
	}
	defer conn.Close()
	req, _ := http.NewRequest("GET", "http://"+r.httpAddr+path, nil)
	if h, ok := arg["headers"].(obj); ok {
		for k, v := range h {
			req.Header.Set(k, str(v))
		}
	}
	if used, ok := arg["used"]; ok {
		req.Header.Set("X-Used", strconv.FormatInt(i64(used), 10))
	}
	if hold := str(arg["hold"]); hold != "" {
		req.Header.Set("X-Hold", hold)
	}
	req.Header.Set("X-Request-Id", id)
	req.Close = true
	if err := req.Write(conn); err != nil {
		return obj{"http_error": err.Error()}
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return obj{"http_error": err.Error()}
	}
	headers := obj{}
	for _, f := range fields {
		if vs := resp.Header.Values(f); len(vs) > 0 {
			headers[f] = strings.Join(vs, ", ")
		}
	}
	o := obj{"status": resp.StatusCode, "headers": headers}
	if arg["stream"] == true {
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || line != "tick\n" {
			o["stream"] = fmt.Sprintf("sent %q (%v)", line, err)
		}
	} else {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			o["body_error"] = err.Error()
		}
		o["body"] = string(body)
	}
	if d, ok := r.denials.LoadAndDelete(id); ok {
		o["shadow_denials"] = d
	}
	return o
}

var stepOps = []string{"check", "peek", "check_all", "check_upto", "check_all_upto", "flush", "close", "acquire", "acquire_all", "renew", "release",
	"release_id", "reserve", "reserve_all", "settle", "settle_delta", "top", "reset_top", "redis",
	"request", "finish", "wait_leases", "metrics", "keys", "calls", "stop_redis", "advance_only",
	"note"}

func stepOp(step obj) string {
	for _, op := range stepOps {
		if _, ok := step[op]; ok {
			return op
		}
	}
	panic(fmt.Sprintf("a step without an operation: %v", step))
}

// replayServer is the server of the replay: the module under the test clock and the Functions
// library, started again after a case stopped it.
type replayServer struct {
	t *testing.T
	s *server
}

func (h *replayServer) get() *server {
	if h.s == nil {
		h.s = start(h.t, serverOpts{module: true, testClock: true})
		loadLibrary(h.t, h.s)
	}
	return h.s
}

func (h *replayServer) reset(c redis.Conn, startUs int64) {
	for _, args := range [][]interface{}{{"FLUSHALL"}, {"SCRIPT", "FLUSH"},
		{"CONFIG", "SET", "ratelimit.top-slots", "128"}, {"RL.TOP", "RESET"}, {"CONFIG", "RESETSTAT"},
		{"RL.TESTCLOCK", "SET", startUs}} {
		must(h.t, c, args...)
	}
}

// supported lists the features a case may require ("requires" in the table) that this package
// implements; a case that requires another is skipped.
var supported = map[string]bool{"partial_grants": true, "deny_cache": true, "batches": true}

// unsupported is what case c requires that this package does not implement.
func unsupported(c obj) []string {
	var missing []string
	reqs, _ := c["requires"].([]interface{})
	for _, r := range reqs {
		if !supported[str(r)] {
			missing = append(missing, str(r))
		}
	}
	return missing
}

func TestConformanceTable(t *testing.T) {
	path := filepath.Join("..", "..", "conformance", "cases.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var table obj
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	only := os.Getenv("CONFORMANCE_CASE")
	startUs := int64(num(table["clock_start_us"]))
	h := &replayServer{t: t}
	replayed := 0
	for _, ci := range table["cases"].([]interface{}) {
		c := ci.(obj)
		name := str(c["name"])
		if only != "" && !strings.Contains(name, only) {
			continue
		}
		if missing := unsupported(c); len(missing) > 0 {
			t.Logf("skipped %q: requires %v, not implemented by this package", name, missing)
			continue
		}
		replayed++
		runModes := modes
		if ms, ok := c["modes"].([]interface{}); ok {
			runModes = nil
			for _, m := range ms {
				runModes = append(runModes, str(m))
			}
		}
		for _, mode := range runModes {
			replayCase(t, h, c, mode, startUs)
		}
	}
	if replayed == 0 {
		t.Fatal("no case matched")
	}
}

func replayCase(t *testing.T, h *replayServer, c obj, mode string, startUs int64) {
	name := str(c["name"])
	s := h.get()
	adminConn, err := redis.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer adminConn.Close()
	h.reset(adminConn, startUs)
	addr := s.addr()
	if c["redis"] == "unreachable" {
		addr = "127.0.0.1:" + strconv.Itoa(freePort())
	}
	cl := ratelimit.New(Redigo{pool(addr)}, caseOptions(c, mode))
	if o, ok := c["options"].(obj); ok {
		if dc, ok := o["deny_cache"].(obj); ok {
			cl = cl.WithDenyCache(int(i64(dc["entries"])))
		}
		if b, ok := o["batching"].(obj); ok {
			cl = cl.WithBatching(batching(b))
		}
	}
	r := &run{t: t, c: c, mode: mode, client: cl, admin: adminConn,
		leases: map[string]*ratelimit.Lease{}, reservations: map[string]*ratelimit.Reservation{},
		gates: &gates{byName: map[string]*gate{}}, held: map[string]chan obj{}, denials: &sync.Map{}}
	if _, ok := c["layer"]; ok {
		r.mw = middleware(c, cl, r.denials)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: r.mw.Handler(handler(r.gates))}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		r.httpAddr = l.Addr().String()
	}
	defer func() {
		// Requests still held are let go.
		for name, answered := range r.held {
			close(r.gates.get(name).release)
			<-answered
		}
	}()
	for si, st := range c["steps"].([]interface{}) {
		step := st.(obj)
		if us, ok := step["advance_us"]; ok && num(us) != 0 {
			must(t, adminConn, "RL.TESTCLOCK", "ADVANCE", int64(num(us)))
		}
		op := stepOp(step)
		var got interface{}
		switch op {
		case "stop_redis":
			h.s.kill()
			h.s = nil
		case "advance_only", "note":
		default:
			got = canonical(r.step(op, step[op]))
		}
		for _, p := range r.problems {
			t.Errorf("%s [%s] step %d (%s): %s", name, mode, si, op, p)
		}
		r.problems = nil
		expect := expectation(step, mode)
		if (expect == nil && got != nil) || (expect != nil && !matches(expect, got)) {
			e, _ := json.Marshal(expect)
			g, _ := json.Marshal(got)
			t.Errorf("%s [%s] step %d (%s): expected %s, got %s", name, mode, si, op, e, g)
		}
	}
}
