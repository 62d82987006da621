package tests

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// Mode detection, the scripts' SHA-1s and NOSCRIPT, and replies and errors shaped as go-redis
// returns them, on real servers (the decisions themselves are the conformance table's).

func calls(t *testing.T, c redis.Conn, command string) int {
	t.Helper()
	info, err := redis.String(c.Do("INFO", "commandstats"))
	if err != nil {
		t.Fatal(err)
	}
	prefix := "cmdstat_" + command + ":calls="
	for _, line := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(line, prefix) {
			n, _ := strconv.Atoi(strings.SplitN(line[len(prefix):], ",", 2)[0])
			return n
		}
	}
	return 0
}

func TestAutoDetectsTheModuleTheLibraryOrTheScripts(t *testing.T) {
	ctx := context.Background()
	with := start(t, serverOpts{module: true})
	without := start(t, serverOpts{})
	bucket := ratelimit.TokenBucket{Capacity: 4, RefillPerSec: 0.0001}

	lazy := client(with, ratelimit.Options{})
	if _, known := lazy.Mode(); known {
		t.Fatal("the mode is known before any call")
	}
	o, err := lazy.Check(ctx, "k", bucket, 1)
	if err != nil || o.Mode != ratelimit.ModeModule || o.Decision.Remaining != 3 {
		t.Fatalf("%+v %v", o, err)
	}
	if m, known := lazy.Mode(); !known || m != ratelimit.ModeModule {
		t.Fatalf("after the first call: %v %v", m, known)
	}

	plain := client(without, ratelimit.Options{})
	if m, ok := plain.Detect(ctx); !ok || m != ratelimit.ModeScript {
		t.Fatalf("without the module: %v %v", m, ok)
	}
	loadLibrary(t, without)
	auto := client(without, ratelimit.Options{})
	if m, ok := auto.Detect(ctx); !ok || m != ratelimit.ModeFunction {
		t.Fatalf("with the library: %v %v", m, ok)
	}
	o, err = auto.Check(ctx, "k", bucket, 1)
	if err != nil || o.Mode != ratelimit.ModeFunction || o.Decision.Remaining != 3 {
		t.Fatalf("%+v %v", o, err)
	}
	// Unreachable: nothing detected, the policy answers.
	down := closedPort(ratelimit.Options{})
	if _, ok := down.Detect(ctx); ok {
		t.Fatal("detected on a closed port")
	}
	if o, err := down.Check(ctx, "k", bucket, 1); err != nil || o.Degraded != ratelimit.DegradedFailOpen {
		t.Fatalf("%+v %v", o, err)
	}
}

// The scripts go by their SHA-1 (EVALSHA) and are sent again (EVAL) once when the server has
// forgotten them.
func TestScriptsAreCalledBySHAAndReloadedOnNoscript(t *testing.T) {
	ctx := context.Background()
	s := start(t, serverOpts{})
	a := admin(t, s)
	cl := client(s, ratelimit.Options{Mode: ratelimit.ChooseScript})
	limits := []ratelimit.Limit{
		{Key: "{u}:a", Algorithm: ratelimit.FixedWindow{Limit: 3, WindowSec: 3600}},
		{Key: "{u}:b", Algorithm: ratelimit.SlidingLog{Limit: 5, WindowSec: 3600}},
	}
	var seen []int64
	for i := 0; i < 4; i++ {
		o, err := cl.Check(ctx, "k", ratelimit.GCRA{MaxBurst: 2, CountPerPeriod: 1, PeriodSec: 3600}, 1)
		if err != nil {
			t.Fatal(err)
		}
		m, err := cl.CheckAll(ctx, limits, 1)
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, o.Decision.Remaining, m.Decisions[0].Remaining, int64(m.DeniedBy))
	}
	if want := []int64{2, 2, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1}; !reflect.DeepEqual(seen, want) {
		t.Fatalf("%v, want %v", seen, want)
	}
	// Two scripts, each loaded once by EVAL after its first NOSCRIPT; every call an EVALSHA.
	if e, sha := calls(t, a, "eval"), calls(t, a, "evalsha"); e != 2 || sha != 8 {
		t.Fatalf("eval %d, evalsha %d", e, sha)
	}
	must(t, a, "SCRIPT", "FLUSH")
	if _, err := cl.Check(ctx, "k2", ratelimit.GCRA{MaxBurst: 2, CountPerPeriod: 1, PeriodSec: 3600}, 1); err != nil {
		t.Fatal(err)
	}
	if e, sha := calls(t, a, "eval"), calls(t, a, "evalsha"); e != 3 || sha != 9 {
		t.Fatalf("after SCRIPT FLUSH: eval %d, evalsha %d", e, sha)
	}
}

// goRedisShaped is a real connection whose replies take the shapes go-redis gives them:
// strings instead of []byte, its nil reply as an error, and server errors as an error type of
// its own (a string type with a RedisError method).
type goRedisShaped struct{ Redigo }

type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

func reshape(v interface{}) interface{} {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case int64:
		return x
	case []interface{}:
		out := make([]interface{}, len(x))
		for i, e := range x {
			out[i] = reshape(e)
		}
		return out
	}
	return v
}

func (g goRedisShaped) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	v, err := g.Redigo.Do(ctx, args...)
	var re redis.Error
	if errors.As(err, &re) {
		return nil, redisError(re.Error())
	}
	if err == nil && v == nil {
		return nil, redisError("redis: nil")
	}
	return reshape(v), err
}

func TestRepliesAndErrorsShapedAsGoRedisGivesThem(t *testing.T) {
	ctx := context.Background()
	s := start(t, serverOpts{module: true})
	for _, mode := range []ratelimit.ModeChoice{ratelimit.ModeAuto, ratelimit.ChooseScript} {
		cl := ratelimit.New(goRedisShaped{Redigo{pool(s.addr())}}, ratelimit.Options{Mode: mode})
		key := "shaped:" + strconv.Itoa(int(mode))
		o, err := cl.Check(ctx, key, ratelimit.TokenBucket{Capacity: 2, RefillPerSec: 0.0001}, 2)
		if err != nil || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != 0 {
			t.Fatalf("%v: %+v %v", mode, o, err)
		}
		o, err = cl.Check(ctx, key, ratelimit.TokenBucket{Capacity: 2, RefillPerSec: 0.0001}, 1)
		if err != nil || o.Decision.Allowed || o.Decision.RetryAfterMs < 9_999_000 {
			t.Fatalf("%v: %+v %v", mode, o, err)
		}
		_, err = cl.Check(ctx, key, ratelimit.TokenBucket{Capacity: 0, RefillPerSec: 1}, 1)
		var rejected *ratelimit.RejectedError
		if !errors.As(err, &rejected) || rejected.Code() != "ERR" ||
			err.Error() != "rejected by redis: ERR capacity must be between 1 and 1000000000000000" {
			t.Fatalf("%v: %v", mode, err)
		}
		if cl.BreakerOpen() {
			t.Fatal("a refusal tripped the breaker")
		}
		lease, err := cl.Acquire(ctx, key+":slots", ratelimit.Concurrency{Limit: 1, LeaseSec: 60})
		if err != nil || lease.Lease == nil {
			t.Fatalf("%+v %v", lease, err)
		}
		if freed, err := lease.Lease.Release(ctx); err != nil || !freed {
			t.Fatalf("release: %v %v", freed, err)
		}
	}
	top, err := ratelimit.New(goRedisShaped{Redigo{pool(s.addr())}}, ratelimit.Options{}).Top(ctx, 5)
	// The module's denials only: the scripts' are not counted.
	if err != nil || len(top) != 1 || top[0].Key != "shaped:0" || top[0].Denied != 1 ||
		top[0].Command != "RL.TOKENBUCKET" {
		t.Fatalf("%+v %v", top, err)
	}
}
