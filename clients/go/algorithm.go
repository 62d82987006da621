package ratelimit

import (
	"math"
	"strconv"
)

// Algorithm is one of the module's limiters with its parameters, as the matching RL.* command
// takes them: TokenBucket, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog, GCRA and
// Concurrency.
type Algorithm interface {
	// Command is the command's name (RL.TOKENBUCKET).
	Command() string
	// Keyword is the algorithm's keyword inside RL.ALL and RL.SETTLE (TOKENBUCKET, CONCURRENCY).
	Keyword() string
	// Params are the parameters after the key, without the cost (or the lease id).
	Params() []string
	// Quota is the limit the commands report (the fifth field of a reply).
	Quota() int64
	// RatePerSec is the sustained rate in units per second (for a concurrency limit: every slot
	// taken once per lease).
	RatePerSec() float64
	// WindowSecs is the policy's window in whole seconds, rounded up and at least 1: the window
	// of the window algorithms, the lease of a concurrency limit, the time from empty to full
	// for the others.
	WindowSecs() int64
	script() string
}

// TokenBucket is RL.TOKENBUCKET key capacity refill_per_sec: bursts up to Capacity, refilled
// continuously.
type TokenBucket struct {
	Capacity     int64
	RefillPerSec float64
}

// LeakyBucket is RL.LEAKYBUCKET key capacity leak_per_sec: a level of at most Capacity
// draining at a steady rate.
type LeakyBucket struct {
	Capacity   int64
	LeakPerSec float64
}

// FixedWindow is RL.FIXEDWINDOW key limit window_sec: Limit per window, opened by the first
// admitted call.
type FixedWindow struct {
	Limit     int64
	WindowSec float64
}

// SlidingWindow is RL.SLIDINGWINDOW key limit window_sec: Limit per rolling window, weighted
// from the previous one.
type SlidingWindow struct {
	Limit     int64
	WindowSec float64
}

// SlidingLog is RL.SLIDINGLOG key limit window_sec: exactly Limit in any window.
type SlidingLog struct {
	Limit     int64
	WindowSec float64
}

// GCRA is RL.GCRA key max_burst count_per_period period_sec: MaxBurst + 1 at once, then evenly
// spaced.
type GCRA struct {
	MaxBurst       int64
	CountPerPeriod int64
	PeriodSec      float64
}

// Concurrency is RL.ACQUIRE key limit lease_sec lease_id: at most Limit leases held at once on
// a key, each for LeaseSec seconds unless renewed or released first (CONCURRENCY inside RL.ALL,
// where it takes one slot whatever the cost).
type Concurrency struct {
	Limit    int64
	LeaseSec float64
}

// num writes a parameter in plain decimal notation, the shortest digits that read back the same
// value and never an exponent: the bytes the Rust client sends for the same value.
func num(v float64) string {
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func integer(v int64) string {
	return strconv.FormatInt(v, 10)
}

// ceilSecs rounds a duration in seconds up to whole seconds, at least 1.
func ceilSecs(w float64) int64 {
	c := math.Ceil(w)
	switch {
	case !(c >= 1): // below 1, and NaN
		return 1
	case c >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(c)
}

func (TokenBucket) Command() string   { return "RL.TOKENBUCKET" }
func (LeakyBucket) Command() string   { return "RL.LEAKYBUCKET" }
func (FixedWindow) Command() string   { return "RL.FIXEDWINDOW" }
func (SlidingWindow) Command() string { return "RL.SLIDINGWINDOW" }
func (SlidingLog) Command() string    { return "RL.SLIDINGLOG" }
func (GCRA) Command() string          { return "RL.GCRA" }
func (Concurrency) Command() string   { return "RL.ACQUIRE" }

func (TokenBucket) Keyword() string   { return "TOKENBUCKET" }
func (LeakyBucket) Keyword() string   { return "LEAKYBUCKET" }
func (FixedWindow) Keyword() string   { return "FIXEDWINDOW" }
func (SlidingWindow) Keyword() string { return "SLIDINGWINDOW" }
func (SlidingLog) Keyword() string    { return "SLIDINGLOG" }
func (GCRA) Keyword() string          { return "GCRA" }
func (Concurrency) Keyword() string   { return "CONCURRENCY" }

func (a TokenBucket) Params() []string { return []string{integer(a.Capacity), num(a.RefillPerSec)} }
func (a LeakyBucket) Params() []string { return []string{integer(a.Capacity), num(a.LeakPerSec)} }
func (a FixedWindow) Params() []string { return []string{integer(a.Limit), num(a.WindowSec)} }
func (a SlidingWindow) Params() []string {
	return []string{integer(a.Limit), num(a.WindowSec)}
}
func (a SlidingLog) Params() []string { return []string{integer(a.Limit), num(a.WindowSec)} }
func (a GCRA) Params() []string {
	return []string{integer(a.MaxBurst), integer(a.CountPerPeriod), num(a.PeriodSec)}
}
func (a Concurrency) Params() []string { return []string{integer(a.Limit), num(a.LeaseSec)} }

func (a TokenBucket) Quota() int64   { return a.Capacity }
func (a LeakyBucket) Quota() int64   { return a.Capacity }
func (a FixedWindow) Quota() int64   { return a.Limit }
func (a SlidingWindow) Quota() int64 { return a.Limit }
func (a SlidingLog) Quota() int64    { return a.Limit }
func (a Concurrency) Quota() int64   { return a.Limit }
func (a GCRA) Quota() int64 {
	if a.MaxBurst == math.MaxInt64 {
		return a.MaxBurst
	}
	return a.MaxBurst + 1
}

func (a TokenBucket) RatePerSec() float64   { return a.RefillPerSec }
func (a LeakyBucket) RatePerSec() float64   { return a.LeakPerSec }
func (a FixedWindow) RatePerSec() float64   { return float64(a.Limit) / a.WindowSec }
func (a SlidingWindow) RatePerSec() float64 { return float64(a.Limit) / a.WindowSec }
func (a SlidingLog) RatePerSec() float64    { return float64(a.Limit) / a.WindowSec }
func (a GCRA) RatePerSec() float64          { return float64(a.CountPerPeriod) / a.PeriodSec }
func (a Concurrency) RatePerSec() float64   { return float64(a.Limit) / a.LeaseSec }

func (a TokenBucket) WindowSecs() int64 { return ceilSecs(float64(a.Quota()) / a.RatePerSec()) }
func (a LeakyBucket) WindowSecs() int64 { return ceilSecs(float64(a.Quota()) / a.RatePerSec()) }
func (a GCRA) WindowSecs() int64        { return ceilSecs(float64(a.Quota()) / a.RatePerSec()) }
func (a FixedWindow) WindowSecs() int64 { return ceilSecs(a.WindowSec) }
func (a SlidingWindow) WindowSecs() int64 {
	return ceilSecs(a.WindowSec)
}
func (a SlidingLog) WindowSecs() int64  { return ceilSecs(a.WindowSec) }
func (a Concurrency) WindowSecs() int64 { return ceilSecs(a.LeaseSec) }

func (TokenBucket) script() string   { return scriptTokenBucket }
func (LeakyBucket) script() string   { return scriptLeakyBucket }
func (FixedWindow) script() string   { return scriptFixedWindow }
func (SlidingWindow) script() string { return scriptSlidingWindow }
func (SlidingLog) script() string    { return scriptSlidingLog }
func (GCRA) script() string          { return scriptGCRA }
func (Concurrency) script() string   { return scriptAcquire }

// concurrencyOf returns the concurrency limit, if a is one.
func concurrencyOf(a Algorithm) (Concurrency, bool) {
	switch c := a.(type) {
	case Concurrency:
		return c, true
	case *Concurrency:
		return *c, true
	}
	return Concurrency{}, false
}

// limiterWords are a limiter's words as the package sends them, made once per client and
// algorithm value: its command's name, its function's (FCALL), its script's SHA-1 (EVALSHA) and
// its parameters.
type limiterWords struct {
	command, function, sha interface{}
	params                 []interface{}
}

// maxWords is how many algorithm values a client keeps the words of; past it, the words of a
// new one are made on each call.
const maxWords = 1024

func makeWords(a Algorithm) *limiterWords {
	params := a.Params()
	w := &limiterWords{command: a.Command(), function: functionName(a.Command()),
		sha: shas[a.script()], params: make([]interface{}, len(params))}
	for i, p := range params {
		w.params[i] = p
	}
	return w
}

// wordsOf are a's words: kept for the package's own algorithm values (comparable, and copies:
// a pointer's value could change), made anew for anything else.
func (c *core) wordsOf(a Algorithm) *limiterWords {
	switch a.(type) {
	case TokenBucket, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog, GCRA, Concurrency:
	default:
		return makeWords(a)
	}
	if w, ok := c.words.Load(a); ok {
		return w.(*limiterWords)
	}
	w := makeWords(a)
	// (A NaN parameter never finds its entry again: the count bounds those too.)
	if c.wordCount.Load() < maxWords {
		if _, loaded := c.words.LoadOrStore(a, w); !loaded {
			c.wordCount.Add(1)
		}
	}
	return w
}

// smallWords are the integers 0 to 255 as words, the costs most calls send.
var smallWords = func() (w [256]interface{}) {
	for i := range w {
		w[i] = integer(int64(i))
	}
	return w
}()

// intWord is v as a word.
func intWord(v int64) interface{} {
	if v >= 0 && v < int64(len(smallWords)) {
		return smallWords[v]
	}
	return integer(v)
}
