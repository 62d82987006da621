// Package tests runs the Go package against real servers it starts itself: the conformance
// table, a race of 200 goroutines, Redis killed and restarted under each failure policy,
// refusals, a 3-master cluster, the middleware over TCP, and the examples. RL_REDIS_SERVER
// names the server binary (default redis-server) and RL_MODULE the module (default the
// workspace's release build).
package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// Redigo is a redigo pool as a ratelimit.Conn through the package's adapter
// (redigoadapter.New), the one every test goes through; Redigo{pool} keeps the tests short. It
// is a ratelimit.DeadlineConn, as the adapter is: the client sends on the caller's goroutine.
type Redigo struct{ *redis.Pool }

func (p Redigo) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	return redigoadapter.New(p.Pool).Do(ctx, args...)
}

func (p Redigo) DoBy(ctx context.Context, deadline time.Time, args ...interface{}) (interface{},
	error) {
	return redigoadapter.New(p.Pool).DoBy(ctx, deadline, args...)
}

// Watched is the adapter with Do only, as a Conn of another client library: the client watches
// each request from a goroutine of its own, to its deadline.
type Watched struct{ *redis.Pool }

func (p Watched) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	return redigoadapter.New(p.Pool).Do(ctx, args...)
}

// Pin lends one connection of the pool (durable admissions).
func (p Redigo) Pin(ctx context.Context) (func(ctx context.Context, args ...interface{}) (interface{},
	error), func(), error) {
	return redigoadapter.New(p.Pool).Pin(ctx)
}

// pool is a redigo pool on addr, dialing within timeout.
func pool(addr string, dial ...redis.DialOption) *redis.Pool {
	opts := append([]redis.DialOption{redis.DialConnectTimeout(time.Second)}, dial...)
	return &redis.Pool{
		MaxIdle:     64,
		IdleTimeout: time.Minute,
		Dial:        func() (redis.Conn, error) { return redis.Dial("tcp", addr, opts...) },
	}
}

func serverBinary() string {
	if s := os.Getenv("RL_REDIS_SERVER"); s != "" {
		return s
	}
	return "redis-server"
}

// modulePath is RL_MODULE, else the workspace's build of the module.
func modulePath() (string, error) {
	if p := os.Getenv("RL_MODULE"); p != "" {
		return p, nil
	}
	for _, profile := range []string{"release", "debug"} {
		p, _ := filepath.Abs(filepath.Join("..", "..", "..", "target", profile,
			"libredis_rate_limiter.so"))
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("libredis_rate_limiter.so not found: set RL_MODULE or build the module")
}

// freePort is a loopback port nobody listens on.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type serverOpts struct {
	module    bool
	testClock bool
	cluster   bool
	port      int
	extra     []string
}

// server is a redis-server of the test, killed when the test ends.
type server struct {
	proc *os.Process
	done chan struct{} // closed when the process has exited
	err  error         // how it exited
	dir  string
	port int
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *server) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// kill stops the server at once (no shutdown handshake), as a crash would.
func (s *server) kill() {
	_ = s.proc.Kill()
	<-s.done
}

func (s *server) signal(sig syscall.Signal) error { return s.proc.Signal(sig) }

// launch starts a server in dir and waits until it answers PING. A port it chose itself (a pair
// for a cluster node) can be taken by another process between the check and the server's bind:
// then it tries again on another one, with the files of the failed start removed.
func launch(dir string, o serverOpts) (*server, error) {
	if o.port != 0 {
		return launchOn(dir, o)
	}
	for attempt := 1; ; attempt++ {
		if o.cluster {
			o.port = clusterPort()
		} else {
			o.port = freePort()
		}
		s, err := launchOn(dir, o)
		if err == nil || attempt >= 5 || !strings.Contains(err.Error(), "Address already in use") {
			return s, err
		}
		os.Remove(filepath.Join(dir, "redis.log"))
		os.Remove(filepath.Join(dir, "nodes.conf"))
	}
}

func launchOn(dir string, o serverOpts) (*server, error) {
	args := []string{"--port", strconv.Itoa(o.port), "--bind", "127.0.0.1", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"), "--save", "", "--appendonly", "no"}
	if o.module {
		m, err := modulePath()
		if err != nil {
			return nil, err
		}
		args = append(args, "--loadmodule", m)
		if o.testClock {
			args = append(args, "TESTCLOCK")
		}
	}
	if o.cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")
	}
	args = append(args, o.extra...)
	cmd := exec.Command(serverBinary(), args...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s could not start (%v); make servers installs the matrix",
			serverBinary(), err)
	}
	s := &server{proc: cmd.Process, done: make(chan struct{}), dir: dir, port: o.port}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := redis.Dial("tcp", s.addr()); err == nil {
			_, err = c.Do("PING")
			c.Close()
			if err == nil {
				return s, nil
			}
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("redis-server exited (%v); log:\n%s", s.err, s.log())
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return nil, errors.New("redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// start is launch for a test: its directory and its end are the test's.
func start(t testing.TB, o serverOpts) *server {
	t.Helper()
	s, err := launch(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	return s
}

// admin is a plain connection to s for the test's own commands.
func admin(t testing.TB, s *server) redis.Conn {
	t.Helper()
	c, err := redis.Dial("tcp", s.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func must(t testing.TB, c redis.Conn, args ...interface{}) interface{} {
	t.Helper()
	v, err := c.Do(args[0].(string), args[1:]...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

const t0 = int64(1_800_000_000_000_000)

func setClock(t testing.TB, c redis.Conn, us int64) {
	t.Helper()
	must(t, c, "RL.TESTCLOCK", "SET", us)
}

func advanceClock(t testing.TB, c redis.Conn, us int64) {
	t.Helper()
	must(t, c, "RL.TESTCLOCK", "ADVANCE", us)
}

// client is a ratelimit client on s through a redigo pool.
func client(s *server, o ratelimit.Options) *ratelimit.Client {
	return ratelimit.New(Redigo{pool(s.addr())}, o)
}

// closedPort is a client pointed at a port nobody listens on.
func closedPort(o ratelimit.Options) *ratelimit.Client {
	return ratelimit.New(Redigo{pool("127.0.0.1:" + strconv.Itoa(freePort()))}, o)
}

// loadLibrary loads the Functions library through the package.
func loadLibrary(t testing.TB, s *server) {
	t.Helper()
	if err := ratelimit.LoadLibrary(context.Background(), Redigo{pool(s.addr())}); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond every 5 ms for at most 5 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func zcard(t testing.TB, c redis.Conn, key string) int64 {
	t.Helper()
	n, err := redis.Int64(c.Do("ZCARD", key))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
