// The Go client's cost per call: the client's check of one token bucket (Client.Check, through
// the package's redigo adapter, redigoadapter.Pool) next to the bare RL.TOKENBUCKET sent through
// the same redigo pool, one call at a time and with 64 concurrent callers, in blocks of each in
// turn. The floor is the bare command with only the deadline Go's own primitive gives, a
// context.WithTimeout of the client's timeout (100 ms) around it, the reply awaited until that
// context's deadline (redis.DoWithTimeout, as the adapter does). One line per measurement:
//
//	client-cost lang=go mode=<sequential|concurrent64> what=<raw|floor|client> p50_us=.. p99_us=.. calls_per_s=.. client_cpu_us_per_call=..
//
// Run from clients/go/tests (the module that has redigo), after `make go-deps`:
//
//	go run ../../../benches/clients/go.go
//
// RL_BENCH_ADDR is a server with the module to use; without it the bench starts one
// (RL_REDIS_SERVER, default redis-server, with RL_MODULE, default the workspace's release
// build) on a free port, on the second core (taskset, where there is one; make bench-clients
// runs the bench on the first), and stops it at the end. RL_BENCH_CALLS is the calls per
// measurement (default 200000).
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// Redigo is the bare command through the pool: a connection taken with the call's context, the
// reply awaited until its deadline (none for the raw row).
type Redigo struct{ *redis.Pool }

func (p Redigo) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	c, err := p.GetContext(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var timeout time.Duration
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	return redis.DoWithTimeout(c, timeout, args[0].(string), args[1:]...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// server is RL_BENCH_ADDR, or a server started here (and its stop).
func server() (string, func(), error) {
	if a := os.Getenv("RL_BENCH_ADDR"); a != "" {
		return a, func() {}, nil
	}
	bin := os.Getenv("RL_REDIS_SERVER")
	if bin == "" {
		bin = "redis-server"
	}
	module := os.Getenv("RL_MODULE")
	if module == "" {
		module, _ = filepath.Abs("../../../target/release/libredis_rate_limiter.so")
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "client-cost-go")
	if err != nil {
		return "", nil, err
	}
	args := []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--loadmodule", module}
	// The server on the second core (make bench-clients runs the bench on the first).
	if _, err := os.Stat("/usr/bin/taskset"); err == nil {
		args = append([]string{"/usr/bin/taskset", "-c", "1"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := redis.Dial("tcp", addr); err == nil {
			_, err = c.Do("PING")
			c.Close()
			if err == nil {
				return addr, stop, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("the server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tally is one measurement, over every block.
type tally struct {
	latencies []time.Duration
	wall, cpu time.Duration
}

func (t *tally) line(mode, what string) string {
	sort.Slice(t.latencies, func(i, j int) bool { return t.latencies[i] < t.latencies[j] })
	n := len(t.latencies)
	us := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds()*1e6, 'f', 1, 64) }
	return fmt.Sprintf("client-cost lang=go mode=%s what=%s p50_us=%s p99_us=%s calls_per_s=%.0f "+
		"client_cpu_us_per_call=%s", mode, what, us(t.latencies[n/2]), us(t.latencies[n*99/100]),
		float64(n)/t.wall.Seconds(), strconv.FormatFloat(t.cpu.Seconds()*1e6/float64(n), 'f', 2, 64))
}

// block runs calls calls of f over callers goroutines into t.
func block(t *tally, callers, calls int, f func(caller int) error) error {
	per := calls / callers
	lat := make([][]time.Duration, callers)
	errs := make(chan error, callers)
	var wg sync.WaitGroup
	cpu0, began := cpuTime(), time.Now()
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			mine := make([]time.Duration, 0, per)
			for i := 0; i < per; i++ {
				t0 := time.Now()
				if err := f(c); err != nil {
					errs <- err
					return
				}
				mine = append(mine, time.Since(t0))
			}
			lat[c] = mine
		}(c)
	}
	wg.Wait()
	t.wall += time.Since(began)
	t.cpu += cpuTime() - cpu0
	close(errs)
	for err := range errs {
		return err
	}
	for _, l := range lat {
		t.latencies = append(t.latencies, l...)
	}
	return nil
}

func run() error {
	addr, stop, err := server()
	if err != nil {
		return err
	}
	defer stop()
	calls := 200000
	if v := os.Getenv("RL_BENCH_CALLS"); v != "" {
		if calls, err = strconv.Atoi(v); err != nil || calls < 1000 {
			return fmt.Errorf("RL_BENCH_CALLS=%q", v)
		}
	}
	pool := &redis.Pool{MaxIdle: 64, IdleTimeout: time.Minute,
		Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
	defer pool.Close()
	conn := Redigo{pool}
	client := ratelimit.New(redigoadapter.New(pool), ratelimit.Options{})
	timeout := client.Options().Timeout
	// Never empty: 10^15 tokens refilled at 10^15 per second.
	bucket := ratelimit.TokenBucket{Capacity: 1e15, RefillPerSec: 1e15}
	params := bucket.Params()
	ctx := context.Background()
	if _, err := client.Check(ctx, "warm", bucket, 1); err != nil {
		return err
	}
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = "client-cost:" + strconv.Itoa(i)
	}
	raw := func(c int) error {
		_, err := conn.Do(ctx, "RL.TOKENBUCKET", keys[c], params[0], params[1], "1")
		return err
	}
	var degradedMu sync.Mutex
	degraded, late := 0, 0
	floor := func(c int) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := conn.Do(ctx, "RL.TOKENBUCKET", keys[c], params[0], params[1], "1")
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// Past the deadline: counted, reported below.
			degradedMu.Lock()
			late++
			degradedMu.Unlock()
			return nil
		}
		return err
	}
	check := func(cl *ratelimit.Client, c int) error {
		o, err := cl.Check(ctx, keys[c], bucket, 1)
		if err == nil && o.Degraded != ratelimit.NotDegraded {
			// Past the 100 ms deadline: counted, reported below.
			degradedMu.Lock()
			degraded++
			degradedMu.Unlock()
		} else if err == nil && !o.Decision.Allowed {
			err = fmt.Errorf("denied: %+v", o)
		}
		return err
	}
	checked := func(c int) error { return check(client, c) }
	const blocks = 10
	for _, m := range []struct {
		name    string
		callers int
	}{{"sequential", 1}, {"concurrent64", 64}} {
		var r, f, c tally
		per := calls / blocks
		// Warm the pool's connections for this many callers.
		if err := block(&tally{}, m.callers, m.callers*10, raw); err != nil {
			return err
		}
		// Each block begins with the next row, so that each row follows each other as often
		// (which row ran before moved a row's p50 in runs where the kernel placed the bench).
		rows := []struct {
			t *tally
			f func(int) error
		}{{&r, raw}, {&f, floor}, {&c, checked}}
		for b := 0; b < blocks; b++ {
			for i := range rows {
				row := rows[(b+i)%len(rows)]
				if err := block(row.t, m.callers, per, row.f); err != nil {
					return err
				}
			}
		}
		fmt.Println(r.line(m.name, "raw"))
		fmt.Println(f.line(m.name, "floor"))
		fmt.Println(c.line(m.name, "client"))
	}
	if late > 0 {
		fmt.Fprintf(os.Stderr, "client-cost (go): %d bare commands of the floor outlasted the "+
			"deadline; the machine is too busy for these figures\n", late)
	}
	if degraded > 0 {
		fmt.Fprintf(os.Stderr, "client-cost (go): %d checks were answered by the failure policy "+
			"(past the deadline); the machine is too busy for these figures\n", degraded)
	}
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "client-cost (go):", err)
		os.Exit(1)
	}
}
