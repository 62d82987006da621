package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Decision is one limit's answer: the five fields every RL.* command replies.
type Decision struct {
	Allowed   bool
	Remaining int64
	// RetryAfterMs is 0 when allowed; -1 when the cost can never be admitted.
	RetryAfterMs int64
	ResetAfterMs int64
	Limit        int64
}

// Mode is how decisions are made on the server.
type Mode int

const (
	// ModeModule calls the module's RL.* commands.
	ModeModule Mode = iota + 1
	// ModeScript runs the lua-reference/ scripts with EVALSHA (EVAL when the server answers
	// NOSCRIPT, which loads them again: one call sends the script, the others that met the
	// same NOSCRIPT wait for it and go by EVALSHA).
	ModeScript
	// ModeFunction calls the Functions library `ratelimit` (FCALL), loaded on the server
	// beforehand (LoadLibrary).
	ModeFunction
)

func (m Mode) String() string {
	switch m {
	case ModeModule:
		return "module"
	case ModeScript:
		return "script"
	case ModeFunction:
		return "function"
	}
	return "unknown"
}

// ModeChoice is the Mode to use: ModeAuto detects it, the others force it.
type ModeChoice int

const (
	// ModeAuto takes the module if COMMAND INFO rl.all knows it, else the Functions library if
	// FUNCTION LIST has it, else the scripts; detected on the first call that reaches Redis (or
	// at once with Detect), once per client however many calls wait for it.
	ModeAuto ModeChoice = iota
	ChooseModule
	ChooseScript
	ChooseFunction
)

type policyKind int

const (
	policyFailOpen policyKind = iota
	policyFailClosed
	policyLocal
)

// FailurePolicy says what to answer when Redis cannot: it did not answer within the timeout,
// the connection failed, it answered LOADING, CLUSTERDOWN, MASTERDOWN, TRYAGAIN..., or the
// breaker is open. The zero FailurePolicy is FailOpen.
type FailurePolicy struct {
	kind      policyKind
	instances int
}

var (
	// FailOpen admits everything.
	FailOpen = FailurePolicy{kind: policyFailOpen}
	// FailClosed denies everything (RetryAfterMs = Options.FailClosedRetryMs).
	FailClosed = FailurePolicy{kind: policyFailClosed}
)

// Local decides in process: a token bucket per key with the limit and the rate divided by the
// expected number of instances sharing the limit; for a concurrency limit, a counting semaphore
// per key with the limit divided alike and the same lease expiry.
func Local(instances int) FailurePolicy {
	if instances < 1 {
		instances = 1
	}
	return FailurePolicy{kind: policyLocal, instances: instances}
}

func (p FailurePolicy) String() string {
	switch p.kind {
	case policyFailClosed:
		return "FailClosed"
	case policyLocal:
		return fmt.Sprintf("Local(%d)", p.instances)
	}
	return "FailOpen"
}

// Degraded says that an outcome did not come from Redis, and which policy made it.
type Degraded int

const (
	NotDegraded Degraded = iota
	DegradedFailOpen
	DegradedFailClosed
	DegradedLocal
)

// String is the value of the RateLimit-Degraded response field: fail-open, fail-closed, local
// (empty when not degraded).
func (d Degraded) String() string {
	switch d {
	case DegradedFailOpen:
		return "fail-open"
	case DegradedFailClosed:
		return "fail-closed"
	case DegradedLocal:
		return "local"
	}
	return ""
}

// Options configure a Client. The zero value is the defaults.
type Options struct {
	// How long one request to Redis may take (default 100 ms): a call's decision, and in
	// ModeScript the script it sends again after NOSCRIPT. The client's start-up has its own:
	// the mode's detection (each of its requests), a script's load after NOSCRIPT. A call that
	// waits for a start-up another call began waits for it (the start-up's own timeouts bound
	// the wait), then has its own Timeout. A deadline of the caller's context that comes sooner
	// applies too.
	Timeout time.Duration
	// Requests to Redis in flight at once (default 64): a call beyond them waits for one to
	// end before its request is sent, and its Timeout starts then; the breaker opening
	// answers a waiting call by the policy at once. Each holds a connection of the pool, so it
	// bounds the connections a pool dials at once when every caller comes at the same moment
	// (a cold start under a burst); below the callers a busy process has at once, it costs
	// throughput (the server answers more connections per turn of its event loop).
	MaxInFlight int
	// What to answer when Redis cannot (default FailOpen).
	Policy  FailurePolicy
	Breaker BreakerConfig
	Mode    ModeChoice
	// RetryAfterMs reported by FailClosed (default 1000).
	FailClosedRetryMs int64
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = 100 * time.Millisecond
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 64
	}
	if o.Breaker.Failures <= 0 {
		o.Breaker.Failures = 3
	}
	if o.Breaker.Cooldown <= 0 {
		o.Breaker.Cooldown = time.Second
	}
	if o.FailClosedRetryMs <= 0 {
		o.FailClosedRetryMs = 1000
	}
	return o
}

// Outcome is the answer for one limit.
type Outcome struct {
	Decision Decision
	// Degraded is set when Redis was not asked or did not answer in time.
	Degraded Degraded
	// Mode is the mode that answered (0 when degraded).
	Mode Mode
	// Granted is the units taken: for a partial grant (CheckUpto) 1 to n, 0 when denied (the
	// decision is then the denial of one unit); for a check its cost when admitted, else 0.
	Granted int64
	// AnsweredLocally is set when the client answered without calling Redis (from the deny
	// cache); Mode is then the mode of the call the answer comes from.
	AnsweredLocally LocalAnswer
}

// LocalAnswer says how a check was answered without calling Redis.
type LocalAnswer int

const (
	// NotLocal: Redis (or the failure policy) answered.
	NotLocal LocalAnswer = iota
	// LocalBatch: an admission from a leased batch of a hot key.
	LocalBatch
	// LocalDenyCache: a denial repeated by the deny cache.
	LocalDenyCache
)

// String is "batch", "deny_cache" (empty for NotLocal).
func (l LocalAnswer) String() string {
	switch l {
	case LocalBatch:
		return "batch"
	case LocalDenyCache:
		return "deny_cache"
	}
	return ""
}

// MultiOutcome is the answer for several limits checked at once (RL.ALL).
type MultiOutcome struct {
	Allowed bool
	// DeniedBy is the 1-based position of the first limit that denied, 0 when allowed.
	DeniedBy  int
	Decisions []Decision
	Degraded  Degraded
	Mode      Mode
	// Granted is the units taken from every limit: for a partial grant (CheckAllUpto) 1 to n,
	// 0 when denied; for a check its cost when admitted, else 0.
	Granted int64
	// AnsweredLocally is set when the client answered without calling Redis.
	AnsweredLocally LocalAnswer
}

// Settlement is the state of every limit after a settlement (RL.SETTLE), in the order of the
// limits.
type Settlement struct {
	// One per limit: Allowed true, RetryAfterMs 0, Remaining 0 while in debt.
	Decisions []Decision
	// Set when Redis was not asked or did not answer in time: the decisions are then the
	// failure policy's.
	Degraded Degraded
	Mode     Mode
}

// TopEntry is one of the keys with the most denials on a server (RL.TOP), as the module counts
// them.
type TopEntry struct {
	// The key (bytes that are not UTF-8 replaced by U+FFFD).
	Key string
	// Denials counted for the key: at least Denied - Error, at most Denied.
	Denied int64
	// The most by which Denied may overcount.
	Error int64
	// The command of the latest denial (RL.TOKENBUCKET, RL.ALL).
	Command string
	// When the key's slot was taken and its latest denial (Unix ms by the module's clock).
	FirstDeniedMs int64
	LastDeniedMs  int64
}

// Limit is a key and the algorithm that limits it, for the calls over several limits.
type Limit struct {
	Key       string
	Algorithm Algorithm
}

// RejectedError is Redis's answer about the call itself (bad parameters, WRONGTYPE, CROSSSLOT),
// or a refusal that asking again cannot fix and that failing open would hide: NOPERM, NOAUTH or
// WRONGPASS (the application's user or password is wrong), OOM (the server is full), READONLY
// (the address is a replica, as after a failover). It never triggers the failure policy nor the
// breaker.
type RejectedError struct {
	// The server's message, its code first: "ERR capacity must be ...".
	Message string
}

func (e *RejectedError) Error() string { return "rejected by redis: " + e.Message }

// Code is the message's first word (ERR, WRONGTYPE, NOPERM...).
func (e *RejectedError) Code() string { return ServerError(e.Message).Code() }

// UnsupportedError is a call that cannot be made: a combination that cannot be checked in one
// call, or that the mode cannot answer.
type UnsupportedError struct {
	Reason string
}

func (e *UnsupportedError) Error() string { return "unsupported: " + e.Reason }

// ErrUnavailable is returned when Redis did not answer a call that has no failure policy
// (Client.Top, Client.ResetTop).
var ErrUnavailable = errors.New("redis did not answer")

func unsupported(reason string) error { return &UnsupportedError{Reason: reason} }

// rejectedCodes are the error replies returned to the caller as they are; any other error
// means Redis could not decide.
var rejectedCodes = map[string]bool{
	"ERR": true, "WRONGTYPE": true, "CROSSSLOT": true, "NOPERM": true, "NOAUTH": true,
	"WRONGPASS": true, "OOM": true, "READONLY": true,
}

// Client decides with the module, the Functions library or the scripts, over one Conn (a
// single server or a cluster). It is safe for concurrent use; copies of a *Client share the
// breaker, the mode and the local fallback, and so do the clients made from it by
// WithDenyCache and WithoutDenyCache (each with its own deny cache, or none).
type Client struct {
	*core
	// The deny cache (nil: none).
	denies *denyCache
	// The leased batches (nil: none).
	batches *batches
	// The durable lane (nil: none).
	durable *lane
}

// core is what the clients made from one New share.
type core struct {
	conn Conn
	// conn when it is a DeadlineConn (else nil).
	bounded DeadlineConn
	opts    Options
	mode    atomic.Int32
	breaker *breaker
	local   *localLimiter
	leases  *localLeases

	// The detection in flight (nil when none): every call that needs the mode waits for it.
	detectMu  sync.Mutex
	detecting *detection
	// Per script, its loads after NOSCRIPT (read-only map).
	scripts map[string]*scriptLoad
	// One element per request in flight (MaxInFlight).
	slots chan struct{}
	// The words of the algorithm values checked so far (wordsOf), and how many.
	words     sync.Map
	wordCount atomic.Int32
}

// detection is one mode detection: done is closed once mode or err is set.
type detection struct {
	done chan struct{}
	mode Mode
	err  error
}

// scriptLoad is a script's loads after NOSCRIPT: one call sends it (EVAL), the others wait.
type scriptLoad struct {
	mu sync.Mutex
	// Loads that reached the server so far.
	loads uint64
	// Closed when the load in flight ends (nil when none).
	loading chan struct{}
}

// New is a client over conn. Nothing is sent until the first call (or Detect): New never
// waits for Redis, which may be down when the application starts.
func New(conn Conn, opts Options) *Client {
	opts = opts.withDefaults()
	c := &core{conn: conn, opts: opts, breaker: newBreaker(opts.Breaker),
		local: newLocalLimiter(), leases: newLocalLeases(),
		scripts: make(map[string]*scriptLoad, len(shas)),
		slots:   make(chan struct{}, opts.MaxInFlight)}
	for s := range shas {
		c.scripts[s] = &scriptLoad{}
	}
	c.bounded, _ = conn.(DeadlineConn)
	switch opts.Mode {
	case ChooseModule:
		c.mode.Store(int32(ModeModule))
	case ChooseScript:
		c.mode.Store(int32(ModeScript))
	case ChooseFunction:
		c.mode.Store(int32(ModeFunction))
	}
	return &Client{core: c}
}

// DenyCacheEntries is the number of entries of the middleware's deny cache unless
// Middleware.DenyCacheEntries says otherwise.
const DenyCacheEntries = 10_000

// WithDenyCache is a client sharing c's connection, mode and breaker, with a deny cache of at
// most entries entries, the least recently used evicted first: after Redis denies a check with
// RetryAfterMs R, the same check (same keys, algorithms, parameters and cost) is denied without
// calling Redis until R has passed on the monotonic clock (Outcome.AnsweredLocally
// LocalDenyCache, the waits counted down). When R has passed, one check asks Redis again while
// the others are still denied from the entry, for at most the client's Timeout. It may deny for
// up to R (and that timeout) what Redis would admit sooner (another process's refund, a raised
// limit), never admit what Redis would deny. A plain client has none.
func (c *Client) WithDenyCache(entries int) *Client {
	cp := *c
	cp.denies = newDenyCache(entries, c.opts.Timeout)
	return &cp
}

// WithoutDenyCache is a client sharing c's connection, mode, breaker and batches, without a
// deny cache.
func (c *Client) WithoutDenyCache() *Client {
	cp := *c
	cp.denies = nil
	return &cp
}

// WithBatching is a client sharing c's connection, mode, breaker and deny cache that takes
// leased batches for hot keys (see Batching, and docs/clients.md): a hot key's checks of a cost
// above 0 are admitted from units granted several at a time (one partial grant, UPTO n) without
// calling Redis (Outcome.AnsweredLocally LocalBatch), and what a batch did not use goes back
// (RL.SETTLE) when its lease ends, on Flush and on Close. The clients made from it share its
// batches. Call Close (or Flush) before the process ends: Go has no destructors, and what the
// batches hold then lapses until the limits refill.
func (c *Client) WithBatching(b Batching) *Client {
	cp := *c
	cp.batches = newBatches(&Client{core: c.core, durable: c.durable}, b)
	return &cp
}

// WithoutBatching is a client sharing c's connection, mode, breaker and deny cache, without
// batches (those of the other clients carry on).
func (c *Client) WithoutBatching() *Client {
	cp := *c
	cp.batches = nil
	return &cp
}

// BatchStats is what the client's batches did so far (all zero without batches).
func (c *Client) BatchStats() BatchStats {
	if c.batches == nil {
		return BatchStats{}
	}
	return c.batches.stats()
}

// BatchSize is the size the next batch of these limits starts from (B), while they are tracked.
func (c *Client) BatchSize(limits []Limit) (int64, bool) {
	if c.batches == nil {
		return 0, false
	}
	return c.batches.size(signature(limits))
}

// Flush gives back at once what every batch holds (RL.SETTLE ... DELTA -n), and waits for the
// answers (and for the returns already on their way): the units given back. The keys are
// batched again on their next calls.
func (c *Client) Flush(ctx context.Context) int64 {
	if c.batches == nil {
		return 0
	}
	return c.batches.flush()
}

// Close stops the batches of this client and of every client sharing them (their checks go to
// Redis one by one from then on), and gives back what they hold: the units given back. Call it
// before the process ends.
func (c *Client) Close(ctx context.Context) int64 {
	if c.batches == nil {
		return 0
	}
	return c.batches.close()
}

// tryGrant is a partial grant of at most n units for a batch: answered false when Redis cannot
// answer (no failure policy applied).
func (c *Client) tryGrant(ctx context.Context, limits []Limit, n int64) (MultiOutcome, bool,
	error) {
	t := take{n: n, upto: true}
	var o MultiOutcome
	err := c.guarded(ctx, func(ctx context.Context) error {
		if len(limits) == 1 {
			d, granted, m, err := c.callOne(ctx, limits[0].Key, limits[0].Algorithm, t, "")
			deniedBy := 0
			if !d.Allowed {
				deniedBy = 1
			}
			o = MultiOutcome{Allowed: d.Allowed, DeniedBy: deniedBy, Decisions: []Decision{d},
				Mode: m, Granted: granted}
			return err
		}
		var err error
		o, err = c.callAll(ctx, limits, t, "")
		return err
	})
	if err == errUnavailable {
		return MultiOutcome{}, false, nil
	}
	if err != nil {
		return MultiOutcome{}, false, err
	}
	return o, true, nil
}

// degradedFor is the failure policy's answer for a cost, as a call to Redis that failed would
// get it.
func (c *Client) degradedFor(limits []Limit, cost int64) MultiOutcome {
	if len(limits) == 1 {
		d, granted, g := c.degradedTake(limits[0].Key, limits[0].Algorithm, take{n: cost}, "")
		deniedBy := 0
		if !d.Allowed {
			deniedBy = 1
		}
		return MultiOutcome{Allowed: d.Allowed, DeniedBy: deniedBy, Decisions: []Decision{d},
			Degraded: g, Granted: granted}
	}
	return c.degradedAll(limits, cost, "")
}

// DenyCacheCapacity is the number of entries of the client's deny cache at most; false when it
// has none.
func (c *Client) DenyCacheCapacity() (int, bool) {
	if c.denies == nil {
		return 0, false
	}
	return c.denies.capacity, true
}

// DenyCacheLen is the entries in the deny cache now.
func (c *Client) DenyCacheLen() int {
	if c.denies == nil {
		return 0
	}
	return c.denies.len()
}

// DeniedUntil is when the deny cache's entry for these limits at this cost expires, if it has
// one.
func (c *Client) DeniedUntil(limits []Limit, cost int64) (time.Time, bool) {
	if c.denies == nil {
		return time.Time{}, false
	}
	return c.denies.until(signature(limits), cost)
}

// decideHot is a check of a cost above 0 on limits without a concurrency one, with batches or
// the deny cache on: the batch first, then the deny cache, then a new batch (a hot key) or a
// call to Redis (whose denial the cache keeps).
func (c *Client) decideHot(ctx context.Context, limits []Limit, cost int64) (MultiOutcome,
	error) {
	sig := signature(limits)
	refill := false
	if c.batches != nil {
		o, step := c.batches.tryLocal(sig, limits, cost)
		switch step {
		case stepAnswer:
			return o, nil
		case stepRefill:
			refill = true
		}
	}
	if c.denies != nil {
		if o, ok := c.denies.lookup(sig, cost); ok {
			return o, nil
		}
	}
	if refill {
		o, ok, err := c.batches.refill(ctx, sig, limits, cost, c.denies)
		if err != nil || ok {
			return o, err
		}
		// The refill that came first may have been denied meanwhile.
		if c.denies != nil {
			if o, ok := c.denies.lookup(sig, cost); ok {
				return o, nil
			}
		}
	}
	sent := time.Now()
	o, err := c.decideAll(ctx, limits, cost, "")
	if err != nil {
		return o, err
	}
	if c.denies != nil {
		c.denies.record(sig, cost, o, sent)
	}
	if c.batches != nil {
		c.batches.observe(sig, o)
	}
	return o, nil
}

// single is the outcome of the one limit of o.
func (o MultiOutcome) single() Outcome {
	out := Outcome{Degraded: o.Degraded, Mode: o.Mode, Granted: o.Granted,
		AnsweredLocally: o.AnsweredLocally}
	if len(o.Decisions) > 0 {
		out.Decision = o.Decisions[0]
	}
	return out
}

// Options are the client's options, defaults filled in.
func (c *Client) Options() Options { return c.opts }

// Mode is the mode in use, once known (after the first call that reached Redis in ModeAuto).
func (c *Client) Mode() (Mode, bool) {
	m := Mode(c.mode.Load())
	return m, m != 0
}

// BreakerOpen says whether the circuit breaker is open (or half open).
func (c *Client) BreakerOpen() bool { return c.breaker.isOpen() }

// Detect detects the mode now if it is not known yet (each request within the timeout); false
// if Redis could not say.
func (c *Client) Detect(ctx context.Context) (Mode, bool) {
	m, err := c.resolveMode(ctx)
	return m, err == nil
}

// send is one request to Redis, within the timeout (and ctx), once one of the MaxInFlight
// slots is free.
func (c *Client) send(ctx context.Context, args ...interface{}) (interface{}, error) {
	if err := c.takeSlot(ctx); err != nil {
		return nil, err
	}
	defer func() { <-c.slots }()
	return c.request(ctx, args...)
}

// request is one request to Redis within the timeout (and ctx), its slot taken: on the
// caller's goroutine through a DeadlineConn, else watched by do.
func (c *Client) request(ctx context.Context, args ...interface{}) (interface{}, error) {
	if pinned, ok := ctx.Value(pinnedKey{}).(Conn); ok {
		// A durable call: on the connection its WAIT goes on.
		ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
		return do(ctx, pinned, args...)
	}
	if c.bounded != nil {
		deadline := time.Now().Add(c.opts.Timeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		return doBy(ctx, c.bounded, deadline, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	return do(ctx, c.conn, args...)
}

// slotPastLoads takes a slot for an EVALSHA of st's script once no load of it is in flight
// (giving the slot back while one is: the load needs a slot too), and the loads seen then.
func (c *Client) slotPastLoads(ctx context.Context, st *scriptLoad) (uint64, error) {
	for {
		if err := c.takeSlot(ctx); err != nil {
			return 0, err
		}
		st.mu.Lock()
		seen, wait := st.loads, st.loading
		st.mu.Unlock()
		if wait == nil {
			return seen, nil
		}
		<-c.slots
		// The load's own timeout bounds the wait.
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, gaveUpError{ctx.Err()}
		}
	}
}

// takeSlot waits for a free slot: errBreakerOpened if the breaker opens meanwhile, a
// gaveUpError if ctx ends first.
func (c *Client) takeSlot(ctx context.Context) error {
	select {
	case c.slots <- struct{}{}:
		return nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return gaveUpError{err}
	}
	opened := c.breaker.openedChan()
	select {
	case c.slots <- struct{}{}:
		return nil
	case <-opened:
		return errBreakerOpened
	case <-ctx.Done():
		return gaveUpError{ctx.Err()}
	}
}

// errBreakerOpened: the breaker opened while the call waited to send its request.
var errBreakerOpened = errors.New("the breaker opened")

// gaveUpError is the caller's context ending while the call waited for the client (a free
// slot, the start-up another call began), before its request left: nothing was learnt about
// Redis.
type gaveUpError struct{ err error }

func (e gaveUpError) Error() string { return "gave up waiting: " + e.err.Error() }
func (e gaveUpError) Unwrap() error { return e.err }

// resolveMode is the mode, detected first if it is not known: one detection at a time per
// client, which every caller waits for (until it ends, or the caller's ctx does). A failed
// detection settles nothing: the next call detects again.
func (c *Client) resolveMode(ctx context.Context) (Mode, error) {
	if m, ok := c.Mode(); ok {
		return m, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, gaveUpError{err}
	}
	c.detectMu.Lock()
	if m, ok := c.Mode(); ok {
		c.detectMu.Unlock()
		return m, nil
	}
	d := c.detecting
	if d == nil {
		d = &detection{done: make(chan struct{})}
		c.detecting = d
		// Apart from the caller that began it: a caller that gives up does not end it.
		go c.detect(d)
	}
	c.detectMu.Unlock()
	select {
	case <-d.done:
		return d.mode, d.err
	case <-ctx.Done():
		return 0, gaveUpError{ctx.Err()}
	}
}

func (c *Client) detect(d *detection) {
	mode, err := c.detectNow(context.Background())
	c.detectMu.Lock()
	if err == nil {
		c.mode.Store(int32(mode))
	}
	c.detecting = nil
	c.detectMu.Unlock()
	d.mode, d.err = mode, err
	close(d.done)
}

// detectNow asks the server: COMMAND INFO rl.all, then FUNCTION LIST without the module.
func (c *Client) detectNow(ctx context.Context) (Mode, error) {
	info, err := c.send(ctx, "COMMAND", "INFO", "rl.all")
	if err != nil {
		return 0, err
	}
	items, ok := info.([]interface{})
	if !ok {
		return 0, errUnexpected{info}
	}
	mode := ModeScript
	if len(items) > 0 && items[0] != nil {
		mode = ModeModule
	} else if has, err := c.hasLibrary(ctx); err != nil {
		return 0, err
	} else if has {
		mode = ModeFunction
	}
	return mode, nil
}

// hasLibrary says whether the Functions library is loaded. A server that refuses to say (an
// error reply, such as NOPERM for FUNCTION) is taken to have none: the scripts decide alike.
func (c *Client) hasLibrary(ctx context.Context) (bool, error) {
	v, err := c.send(ctx, "FUNCTION", "LIST", "LIBRARYNAME", LibraryName)
	var se ServerError
	if errors.As(err, &se) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch x := v.(type) {
	case []interface{}:
		return len(x) > 0, nil
	case map[interface{}]interface{}:
		return len(x) > 0, nil
	}
	return false, errUnexpected{v}
}

// functionName is a command's function in the library: RL.TOKENBUCKET is rl_tokenbucket.
func functionName(command string) string {
	return strings.ReplaceAll(strings.ToLower(command), ".", "_")
}

// call sends command (keys, then args) in the client's mode: the module's command, FCALL of
// the library's function, or EVALSHA of script (EVAL on NOSCRIPT, see evalsha).
func (c *Client) call(ctx context.Context, command, script string, multi bool, keys []string,
	args []string) (interface{}, Mode, error) {
	mode, err := c.resolveMode(ctx)
	if err != nil {
		return nil, 0, err
	}
	n := len(keys) + len(args)
	var out []interface{}
	switch mode {
	case ModeModule:
		out = make([]interface{}, 0, n+2)
		out = append(out, command)
		if multi {
			out = append(out, integer(int64(len(keys))))
		}
	case ModeFunction:
		out = make([]interface{}, 0, n+3)
		out = append(out, "FCALL", functionName(command), integer(int64(len(keys))))
	default:
		out = make([]interface{}, 0, n+3)
		out = append(out, "EVALSHA", shas[script], integer(int64(len(keys))))
	}
	for _, k := range keys {
		out = append(out, k)
	}
	for _, a := range args {
		out = append(out, a)
	}
	if mode == ModeScript {
		reply, err := c.evalsha(ctx, script, out)
		return reply, mode, err
	}
	reply, err := c.send(ctx, out...)
	return reply, mode, err
}

func isNoscript(err error) bool {
	var se ServerError
	return errors.As(err, &se) && se.Code() == "NOSCRIPT"
}

// evalsha runs script by its SHA-1 (out is EVALSHA sha numkeys keys... args...). On NOSCRIPT
// one call sends the script (EVAL, which runs it and loads it); the calls that meet the same
// NOSCRIPT, or come while it is sent, wait for that load and go by EVALSHA; a call that met
// NOSCRIPT before a load that has since landed goes again at once. After two goes it sends
// the script itself (a cluster whose nodes lost it one after the other).
func (c *Client) evalsha(ctx context.Context, script string, out []interface{}) (interface{},
	error) {
	st := c.scripts[script]
	for attempt := 0; ; attempt++ {
		seen, err := c.slotPastLoads(ctx, st)
		if err != nil {
			return nil, err
		}
		out[0], out[1] = "EVALSHA", shas[script]
		reply, err := c.request(ctx, out...)
		<-c.slots
		if !isNoscript(err) {
			return reply, err
		}
		st.mu.Lock()
		if attempt < 2 && (st.loads != seen || st.loading != nil) {
			// Loaded since this EVALSHA left, or being loaded.
			st.mu.Unlock()
			continue
		}
		done := make(chan struct{})
		st.loading = done
		st.mu.Unlock()
		out[0], out[1] = "EVAL", script
		reply, err = c.send(ctx, out...)
		var se ServerError
		st.mu.Lock()
		if err == nil || errors.As(err, &se) {
			// The server ran it, so it has it.
			st.loads++
		}
		if st.loading == done {
			st.loading = nil
		}
		st.mu.Unlock()
		close(done)
		return reply, err
	}
}

// take is what a call takes: a cost, or with upto a partial grant of at most n units (UPTO n).
type take struct {
	n    int64
	upto bool
}

func cost(n int64) take { return take{n: n} }

// fields is the length of a limiter's reply: five integers, a sixth (granted) for UPTO.
func (t take) fields() int {
	if t.upto {
		return 6
	}
	return 5
}

// grantedOf is the units a reply of this take says were taken: for a cost, the cost when
// admitted, else 0.
func (t take) grantedOf(allowed bool, sixth int64) int64 {
	switch {
	case t.upto:
		return sixth
	case allowed:
		return t.n
	}
	return 0
}

// callOne is one limit's command: the parameters, then the cost (or UPTO n), or for a
// concurrency limit the lease id (RL.ACQUIRE takes no cost).
func (c *Client) callOne(ctx context.Context, key string, a Algorithm, t take,
	lease string) (Decision, int64, Mode, error) {
	if l := c.laneFor(t, lease); l != nil {
		var d Decision
		var granted int64
		var mode Mode
		stands, err := c.durably(ctx, l, func(ctx context.Context) (bool, error) {
			var err error
			d, granted, mode, err = c.sendOne(ctx, key, a, t, lease)
			return d.Allowed, err
		})
		if err != nil {
			return Decision{}, 0, 0, err
		}
		if !stands {
			c.refuse(&d)
			granted = 0
		}
		return d, granted, mode, nil
	}
	return c.sendOne(ctx, key, a, t, lease)
}

// refuse turns d into the refusal of an admission the replicas did not acknowledge.
func (c *Client) refuse(d *Decision) {
	d.Allowed = false
	d.RetryAfterMs = c.opts.FailClosedRetryMs
}

// sendOne is one limit's command: key, the parameters, then the cost (UPTO n, or the lease).
func (c *Client) sendOne(ctx context.Context, key string, a Algorithm, t take,
	lease string) (Decision, int64, Mode, error) {
	w := c.wordsOf(a)
	mode, err := c.resolveMode(ctx)
	if err != nil {
		return Decision{}, 0, 0, err
	}
	out := make([]interface{}, 0, 3+1+len(w.params)+2)
	switch mode {
	case ModeModule:
		out = append(out, w.command)
	case ModeFunction:
		out = append(out, "FCALL", w.function, smallWords[1])
	default:
		out = append(out, "EVALSHA", w.sha, smallWords[1])
	}
	out = append(out, key)
	out = append(out, w.params...)
	if _, ok := concurrencyOf(a); ok {
		out = append(out, lease)
		t = cost(1)
	} else if t.upto {
		out = append(out, "UPTO", intWord(t.n))
	} else {
		out = append(out, intWord(t.n))
	}
	var reply interface{}
	if mode == ModeScript {
		reply, err = c.evalsha(ctx, a.script(), out)
	} else {
		reply, err = c.send(ctx, out...)
	}
	if err != nil {
		return Decision{}, 0, 0, err
	}
	d, sixth, ok := decisionOfN(reply, t.fields())
	if !ok {
		return Decision{}, 0, 0, errUnexpected{reply}
	}
	return d, t.grantedOf(d.Allowed, sixth), mode, nil
}

func limitArgs(limits []Limit) ([]string, []string) {
	keys := make([]string, len(limits))
	var args []string
	for i, l := range limits {
		keys[i] = l.Key
		args = append(args, l.Algorithm.Keyword())
		args = append(args, l.Algorithm.Params()...)
	}
	return keys, args
}

func (c *Client) callAll(ctx context.Context, limits []Limit, t take,
	lease string) (MultiOutcome, error) {
	if l := c.laneFor(t, lease); l != nil {
		var o MultiOutcome
		stands, err := c.durably(ctx, l, func(ctx context.Context) (bool, error) {
			var err error
			o, err = c.sendAll(ctx, limits, t, lease)
			return o.Allowed, err
		})
		if err != nil {
			return MultiOutcome{}, err
		}
		if !stands {
			// Denied as by the first limit, every limit answering the same refusal.
			for i := range o.Decisions {
				c.refuse(&o.Decisions[i])
			}
			o.Allowed, o.DeniedBy, o.Granted = false, 1, 0
		}
		return o, nil
	}
	return c.sendAll(ctx, limits, t, lease)
}

// sendAll is RL.ALL (or its twins).
func (c *Client) sendAll(ctx context.Context, limits []Limit, t take,
	lease string) (MultiOutcome, error) {
	keys, args := limitArgs(limits)
	if hasConcurrency(limits) {
		args = append(args, "LEASE", lease)
	}
	if t.upto {
		args = append(args, "UPTO", integer(t.n))
	} else {
		args = append(args, "COST", integer(t.n))
	}
	reply, mode, err := c.call(ctx, "RL.ALL", scriptAll, true, keys, args)
	if err != nil {
		return MultiOutcome{}, err
	}
	allowed, deniedBy, ds, sixth, ok := multiOfN(reply, len(limits), t.fields())
	if !ok {
		return MultiOutcome{}, errUnexpected{reply}
	}
	return MultiOutcome{Allowed: allowed, DeniedBy: deniedBy, Decisions: ds, Mode: mode,
		Granted: t.grantedOf(allowed, sixth)}, nil
}

func (c *Client) callSettle(ctx context.Context, limits []Limit, delta int64) ([]Decision,
	Mode, error) {
	keys, args := limitArgs(limits)
	args = append(args, "DELTA", integer(delta))
	reply, mode, err := c.call(ctx, "RL.SETTLE", scriptSettle, true, keys, args)
	if err != nil {
		return nil, 0, err
	}
	ds, ok := decisionsOf(reply, len(limits))
	if !ok {
		return nil, 0, errUnexpected{reply}
	}
	return ds, mode, nil
}

func (c *Client) callRelease(ctx context.Context, key, id string) (int64, error) {
	reply, _, err := c.call(ctx, "RL.RELEASE", scriptRelease, false, []string{key}, []string{id})
	if err != nil {
		return 0, err
	}
	n, ok := asInt(reply)
	if !ok {
		return 0, errUnexpected{reply}
	}
	return n, nil
}

// guarded runs f under the breaker (each of its requests within the timeout): nil, a
// *RejectedError, or errUnavailable (Redis did not answer: the failure policy decides).
func (c *Client) guarded(ctx context.Context, f func(context.Context) error) error {
	if !c.breaker.permit() {
		return errUnavailable
	}
	seen := c.breaker.answered()
	err := f(ctx)
	if err == nil {
		c.breaker.success()
		return nil
	}
	var se ServerError
	if errors.As(err, &se) && rejectedCodes[se.Code()] {
		c.breaker.success()
		return &RejectedError{Message: string(se)}
	}
	var gaveUp gaveUpError
	if errors.Is(err, errBreakerOpened) || errors.As(err, &gaveUp) ||
		(errors.Is(err, context.Canceled) && ctx.Err() != nil) {
		// The breaker opened while the call waited, or the caller gave up (a client that went
		// away): nothing was learnt about Redis.
		c.breaker.neutral()
		return errUnavailable
	}
	c.breaker.failureSince(seen)
	return errUnavailable
}

// errUnavailable is guarded's answer when Redis did not decide.
var errUnavailable = errors.New("unavailable")

func (c *Client) degradedOne(key string, a Algorithm, cost int64, lease string) (Decision,
	Degraded) {
	d, _, g := c.degradedTake(key, a, take{n: cost}, lease)
	return d, g
}

// degradedTake is the failure policy's answer for one limit, with the units it grants.
func (c *Client) degradedTake(key string, a Algorithm, t take, lease string) (Decision, int64,
	Degraded) {
	o := c.opts
	switch o.Policy.kind {
	case policyFailClosed:
		return Decision{Allowed: false, Remaining: 0, RetryAfterMs: o.FailClosedRetryMs,
			ResetAfterMs: o.FailClosedRetryMs, Limit: a.Quota()}, 0, DegradedFailClosed
	case policyLocal:
		if cc, ok := concurrencyOf(a); ok {
			d := c.leases.acquire(key, lease, cc, o.Policy.instances, t.n > 0)
			g := int64(0)
			if d.Allowed {
				g = 1
			}
			return d, g, DegradedLocal
		}
		if t.upto {
			d, g := c.local.grant(key, a, o.Policy.instances, t.n)
			return d, g, DegradedLocal
		}
		d := c.local.check(key, a, o.Policy.instances, t.n)
		return d, t.grantedOf(d.Allowed, 0), DegradedLocal
	}
	return Decision{Allowed: true, Remaining: a.Quota(), Limit: a.Quota()}, t.n, DegradedFailOpen
}

// Check checks (and on admission consumes) cost units of a on key. A concurrency limit is only
// peeked at here (cost 0, through RL.ALL); its slots are taken with Acquire (an
// *UnsupportedError for a cost above 0).
//
// With batches (WithBatching) or the deny cache (WithDenyCache) on, a check of a cost above 0
// may be answered without calling Redis (Outcome.AnsweredLocally).
func (c *Client) Check(ctx context.Context, key string, a Algorithm, cost int64) (Outcome, error) {
	if _, ok := concurrencyOf(a); !ok {
		if cost > 0 && (c.denies != nil || c.batches != nil) {
			o, err := c.decideHot(ctx, []Limit{{key, a}}, cost)
			if err != nil {
				return Outcome{}, err
			}
			return o.single(), nil
		}
		return c.decideOne(ctx, key, a, cost, "")
	}
	o, err := c.CheckAll(ctx, []Limit{{key, a}}, cost)
	if err != nil {
		return Outcome{}, err
	}
	return Outcome{Decision: o.Decisions[0], Degraded: o.Degraded, Mode: o.Mode}, nil
}

// Peek is the state of a on key, consuming nothing (cost 0).
func (c *Client) Peek(ctx context.Context, key string, a Algorithm) (Outcome, error) {
	return c.Check(ctx, key, a, 0)
}

func (c *Client) decideOne(ctx context.Context, key string, a Algorithm, n int64,
	lease string) (Outcome, error) {
	return c.decideTake(ctx, key, a, cost(n), lease)
}

// decideTake is one limit: Redis, or the failure policy when Redis cannot answer.
func (c *Client) decideTake(ctx context.Context, key string, a Algorithm, t take,
	lease string) (Outcome, error) {
	if t.n < 0 {
		return Outcome{}, unsupported("a cost of at least 0")
	}
	var o Outcome
	err := c.guarded(ctx, func(ctx context.Context) error {
		d, granted, m, err := c.callOne(ctx, key, a, t, lease)
		o = Outcome{Decision: d, Mode: m, Granted: granted}
		return err
	})
	if err == errUnavailable {
		d, granted, g := c.degradedTake(key, a, t, lease)
		return Outcome{Decision: d, Degraded: g, Granted: granted}, nil
	}
	return o, err
}

// CheckUpto is a partial grant (UPTO n): as many units of a on key as are left now, at least 1
// and at most n, taken in one call; Outcome.Granted says how many (0 when denied: nothing was
// left, and the decision is the denial of one unit). Give back what goes unused with Settle (a
// negative delta). n from 1 to 10^15 (1,000 for a sliding log); not for a concurrency limit
// (an *UnsupportedError, as for n of 0). Batches and the deny cache are not used. When Redis
// cannot answer: FailOpen grants n (nothing taken), FailClosed denies, Local grants what its
// in-process bucket has, at most n.
func (c *Client) CheckUpto(ctx context.Context, key string, a Algorithm, n int64) (Outcome,
	error) {
	if _, ok := concurrencyOf(a); ok {
		return Outcome{}, unsupported("a concurrency limit is not granted in part (a lease is one slot)")
	}
	if n < 1 {
		return Outcome{}, unsupported("UPTO n takes n of at least 1")
	}
	return c.decideTake(ctx, key, a, take{n: n, upto: true}, "")
}

// CheckAllUpto is a partial grant of several limits at once (RL.ALL ... UPTO n): every limit is
// granted the same units, the fewest any of them has left, at most n (MultiOutcome.Granted; 0
// when denied, as a cost of 1 would be). One limit alone uses its own command. Concurrency
// limits are refused (an *UnsupportedError).
func (c *Client) CheckAllUpto(ctx context.Context, limits []Limit, n int64) (MultiOutcome,
	error) {
	if hasConcurrency(limits) {
		return MultiOutcome{}, unsupported("a concurrency limit is not granted in part (a lease is one slot)")
	}
	if n < 1 {
		return MultiOutcome{}, unsupported("UPTO n takes n of at least 1")
	}
	return c.decideAllTake(ctx, limits, take{n: n, upto: true}, "")
}

// CheckAll checks several limits at once: admitted only if every limit admits, and then cost is
// consumed from all of them (RL.ALL, or all.lua; one limit alone uses its own command).
// Concurrency limits are only peeked at here (cost 0); their slots are taken with AcquireAll.
// Batches and the deny cache apply as for Check.
func (c *Client) CheckAll(ctx context.Context, limits []Limit, cost int64) (MultiOutcome, error) {
	if !hasConcurrency(limits) {
		if cost > 0 && len(limits) >= 1 && len(limits) <= 16 && (c.denies != nil || c.batches != nil) {
			return c.decideHot(ctx, limits, cost)
		}
		return c.decideAll(ctx, limits, cost, "")
	}
	if cost > 0 {
		return MultiOutcome{}, unsupported("concurrency limits take a lease: Client.AcquireAll")
	}
	return c.decideAll(ctx, limits, 0, newLeaseID())
}

func hasConcurrency(limits []Limit) bool {
	for _, l := range limits {
		if _, ok := concurrencyOf(l.Algorithm); ok {
			return true
		}
	}
	return false
}

// decideAll is several limits in one call (one alone with its own command, except a
// concurrency limit peeked at with cost 0, which only RL.ALL can do).
func (c *Client) decideAll(ctx context.Context, limits []Limit, n int64,
	lease string) (MultiOutcome, error) {
	return c.decideAllTake(ctx, limits, cost(n), lease)
}

func (c *Client) decideAllTake(ctx context.Context, limits []Limit, t take,
	lease string) (MultiOutcome, error) {
	if len(limits) == 1 {
		_, conc := concurrencyOf(limits[0].Algorithm)
		if t.n > 0 || !conc {
			o, err := c.decideTake(ctx, limits[0].Key, limits[0].Algorithm, t, lease)
			if err != nil {
				return MultiOutcome{}, err
			}
			deniedBy := 0
			if !o.Decision.Allowed {
				deniedBy = 1
			}
			return MultiOutcome{Allowed: o.Decision.Allowed, DeniedBy: deniedBy,
				Decisions: []Decision{o.Decision}, Degraded: o.Degraded, Mode: o.Mode,
				Granted: o.Granted}, nil
		}
	}
	if len(limits) == 0 || len(limits) > 16 {
		return MultiOutcome{}, unsupported("between 1 and 16 limits per call")
	}
	if t.n < 0 {
		return MultiOutcome{}, unsupported("a cost of at least 0")
	}
	var o MultiOutcome
	err := c.guarded(ctx, func(ctx context.Context) error {
		var err error
		o, err = c.callAll(ctx, limits, t, lease)
		return err
	})
	if err == errUnavailable {
		return c.degradedAllTake(limits, t, lease), nil
	}
	return o, err
}

func (c *Client) degradedAll(limits []Limit, n int64, lease string) MultiOutcome {
	return c.degradedAllTake(limits, cost(n), lease)
}

func (c *Client) degradedAllTake(limits []Limit, t take, lease string) MultiOutcome {
	degraded := DegradedFailOpen
	// Peek first so that a denial consumes from none of the limits.
	peeks := make([]Decision, len(limits))
	for i, l := range limits {
		peeks[i], degraded = c.degradedOne(l.Key, l.Algorithm, 0, lease)
	}
	// A partial grant takes what the fewest left allow, at most n (as RL.ALL ... UPTO n).
	cost := t.n
	if t.upto && degraded == DegradedLocal {
		for _, p := range peeks {
			if p.Remaining < cost {
				cost = p.Remaining
			}
		}
		if cost < 1 {
			cost = 1
		}
	}
	denier := -1
	for i, l := range limits {
		_, conc := concurrencyOf(l.Algorithm)
		var denies bool
		switch {
		case degraded == DegradedFailClosed:
			denies = true
		case conc:
			// One slot whatever the cost; none taken by a peek.
			denies = cost > 0 && !peeks[i].Allowed
		default:
			denies = peeks[i].Remaining < cost
		}
		if denies {
			denier = i
			break
		}
	}
	out := MultiOutcome{Allowed: denier < 0, Degraded: degraded}
	if denier < 0 {
		out.Granted = cost
	}
	if denier >= 0 {
		out.DeniedBy = denier + 1
		peeks[denier], _ = c.degradedOne(limits[denier].Key, limits[denier].Algorithm, cost, lease)
		out.Decisions = peeks
		return out
	}
	out.Decisions = make([]Decision, len(limits))
	for i, l := range limits {
		out.Decisions[i], _ = c.degradedOne(l.Key, l.Algorithm, cost, lease)
	}
	return out
}

// leaseIDs are unique per call: a random per-process prefix, the process id, then a counter.
var (
	leasePrefix  string
	leaseCounter atomic.Uint64
)

func init() {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		binaryTime := uint64(time.Now().UnixNano())
		for i := range b {
			b[i] = byte(binaryTime >> (8 * i))
		}
	}
	leasePrefix = hex.EncodeToString(b[:]) + "-" + fmt.Sprintf("%x", os.Getpid())
}

func newLeaseID() string {
	return fmt.Sprintf("%s-%x", leasePrefix, leaseCounter.Add(1)-1)
}

// Acquire takes one of limit.Limit slots of key for a new lease (RL.ACQUIRE with a fresh lease
// id). Admitted: the outcome and the Lease, which gives the slot back when released
// (Lease.Release) and can be renewed. Denied: the outcome alone, RetryAfterMs until a lease
// expires. When Redis cannot answer the failure policy decides: FailOpen admits with a lease
// that holds nothing, FailClosed denies, Local takes a slot of an in-process semaphore.
func (c *Client) Acquire(ctx context.Context, key string, limit Concurrency) (LeaseOutcome,
	error) {
	return c.AcquireAs(ctx, key, limit, newLeaseID())
}

// AcquireAs is Acquire with the caller's lease id (1 to 128 bytes, unique to the holder, such
// as a job id): a live lease of that id is renewed instead of taking a second slot.
func (c *Client) AcquireAs(ctx context.Context, key string, limit Concurrency,
	id string) (LeaseOutcome, error) {
	o, err := c.decideOne(ctx, key, limit, 1, id)
	if err != nil {
		return LeaseOutcome{}, err
	}
	out := LeaseOutcome{Outcome: o}
	if o.Decision.Allowed {
		out.Lease = newLease(c, id, []leaseLimit{{key, limit}}, o.Degraded)
	}
	return out, nil
}

// AcquireAll checks several limits at once, concurrency limits among them (RL.ALL ... LEASE id
// COST cost): admitted only if every limit admits; then cost is consumed from the others and
// one slot of each concurrency limit is held by the returned lease (nil without a concurrency
// limit). Cost 0 peeks and takes no slot.
func (c *Client) AcquireAll(ctx context.Context, limits []Limit, cost int64) (MultiLeaseOutcome,
	error) {
	var held []leaseLimit
	for _, l := range limits {
		if cc, ok := concurrencyOf(l.Algorithm); ok {
			held = append(held, leaseLimit{l.Key, cc})
		}
	}
	if len(held) == 0 {
		o, err := c.decideAll(ctx, limits, cost, "")
		return MultiLeaseOutcome{Outcome: o}, err
	}
	id := newLeaseID()
	o, err := c.decideAll(ctx, limits, cost, id)
	if err != nil {
		return MultiLeaseOutcome{}, err
	}
	out := MultiLeaseOutcome{Outcome: o}
	if o.Allowed && cost > 0 {
		out.Lease = newLease(c, id, held, o.Degraded)
	}
	return out, nil
}

// Release gives back id's slot of key (RL.RELEASE): whether a live lease was released; false
// too when Redis cannot answer (the lease then expires by itself). Idempotent.
func (c *Client) Release(ctx context.Context, key, id string) (bool, error) {
	var n int64
	err := c.guarded(ctx, func(ctx context.Context) error {
		var err error
		n, err = c.callRelease(ctx, key, id)
		return err
	})
	if err == errUnavailable {
		return false, nil
	}
	return n == 1, err
}

// Reserve checks and on admission consumes estimate units of a on key, as Check does, for work
// whose true cost is known only afterwards. Admitted: the outcome and the Reservation, whose
// Settle charges or refunds the difference once the cost is known (left unsettled, the
// estimate stays charged). Denied: the outcome alone. Concurrency limits are not settled (an
// *UnsupportedError).
func (c *Client) Reserve(ctx context.Context, key string, a Algorithm,
	estimate int64) (ReservationOutcome, error) {
	if _, ok := concurrencyOf(a); ok {
		return ReservationOutcome{}, unsupported("concurrency limits are not settled: Client.Acquire")
	}
	o, err := c.decideOne(ctx, key, a, estimate, "")
	if err != nil {
		return ReservationOutcome{}, err
	}
	out := ReservationOutcome{Outcome: o}
	if o.Decision.Allowed {
		out.Reservation = &Reservation{client: c, limits: []Limit{{key, a}}, estimate: estimate,
			charged: o.Degraded}
	}
	return out, nil
}

// ReserveAll is Reserve over several limits at once, as CheckAll: admitted only if every limit
// admits, and then estimate is consumed from all of them; the reservation settles them all in
// one call.
func (c *Client) ReserveAll(ctx context.Context, limits []Limit,
	estimate int64) (MultiReservationOutcome, error) {
	if hasConcurrency(limits) {
		return MultiReservationOutcome{},
			unsupported("concurrency limits are not settled: Client.AcquireAll")
	}
	o, err := c.decideAll(ctx, limits, estimate, "")
	if err != nil {
		return MultiReservationOutcome{}, err
	}
	out := MultiReservationOutcome{Outcome: o}
	if o.Allowed {
		out.Reservation = &Reservation{client: c, limits: append([]Limit(nil), limits...),
			estimate: estimate, charged: o.Degraded}
	}
	return out, nil
}

// Settle adjusts what was consumed from every limit by delta units in one call (RL.SETTLE ...
// DELTA delta): below 0 gives -delta units back (never above the limit), above 0 takes delta
// more without asking whether they are left (a limit may go into debt, and then denies until it
// is paid back), 0 only reports. The answer is every limit's state afterwards. When Redis
// cannot answer nothing is adjusted, and the decisions are the failure policy's for a cost of 0.
func (c *Client) Settle(ctx context.Context, limits []Limit, delta int64) (Settlement, error) {
	if hasConcurrency(limits) {
		return Settlement{}, unsupported("concurrency limits are not settled")
	}
	if len(limits) == 0 || len(limits) > 16 {
		return Settlement{}, unsupported("between 1 and 16 limits per call")
	}
	var s Settlement
	err := c.guarded(ctx, func(ctx context.Context) error {
		ds, m, err := c.callSettle(ctx, limits, delta)
		s = Settlement{Decisions: ds, Mode: m}
		return err
	})
	if err == errUnavailable {
		s = Settlement{Decisions: make([]Decision, len(limits))}
		for i, l := range limits {
			s.Decisions[i], s.Degraded = c.degradedOne(l.Key, l.Algorithm, 0, "")
		}
		return s, nil
	}
	return s, err
}

// settleCharged settles where a reservation was charged: Redis, the in-process buckets of the
// Local policy, or nowhere (admitted by FailOpen: the policy's answer, nothing sent).
func (c *Client) settleCharged(ctx context.Context, limits []Limit, delta int64,
	charged Degraded) (Settlement, error) {
	switch {
	case charged == NotDegraded:
		return c.Settle(ctx, limits, delta)
	case charged == DegradedLocal && c.opts.Policy.kind == policyLocal:
		s := Settlement{Decisions: make([]Decision, len(limits)), Degraded: DegradedLocal}
		for i, l := range limits {
			s.Decisions[i] = c.local.adjust(l.Key, l.Algorithm, c.opts.Policy.instances, delta)
		}
		return s, nil
	}
	s := Settlement{Decisions: make([]Decision, len(limits)), Degraded: charged}
	for i, l := range limits {
		s.Decisions[i], _ = c.degradedOne(l.Key, l.Algorithm, 0, "")
	}
	return s, nil
}

// Top is the count keys with the most denials on the server, most first (RL.TOP count, count
// from 1 to 1,000), as the module counts them. Only the module keeps this list: in ModeScript
// and ModeFunction the answer is an *UnsupportedError. An operator's call: the command is
// outside the ratelimit ACL category, so an application's user gets a *RejectedError (NOPERM).
// No failure policy answers it: ErrUnavailable when Redis does not answer in time. Each server
// counts its own keys: on a cluster, ask every master through a client of its own.
func (c *Client) Top(ctx context.Context, count int) ([]TopEntry, error) {
	return c.callTop(ctx, integer(int64(count)))
}

// ResetTop clears the list of Top (RL.TOP RESET).
func (c *Client) ResetTop(ctx context.Context) error {
	_, err := c.callTop(ctx, "RESET")
	return err
}

func (c *Client) callTop(ctx context.Context, arg string) ([]TopEntry, error) {
	var entries []TopEntry
	moduleless := false
	err := c.guarded(ctx, func(ctx context.Context) error {
		mode, err := c.resolveMode(ctx)
		if err != nil {
			return err
		}
		if mode != ModeModule {
			moduleless = true
			return nil
		}
		reply, err := c.send(ctx, "RL.TOP", arg)
		if err != nil || arg == "RESET" {
			return err
		}
		var ok bool
		if entries, ok = topEntriesOf(reply); !ok {
			return errUnexpected{reply}
		}
		return nil
	})
	switch {
	case err == errUnavailable:
		return nil, ErrUnavailable
	case err != nil:
		return nil, err
	case moduleless:
		return nil, unsupported("the most-denied keys are counted by the module only (RL.TOP)")
	}
	if entries == nil {
		entries = []TopEntry{}
	}
	return entries, nil
}

// Limiter is a Client bound to one algorithm and its parameters.
type Limiter struct {
	client    *Client
	algorithm Algorithm
}

// NewLimiter binds a to c.
func NewLimiter(c *Client, a Algorithm) *Limiter {
	return &Limiter{client: c, algorithm: a}
}

func (l *Limiter) Client() *Client      { return l.client }
func (l *Limiter) Algorithm() Algorithm { return l.algorithm }

// Check checks and consumes one unit.
func (l *Limiter) Check(ctx context.Context, key string) (Outcome, error) {
	return l.client.Check(ctx, key, l.algorithm, 1)
}

// CheckCost checks and consumes cost units.
func (l *Limiter) CheckCost(ctx context.Context, key string, cost int64) (Outcome, error) {
	return l.client.Check(ctx, key, l.algorithm, cost)
}

// Peek is the current state, consuming nothing (cost 0).
func (l *Limiter) Peek(ctx context.Context, key string) (Outcome, error) {
	return l.client.Check(ctx, key, l.algorithm, 0)
}

// Reserve reserves estimate units, settled later with the true cost (see Client.Reserve).
func (l *Limiter) Reserve(ctx context.Context, key string, estimate int64) (ReservationOutcome,
	error) {
	return l.client.Reserve(ctx, key, l.algorithm, estimate)
}

// Acquire takes a slot of the limiter's concurrency limit (see Client.Acquire); an
// *UnsupportedError for the other algorithms.
func (l *Limiter) Acquire(ctx context.Context, key string) (LeaseOutcome, error) {
	cc, ok := concurrencyOf(l.algorithm)
	if !ok {
		return LeaseOutcome{}, unsupported("acquire takes a concurrency limit")
	}
	return l.client.Acquire(ctx, key, cc)
}
