package ratelimit

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Leased batches for hot keys: one partial grant (UPTO n) takes several units of a key (or of
// every limit of an RL.ALL plan) at once, the process admits its requests from them without
// calling Redis, and what it did not use goes back with RL.SETTLE ... DELTA -n when the batch's
// lease ends, when the client is flushed or closed, or when the batch leaves the bounded table.
//
// Every request admitted from a batch spent a unit that Redis granted: a process never admits
// more than it was granted. What a batch holds is not available to other processes until it is
// used or given back; that is the most they can be refused beyond the exact answer
// (docs/clients.md states the bound).

// Batching says when and how a client takes batches (Client.WithBatching). A key (or a plan of
// several limits checked together) is batched when one of its keys is declared hot (HotKey,
// HotKeysWhere), or when this process checks it at least DetectPerSec times in a second.
// NewBatching is the defaults; the zero Batching is not usable.
type Batching struct {
	hotKeys        []string
	hotWhere       func(string) bool
	detectPerSec   int
	lease          time.Duration
	initial        int64
	maxBatch       int64
	remainingShare int64
	maxKeys        int
}

// NewBatching is the defaults: detection at 100 calls per second, leases of 200 ms, batches
// from 8 up to 1,024 units and at most 1/8 of what Redis said remains, 1,024 keys tracked.
func NewBatching() Batching {
	return Batching{detectPerSec: 100, lease: 200 * time.Millisecond, initial: 8, maxBatch: 1024,
		remainingShare: 8, maxKeys: 1024}
}

// HotKey batches key from its first call (a plan of several limits when any of its keys is).
func (b Batching) HotKey(key string) Batching {
	b.hotKeys = append(append([]string(nil), b.hotKeys...), key)
	return b
}

// HotKeysWhere batches the keys for which f is true from their first call.
func (b Batching) HotKeysWhere(f func(key string) bool) Batching {
	b.hotWhere = f
	return b
}

// DetectPerSec batches a key once this process checks it at least calls times within one second
// (counted in whole seconds from its first call, the previous second's count included); 0: only
// declared keys (default 100).
func (b Batching) DetectPerSec(calls int) Batching {
	if calls < 0 {
		calls = 0
	}
	b.detectPerSec = calls
	return b
}

// Lease is how long a batch lives: what it has not used by then goes back (default 200 ms). A
// fixed window's batch ends with the window it was granted in, if that comes first.
func (b Batching) Lease(d time.Duration) Batching {
	b.lease = d
	return b
}

// Initial is the first batch size (default 8).
func (b Batching) Initial(units int64) Batching {
	b.initial = max64(units, 1)
	return b
}

// MaxBatch is the largest batch (default 1,024).
func (b Batching) MaxBatch(units int64) Batching {
	b.maxBatch = max64(units, 1)
	return b
}

// RemainingShare: a batch asks for at most 1/divisor of what Redis last said remains (default
// 8), so a nearly exhausted key is decided one call per request.
func (b Batching) RemainingShare(divisor int64) Batching {
	b.remainingShare = max64(divisor, 1)
	return b
}

// MaxKeys is the keys (or plans) tracked at once, the least recently used forgotten first, its
// batch given back (default 1,024).
func (b Batching) MaxKeys(n int) Batching {
	if n < 1 {
		n = 1
	}
	b.maxKeys = n
	return b
}

func (b Batching) declared(limits []Limit) bool {
	for _, l := range limits {
		for _, h := range b.hotKeys {
			if h == l.Key {
				return true
			}
		}
		if b.hotWhere != nil && b.hotWhere(l.Key) {
			return true
		}
	}
	return false
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func min64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

// BatchStats is what the batches of a client did since they were made (units, and requests
// answered).
type BatchStats struct {
	// Partial grants sent to take a batch.
	Refills uint64
	// Units those grants took.
	Granted uint64
	// Units spent by admitted requests: the requests that took a batch and those answered from
	// one.
	Used uint64
	// Requests admitted from a batch without a call to Redis.
	Answered uint64
	// Units given back to Redis (RL.SETTLE ... DELTA -n).
	Returned uint64
	// Units neither used nor given back: a sliding window's or log's, a window's that ended, a
	// bucket's that refilled meanwhile, or a return Redis did not answer.
	Lapsed uint64
	// Units held in batches now.
	Held uint64
}

type batchCounters struct {
	refills, granted, used, answered, returned, lapsed atomic.Uint64
}

// batch is the units of one grant still held.
type batch struct {
	// When the grant was sent: its decisions were made at this moment or after.
	sent    time.Time
	ends    time.Time
	granted int64
	held    int64
	// The grant's reply, one per limit.
	decisions []Decision
	mode      Mode
}

// batchReturn is what goes back to Redis from one batch.
type batchReturn struct {
	limits []Limit
	batch  batch
}

type batchEntry struct {
	limits   []Limit
	declared bool
	// Calls counted per whole second since second, and in the second before.
	second   time.Time
	calls    int
	previous int
	// The next batch size (B).
	size int64
	// The fewest units Redis said remain, with the latest grant (before any: the limit).
	remaining int64
	batch     *batch
	// The latest batch was used up before its lease ended.
	usedUp bool
	// Incremented by every grant and every batch given back.
	generation uint64
	// The latest grant took less than it asked (or nothing, or Redis did not answer).
	short bool
	// Units of the callers waiting for a refill.
	waiting int64
	// One refill at a time: holding its one element is the turn.
	gate chan struct{}
}

// uptoMax is at most what one partial grant can take of these limits: 10^15, and 1,000
// sliding-log entries in all.
func uptoMax(limits []Limit) int64 {
	logs := int64(0)
	for _, l := range limits {
		if l.Algorithm.Keyword() == "SLIDINGLOG" {
			logs++
		}
	}
	if logs == 0 {
		return 1_000_000_000_000_000
	}
	return 1000 / logs
}

func newBatchEntry(limits []Limit, declared bool, cfg Batching, now time.Time,
	generation uint64) *batchEntry {
	remaining := int64(0)
	for i, l := range limits {
		if q := l.Algorithm.Quota(); i == 0 || q < remaining {
			remaining = q
		}
	}
	return &batchEntry{limits: append([]Limit(nil), limits...), declared: declared, second: now,
		size: min64(cfg.initial, cfg.maxBatch), remaining: remaining, generation: generation,
		gate: make(chan struct{}, 1)}
}

func (e *batchEntry) countCall(now time.Time) {
	gone := now.Sub(e.second)
	switch {
	case gone >= 2*time.Second:
		e.previous, e.calls, e.second = 0, 0, now
	case gone >= time.Second:
		e.previous, e.calls = e.calls, 0
		e.second = e.second.Add(time.Second)
	}
	e.calls++
}

func (e *batchEntry) hot(cfg Batching) bool {
	if e.declared {
		return true
	}
	m := e.calls
	if e.previous > m {
		m = e.previous
	}
	return cfg.detectPerSec > 0 && m >= cfg.detectPerSec
}

// worthABatch: 1/remaining_share of what Redis last said remains is above the cost. Otherwise
// the key is decided one call per request.
func (e *batchEntry) worthABatch(cost int64, cfg Batching) bool {
	return e.remaining/cfg.remainingShare > cost
}

// expire ends the batch if its lease is over: what it holds goes into returns, and B halves.
func (e *batchEntry) expire(now time.Time, returns *[]batchReturn) {
	if e.batch != nil && !now.Before(e.batch.ends) {
		e.giveBack(returns)
	}
}

// giveBack gives back what the batch holds now.
func (e *batchEntry) giveBack(returns *[]batchReturn) {
	b := e.batch
	if b == nil {
		return
	}
	e.batch = nil
	e.generation++
	if b.held > 0 {
		e.size = max64(e.size/2, 1)
		e.usedUp = false
		*returns = append(*returns, batchReturn{limits: e.limits, batch: *b})
	}
}

// take admits cost from the batch if it holds that much and its lease is not over.
func (e *batchEntry) take(cost int64, now time.Time) (MultiOutcome, bool) {
	b := e.batch
	if b == nil || !now.Before(b.ends) || b.held < cost {
		return MultiOutcome{}, false
	}
	b.held -= cost
	if b.held == 0 {
		e.usedUp = true
	}
	return batchAnswer(b, cost, now, LocalBatch), true
}

// ask is the size of the next grant: B (doubled if the last batch was used up), or what the
// callers waiting need if more, at most max_batch and 1/remaining_share of what Redis last said
// remains, at least the cost.
func (e *batchEntry) ask(cost int64, cfg Batching, most int64) int64 {
	if e.usedUp {
		e.size = min64(satMul2(e.size), cfg.maxBatch)
		e.usedUp = false
	}
	want := max64(e.size, satAdd(cost, e.waiting))
	share := e.remaining / cfg.remainingShare
	return max64(min64(min64(min64(want, cfg.maxBatch), share), most), cost)
}

func satMul2(n int64) int64 {
	if n > math.MaxInt64/2 {
		return math.MaxInt64
	}
	return n * 2
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// batchAnswer is the answer to a request admitted with cost units of batch b, which now holds
// b.held: each limit's remaining is what Redis said with the grant plus what the batch still
// holds (what Redis had before the grant, less what this process admitted from it since); the
// resets count down from the grant.
func batchAnswer(b *batch, cost int64, now time.Time, local LocalAnswer) MultiOutcome {
	gone := now.Sub(b.sent).Milliseconds()
	if gone < 0 {
		gone = 0
	}
	ds := make([]Decision, len(b.decisions))
	for i, d := range b.decisions {
		ds[i] = Decision{Allowed: true, Remaining: satAdd(d.Remaining, b.held),
			ResetAfterMs: max64(d.ResetAfterMs-gone, 0), Limit: d.Limit}
	}
	return MultiOutcome{Allowed: true, Decisions: ds, Mode: b.mode, Granted: cost,
		AnsweredLocally: local}
}

// returnable is the units of a batch that can go back to one limit at now without leaving it
// with more than it would have had if they had never been taken:
//
//   - a sliding window or log: none (a refund lowers the current window's count or removes the
//     newest entries, which may not be the batch's);
//   - a fixed window: all, while the window the grant was made in is surely still the current
//     one (now + margin before the grant's send time plus its reset_after_ms), else none;
//   - a token or leaky bucket and GCRA: all, less what the bucket may have refilled beyond its
//     capacity meanwhile (its rate times the time since the grant was sent plus margin, less
//     the room the grant left below the capacity), which a refund would count twice.
func returnable(a Algorithm, d Decision, b batch, now time.Time, margin time.Duration) int64 {
	switch a.Keyword() {
	case "FIXEDWINDOW":
		if now.Add(margin).Before(b.sent.Add(time.Duration(d.ResetAfterMs) * time.Millisecond)) {
			return b.held
		}
		return 0
	case "TOKENBUCKET", "LEAKYBUCKET", "GCRA":
		age := now.Add(margin).Sub(b.sent).Seconds()
		if age < 0 {
			age = 0
		}
		refilled := a.RatePerSec() * age
		// What the limit held before the grant is below remaining + 1 + granted.
		room := float64(d.Limit) - float64(d.Remaining) - float64(b.granted) - 1
		excess := math.Ceil(math.Max(refilled-math.Max(room, 0), 0))
		if excess >= float64(b.held) {
			return 0
		}
		return b.held - int64(excess)
	}
	return 0
}

// batches are the batches of a client and the clients made from it: a bounded table of keys
// (or plans), each with its detection counts and at most one batch.
type batches struct {
	cfg Batching
	// The client without batches nor deny cache, for the grants and returns.
	client   *Client
	mu       sync.Mutex
	table    *lru[*batchEntry]
	counters batchCounters
	closed   atomic.Bool
	// Where the next entry's generations start (2^32 apart).
	generations atomic.Uint64
	// Returns in flight (flush waits for them too).
	sendMu  sync.Mutex
	sending int
	sent    *sync.Cond
}

func newBatches(client *Client, cfg Batching) *batches {
	bs := &batches{cfg: cfg, client: client, table: newLRU[*batchEntry](cfg.maxKeys)}
	bs.sent = sync.NewCond(&bs.sendMu)
	return bs
}

func (bs *batches) stats() BatchStats {
	c := &bs.counters
	held := uint64(0)
	bs.mu.Lock()
	bs.table.each(func(_ string, e **batchEntry) {
		if (*e).batch != nil {
			held += uint64((*e).batch.held)
		}
	})
	bs.mu.Unlock()
	return BatchStats{Refills: c.refills.Load(), Granted: c.granted.Load(), Used: c.used.Load(),
		Answered: c.answered.Load(), Returned: c.returned.Load(), Lapsed: c.lapsed.Load(),
		Held: held}
}

// size is the size the next batch of sig would start from (B), if it is tracked.
func (bs *batches) size(sig string) (int64, bool) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	e, ok := bs.table.get(sig)
	if !ok {
		return 0, false
	}
	return (*e).size, true
}

type batchStep int

const (
	// Not hot (or not batchable): ask Redis as usual.
	stepPlain batchStep = iota
	// Answered from the batch.
	stepAnswer
	// The key is hot and its batch cannot cover the cost: take a new one.
	stepRefill
)

// tryLocal counts the call, and answers it from the batch when it can.
func (bs *batches) tryLocal(sig string, limits []Limit, cost int64) (MultiOutcome, batchStep) {
	if bs.closed.Load() || cost > uptoMax(limits) {
		return MultiOutcome{}, stepPlain
	}
	now := time.Now()
	var returns []batchReturn
	var o MultiOutcome
	step := stepPlain
	bs.mu.Lock()
	ep, ok := bs.table.get(sig)
	if !ok {
		first := bs.generations.Add(1<<32) - 1<<32
		e := newBatchEntry(limits, bs.cfg.declared(limits), bs.cfg, now, first)
		if _, evicted, ok := bs.table.insert(sig, e); ok {
			evicted.giveBack(&returns)
		}
		ep = &e
	}
	e := *ep
	e.countCall(now)
	e.expire(now, &returns)
	if got, ok := e.take(cost, now); ok {
		o, step = got, stepAnswer
	} else if e.hot(bs.cfg) && e.worthABatch(cost, bs.cfg) {
		step = stepRefill
	}
	bs.mu.Unlock()
	if step == stepAnswer {
		bs.counters.used.Add(uint64(cost))
		bs.counters.answered.Add(1)
	}
	bs.send(returns)
	return o, step
}

// grantResult is a refill's answer for the request that asked: ok false: decide it with a call
// of its own; own: when it was admitted from this grant, its units as a batch to give back
// should the caller be gone.
type grantResult struct {
	o   MultiOutcome
	ok  bool
	own *batch
	err error
}

// refill takes a new batch for sig, one refill at a time: callers that come while one is in
// flight wait for it and are served from it when it covers them. ok false: decide this request
// with a call of its own (the key is running low, Redis granted less than the cost, or the key
// left the table).
func (bs *batches) refill(ctx context.Context, sig string, limits []Limit, cost int64,
	denies *denyCache) (MultiOutcome, bool, error) {
	bs.mu.Lock()
	ep, ok := bs.table.get(sig)
	if !ok {
		bs.mu.Unlock()
		return MultiOutcome{}, false, nil
	}
	e := *ep
	e.waiting = satAdd(e.waiting, cost)
	gate, seen := e.gate, e.generation
	bs.mu.Unlock()
	// Counted among the callers waiting until it has its turn, even if it goes away.
	unwait := func() {
		bs.mu.Lock()
		if ep, ok := bs.table.get(sig); ok && *ep == e {
			e.waiting = max64(e.waiting-cost, 0)
		}
		bs.mu.Unlock()
	}
	select {
	case gate <- struct{}{}:
	case <-ctx.Done():
		unwait()
		return MultiOutcome{}, false, nil
	}
	unwait()
	release := func() { <-gate }
	now := time.Now()
	var returns []batchReturn
	bs.mu.Lock()
	ep, ok = bs.table.get(sig)
	if !ok || *ep != e {
		bs.mu.Unlock()
		release()
		return MultiOutcome{}, false, nil
	}
	e.expire(now, &returns)
	if o, ok := e.take(cost, now); ok {
		bs.mu.Unlock()
		release()
		bs.counters.used.Add(uint64(cost))
		bs.counters.answered.Add(1)
		bs.send(returns)
		return o, true, nil
	}
	if (e.generation != seen && e.short) || !e.worthABatch(cost, bs.cfg) || bs.closed.Load() {
		bs.mu.Unlock()
		release()
		bs.send(returns)
		return MultiOutcome{}, false, nil
	}
	// Too little left for this cost: it goes back before the new grant.
	e.giveBack(&returns)
	ask := e.ask(cost, bs.cfg, uptoMax(limits))
	bs.mu.Unlock()
	bs.send(returns)
	if denies != nil {
		if o, ok := denies.lookup(sig, cost); ok {
			release()
			return o, true, nil
		}
	}
	// The grant and its batch are made by a goroutine of their own, holding the turn: a caller
	// that goes away meanwhile (a cancelled request) neither loses the units nor lets a second
	// refill start; the units it would have used go back.
	done := make(chan grantResult, 1)
	// 0: the caller waits, 1: the answer is the caller's, 2: the caller is gone.
	var state atomic.Int32
	limits = append([]Limit(nil), limits...)
	go func() {
		r := bs.grant(sig, limits, cost, ask, denies)
		release()
		if state.CompareAndSwap(0, 1) {
			done <- r
		} else if r.own != nil {
			// The caller is gone: the units it would have used go back.
			bs.counters.used.Add(^uint64(cost - 1))
			bs.send([]batchReturn{{limits: limits, batch: *r.own}})
		}
	}()
	select {
	case r := <-done:
		return r.o, r.ok, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(0, 2) {
			return MultiOutcome{}, false, nil
		}
		r := <-done
		return r.o, r.ok, r.err
	}
}

// grant takes a batch of at most ask units for sig (its turn held by the caller).
func (bs *batches) grant(sig string, limits []Limit, cost, ask int64,
	denies *denyCache) grantResult {
	bs.counters.refills.Add(1)
	sent := time.Now()
	reply, answered, err := bs.client.tryGrant(context.Background(), limits, ask)
	var returns []batchReturn
	if err != nil || !answered {
		bs.mu.Lock()
		if ep, ok := bs.table.get(sig); ok {
			(*ep).generation++
			(*ep).short = true
		}
		bs.mu.Unlock()
		if err != nil {
			return grantResult{err: err}
		}
		// Redis could not answer: the failure policy answers this request.
		return grantResult{o: bs.client.degradedFor(limits, cost), ok: true}
	}
	g := reply.Granted
	bs.counters.granted.Add(uint64(g))
	admitted := g >= cost
	b := &batch{sent: sent, ends: sent.Add(bs.cfg.lease), granted: g, held: g,
		decisions: reply.Decisions, mode: reply.Mode}
	if admitted {
		b.held = g - cost
	}
	for i, l := range limits {
		if l.Algorithm.Keyword() == "FIXEDWINDOW" && i < len(reply.Decisions) {
			if end := sent.Add(time.Duration(reply.Decisions[i].ResetAfterMs) * time.Millisecond); end.Before(b.ends) {
				b.ends = end
			}
		}
	}
	var res grantResult
	if admitted {
		// Redis's own answer for this request: the grant's, less the units left in the batch.
		res = grantResult{o: batchAnswer(b, cost, b.sent, NotLocal), ok: true}
		own := *b
		own.held = cost
		res.own = &own
	}
	bs.mu.Lock()
	ep, ok := bs.table.get(sig)
	if ok && !bs.closed.Load() {
		e := *ep
		e.generation++
		e.short = g < ask
		e.usedUp = false
		for i, d := range reply.Decisions {
			if i == 0 || d.Remaining < e.remaining {
				e.remaining = d.Remaining
			}
		}
		e.size = max64(min64(e.size, e.remaining/bs.cfg.remainingShare), 1)
		// Whatever another grant left (none while turns are kept) goes back.
		e.giveBack(&returns)
		if b.held > 0 {
			bs.expireAt(sig, e, e.generation, b.ends)
			e.batch = b
		} else if admitted {
			e.usedUp = true
		}
	} else if b.held > 0 {
		returns = append(returns, batchReturn{limits: limits, batch: *b})
	}
	bs.mu.Unlock()
	bs.send(returns)
	if admitted {
		bs.counters.used.Add(uint64(cost))
		return res
	}
	if g == 0 && cost == 1 {
		// Nothing left: the denial of one unit, exactly what a call with cost 1 answers.
		reply.Granted = 0
		if denies != nil {
			denies.record(sig, cost, reply, sent)
		}
		return grantResult{o: reply, ok: true}
	}
	return grantResult{}
}

// observe is what Redis answered a call of sig made without a batch: what remains, for the next
// batch's size.
func (bs *batches) observe(sig string, o MultiOutcome) {
	if o.Degraded != NotDegraded || o.AnsweredLocally != NotLocal || len(o.Decisions) == 0 {
		return
	}
	r := o.Decisions[0].Remaining
	for _, d := range o.Decisions[1:] {
		r = min64(r, d.Remaining)
	}
	bs.mu.Lock()
	if ep, ok := bs.table.get(sig); ok {
		(*ep).remaining = r
	}
	bs.mu.Unlock()
}

// expireAt gives back the batch of sig when its lease ends, unless another grant replaced it
// (or the entry left the table).
func (bs *batches) expireAt(sig string, e *batchEntry, generation uint64, at time.Time) {
	time.AfterFunc(time.Until(at), func() {
		var returns []batchReturn
		bs.mu.Lock()
		if ep, ok := bs.table.peek(sig); ok && *ep == e && e.generation == generation {
			e.giveBack(&returns)
		}
		bs.mu.Unlock()
		bs.send(returns)
	})
}

// send gives back returns from a goroutine of its own.
func (bs *batches) send(returns []batchReturn) {
	if len(returns) == 0 {
		return
	}
	bs.sendMu.Lock()
	bs.sending++
	bs.sendMu.Unlock()
	go func() {
		for _, r := range returns {
			bs.giveBack(r)
		}
		bs.sendMu.Lock()
		bs.sending--
		bs.sent.Broadcast()
		bs.sendMu.Unlock()
	}()
}

// giveBack sends what r can give back, one RL.SETTLE per distinct number of units (usually one
// for every limit); the units given back to every limit (the fewest, for a plan).
func (bs *batches) giveBack(r batchReturn) int64 {
	now := time.Now()
	margin := bs.client.opts.Timeout
	deltas := make([]int64, len(r.limits))
	for i, l := range r.limits {
		if i < len(r.batch.decisions) {
			deltas[i] = returnable(l.Algorithm, r.batch.decisions[i], r.batch, now, margin)
		}
	}
	back := make([]int64, len(deltas))
	done := map[int64]bool{}
	for _, n := range deltas {
		if n <= 0 || done[n] {
			continue
		}
		done[n] = true
		var idx []int
		var subset []Limit
		for i, d := range deltas {
			if d == n {
				idx = append(idx, i)
				subset = append(subset, r.limits[i])
			}
		}
		s, err := bs.client.Settle(context.Background(), subset, -n)
		if err == nil && s.Degraded == NotDegraded {
			for _, i := range idx {
				back[i] = n
			}
		}
	}
	returned := int64(0)
	for i, n := range back {
		if i == 0 || n < returned {
			returned = n
		}
	}
	bs.counters.returned.Add(uint64(returned))
	bs.counters.lapsed.Add(uint64(r.batch.held - returned))
	return returned
}

// drain is every batch, taken out of the table.
func (bs *batches) drain() []batchReturn {
	var returns []batchReturn
	bs.mu.Lock()
	bs.table.each(func(_ string, e **batchEntry) { (*e).giveBack(&returns) })
	bs.mu.Unlock()
	return returns
}

// flush gives back what every batch holds now, and waits for the answers (and for the returns
// already on their way): the units it gave back.
func (bs *batches) flush() int64 {
	n := int64(0)
	for _, r := range bs.drain() {
		n += bs.giveBack(r)
	}
	bs.sendMu.Lock()
	for bs.sending > 0 {
		bs.sent.Wait()
	}
	bs.sendMu.Unlock()
	return n
}

// close stops taking batches (every client sharing them calls Redis one by one from now on)
// and gives back what they hold.
func (bs *batches) close() int64 {
	bs.closed.Store(true)
	return bs.flush()
}
