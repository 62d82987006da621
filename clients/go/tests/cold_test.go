package tests

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// A cold client under a burst: a new client with the default options, over a pool made as an
// application makes it, gets 200 calls at once as its very first work (a deploy, a restart, an
// autoscaling step), on one key of capacity 50, while every core is kept busy. Exactly 50 are
// admitted, none is answered by the failure policy, and the start-up is done once: one COMMAND
// INFO, at most one FUNCTION LIST, at most one script sent per script. The same through the
// middleware, 200 first requests over HTTP. RL_COLD_ROUNDS sets the rounds per mode (default 3;
// 0 skips the test; make test-go-cold runs 20).

const (
	coldCallers  = 200
	coldCapacity = 50
)

func coldRounds(t *testing.T) int {
	v := os.Getenv("RL_COLD_ROUNDS")
	if v == "" {
		return 3
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("RL_COLD_ROUNDS=%q: a number of rounds", v)
	}
	if n == 0 {
		t.Skip("RL_COLD_ROUNDS=0")
	}
	return n
}

// burnCPU keeps every core busy (one busy shell loop per core) until the test ends.
func burnCPU(t *testing.T) {
	t.Helper()
	for i := 0; i < runtime.NumCPU(); i++ {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

// commandStats is INFO commandstats as calls per command (command|info, script|load, ...).
func commandStats(t *testing.T, c redis.Conn) map[string]int {
	t.Helper()
	info, err := redis.String(c.Do("INFO", "commandstats"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(info, "\r\n") {
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		if err != nil {
			t.Fatalf("INFO commandstats: %q", line)
		}
		out[name] = n
	}
	return out
}

// coldTally is one burst: what the 200 callers were answered, and when.
type coldTally struct {
	admitted, denied, degraded int
	errs                       []string
	first, last                time.Duration
}

// burst runs call in coldCallers goroutines released at once; call says whether it was
// admitted and whether the answer was the failure policy's.
func burst(call func() (admitted, degraded bool, err error)) coldTally {
	var mu sync.Mutex
	var tally coldTally
	var took []time.Duration
	var wg sync.WaitGroup
	ready := make(chan struct{})
	var began time.Time
	for i := 0; i < coldCallers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-ready
			admitted, degraded, err := call()
			d := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			took = append(took, d)
			switch {
			case err != nil:
				tally.errs = append(tally.errs, err.Error())
			case degraded:
				tally.degraded++
				if admitted {
					tally.admitted++
				}
			case admitted:
				tally.admitted++
			default:
				tally.denied++
			}
		}()
	}
	began = time.Now()
	close(ready)
	wg.Wait()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	tally.first, tally.last = took[0], took[len(took)-1]
	return tally
}

// coldCounted are the start-up's commands counted per round, and the decisions' commands.
var coldCounted = []string{"command|info", "function|list", "function|load", "script|load",
	"eval", "evalsha", "fcall", "rl.tokenbucket"}

func TestAColdClientUnderABurstAdmitsExactlyTheLimit(t *testing.T) {
	rounds := coldRounds(t)
	withModule := start(t, serverOpts{module: true})
	withLibrary := start(t, serverOpts{})
	loadLibrary(t, withLibrary)
	bare := start(t, serverOpts{})
	burnCPU(t)
	bucket := ratelimit.TokenBucket{Capacity: coldCapacity, RefillPerSec: 0.0001}
	type summary struct {
		admitted, degraded [2]int // min, max
		first, last        [2]time.Duration
		counts             map[string][2]int
	}
	summaries := map[string]*summary{}
	var order []string
	for _, mode := range []struct {
		name string
		s    *server
		// What the start-up sends: COMMAND INFO always, FUNCTION LIST without the module,
		// the script (SCRIPT LOAD or EVAL) once when the scripts decide.
		functionList, scriptSent int
		decisions                string
	}{
		{"module", withModule, 0, 0, "rl.tokenbucket"},
		{"function", withLibrary, 1, 0, "fcall"},
		{"script", bare, 1, 1, "evalsha"},
	} {
		a := admin(t, mode.s)
		for _, surface := range []string{"calls", "middleware"} {
			name := mode.name + "/" + surface
			order = append(order, name)
			sum := &summary{counts: map[string][2]int{}}
			summaries[name] = sum
			for round := 0; round < rounds; round++ {
				if mode.name == "script" {
					must(t, a, "SCRIPT", "FLUSH")
				}
				must(t, a, "CONFIG", "RESETSTAT")
				key := fmt.Sprintf("cold:%s:%d", surface, round)
				var tally coldTally
				// A fresh client, with the defaults, over a pool made as the examples make it.
				cl := ratelimit.New(Redigo{newPool(mode.s.addr())}, ratelimit.Options{})
				if surface == "calls" {
					tally = burst(func() (bool, bool, error) {
						o, err := cl.Check(context.Background(), key, bucket, 1)
						return o.Decision.Allowed, o.Degraded != ratelimit.NotDegraded, err
					})
				} else {
					// The deny cache off: every caller's decision is to reach Redis (the
					// cache's own answers are counted in hotkeys_test.go).
					m := ratelimit.NewMiddleware(cl).Prefix(key).DenyCache(false).
						Limits("*", "*", ratelimit.NewPolicy("burst", bucket))
					tally = burstHTTP(t, m)
				}
				stats := commandStats(t, a)
				if cl.BreakerOpen() {
					t.Errorf("%s round %d: the start-up opened the breaker", name, round+1)
				}
				if mode.name == "script" {
					// The other clients' scripts are gone from the next round's server.
					must(t, a, "SCRIPT", "FLUSH")
				}
				t.Logf("%s round %d: %d admitted, %d denied, %d degraded, %d errors; first "+
					"decision after %v, last after %v; %s", name, round+1, tally.admitted,
					tally.denied, tally.degraded, len(tally.errs), tally.first.Round(time.Millisecond),
					tally.last.Round(time.Millisecond), formatStats(stats))
				if round == 0 {
					sum.admitted = [2]int{tally.admitted, tally.admitted}
					sum.degraded = [2]int{tally.degraded, tally.degraded}
					sum.first = [2]time.Duration{tally.first, tally.first}
					sum.last = [2]time.Duration{tally.last, tally.last}
				}
				sum.admitted = [2]int{minInt(sum.admitted[0], tally.admitted), maxInt(sum.admitted[1], tally.admitted)}
				sum.degraded = [2]int{minInt(sum.degraded[0], tally.degraded), maxInt(sum.degraded[1], tally.degraded)}
				sum.first = [2]time.Duration{minDur(sum.first[0], tally.first), maxDur(sum.first[1], tally.first)}
				sum.last = [2]time.Duration{minDur(sum.last[0], tally.last), maxDur(sum.last[1], tally.last)}
				for _, c := range coldCounted {
					r, seen := sum.counts[c]
					if !seen {
						r = [2]int{stats[c], stats[c]}
					}
					sum.counts[c] = [2]int{minInt(r[0], stats[c]), maxInt(r[1], stats[c])}
				}

				if len(tally.errs) > 0 {
					t.Errorf("%s round %d: errors: %v", name, round+1, tally.errs[:minInt(3, len(tally.errs))])
				}
				if tally.admitted != coldCapacity || tally.degraded != 0 ||
					tally.admitted+tally.denied != coldCallers {
					t.Errorf("%s round %d: %d admitted, %d denied, %d degraded: not %d admitted, "+
						"%d denied, none degraded", name, round+1, tally.admitted, tally.denied,
						tally.degraded, coldCapacity, coldCallers-coldCapacity)
				}
				if stats["command|info"] != 1 || stats["function|list"] != mode.functionList ||
					stats["function|load"] != 0 ||
					stats["script|load"]+stats["eval"] != mode.scriptSent {
					t.Errorf("%s round %d: the start-up sent %s; want command|info 1, "+
						"function|list %d, scripts sent %d", name, round+1, formatStats(stats),
						mode.functionList, mode.scriptSent)
				}
				// Every caller's decision reached Redis: once, or (scripts) at most twice for
				// the callers whose first EVALSHA met the flushed cache.
				if n := stats[mode.decisions]; n < coldCallers ||
					(mode.name != "script" && n != coldCallers) || n > 2*coldCallers {
					t.Errorf("%s round %d: %d %s for %d callers", name, round+1, n,
						mode.decisions, coldCallers)
				}
			}
		}
	}
	for _, name := range order {
		s := summaries[name]
		var counts []string
		for _, c := range coldCounted {
			if r := s.counts[c]; r[1] > 0 {
				counts = append(counts, fmt.Sprintf("%s %d-%d", c, r[0], r[1]))
			}
		}
		t.Logf("summary %s, %d rounds: admitted %d-%d, degraded %d-%d, first decision %v-%v, "+
			"last %v-%v; per round %s", name, rounds, s.admitted[0], s.admitted[1], s.degraded[0],
			s.degraded[1], s.first[0].Round(time.Millisecond), s.first[1].Round(time.Millisecond),
			s.last[0].Round(time.Millisecond), s.last[1].Round(time.Millisecond),
			strings.Join(counts, ", "))
	}
}

// burstHTTP sends coldCallers first requests at once through m, served by net/http over TCP,
// each on a connection of its own, from a process of their own (as an application's clients
// are: TestColdBurstHTTPClient, in this test binary run again).
func burstHTTP(t *testing.T, m *ratelimit.Middleware) coldTally {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: m.Handler(http.HandlerFunc(func(w http.ResponseWriter,
		r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})), ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestColdBurstHTTPClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RL_COLD_HTTP_URL=http://"+l.Addr().String()+"/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the HTTP clients: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var tally coldTally
		var first, last int64
		var errs int
		if _, err := fmt.Sscanf(line, "cold-http admitted=%d denied=%d degraded=%d errors=%d "+
			"first_us=%d last_us=%d", &tally.admitted, &tally.denied, &tally.degraded, &errs,
			&first, &last); err == nil {
			tally.first, tally.last = time.Duration(first)*time.Microsecond,
				time.Duration(last)*time.Microsecond
			for i := 0; i < errs; i++ {
				tally.errs = append(tally.errs, "a request failed: see the HTTP clients' output")
			}
			if errs > 0 {
				t.Logf("the HTTP clients:\n%s", out)
			}
			return tally
		}
	}
	t.Fatalf("the HTTP clients said nothing of their requests:\n%s", out)
	return coldTally{}
}

// TestColdBurstHTTPClient is the HTTP clients of burstHTTP (only when it runs them): coldCallers
// requests at once to RL_COLD_HTTP_URL, each on a connection of its own; one line of figures.
func TestColdBurstHTTPClient(t *testing.T) {
	url := os.Getenv("RL_COLD_HTTP_URL")
	if url == "" {
		t.Skip("run by TestAColdClientUnderABurstAdmitsExactlyTheLimit")
	}
	transport := &http.Transport{MaxIdleConnsPerHost: coldCallers, DisableKeepAlives: true}
	defer transport.CloseIdleConnections()
	httpClient := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	tally := burst(func() (bool, bool, error) {
		resp, err := httpClient.Get(url)
		if err != nil {
			return false, false, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		degraded := resp.Header.Get("RateLimit-Degraded") != ""
		switch resp.StatusCode {
		case http.StatusOK:
			return true, degraded, nil
		case http.StatusTooManyRequests:
			return false, degraded, nil
		}
		return false, degraded, fmt.Errorf("status %d", resp.StatusCode)
	})
	for _, e := range tally.errs {
		fmt.Println("error:", e)
	}
	fmt.Printf("cold-http admitted=%d denied=%d degraded=%d errors=%d first_us=%d last_us=%d\n",
		tally.admitted, tally.denied, tally.degraded, len(tally.errs), tally.first.Microseconds(),
		tally.last.Microseconds())
}

func formatStats(stats map[string]int) string {
	var parts []string
	for _, c := range coldCounted {
		if n := stats[c]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", c, n))
		}
	}
	return strings.Join(parts, ", ")
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func minDur(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

func maxDur(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}
