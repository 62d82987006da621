// Command failoverworker is the Go client under the failover bench (clients/rust/tests/failover.rs,
// make failover): it takes units through the package, on a Sentinel's master
// (redigoadapter.NewSentinel) or a Redis Cluster (redigoadapter.NewCluster), as the bench asks
// on its standard input, and says what Redis answered on its standard output, so that the bench
// keeps its ledger outside Redis for the Go client as for its own.
//
//	failoverworker -sentinel 127.0.0.1:26379 -master mymaster [-durable]
//	failoverworker -cluster 127.0.0.1:7000,127.0.0.1:7001 [-durable]
//
// A request is a line "id take plan key" (the plans of the bench, by name) or "id short"; its
// answer, in any order, a line "id admitted", "id denied" or "id policy" (the failure policy
// answered, or an error), and "id n" for short: the admissions fewer replicas acknowledged in
// time. The client is the bench's: a timeout of 500 ms, fail closed, module mode; -durable adds
// durable admissions (1 replica, a WAIT of 100 ms, a short acknowledgement denied). Leases are
// held until the process ends. It ends when its input does.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

const capacity = 20
const long = 3600

func bucket() ratelimit.TokenBucket {
	return ratelimit.TokenBucket{Capacity: capacity, RefillPerSec: 0.0001}
}

// plans are the bench's loads by name: the limits a check takes (RL.ALL when more than one).
var plans = map[string][]ratelimit.Algorithm{
	"tokenbucket":   {bucket()},
	"leakybucket":   {ratelimit.LeakyBucket{Capacity: capacity, LeakPerSec: 0.0001}},
	"fixedwindow":   {ratelimit.FixedWindow{Limit: capacity, WindowSec: long}},
	"slidingwindow": {ratelimit.SlidingWindow{Limit: capacity, WindowSec: long}},
	"slidinglog":    {ratelimit.SlidingLog{Limit: capacity, WindowSec: long}},
	"gcra":          {ratelimit.GCRA{MaxBurst: capacity - 1, CountPerPeriod: 1, PeriodSec: long}},
	"all":           {bucket(), ratelimit.FixedWindow{Limit: capacity * 2, WindowSec: long}},
}

type worker struct {
	client *ratelimit.Client
	mu     sync.Mutex
	held   []*ratelimit.Lease
}

// answer is what Redis answered a request of plan on key.
func (w *worker) take(ctx context.Context, plan, key string) (string, error) {
	key0 := "{" + key + "}:0"
	verdict := func(allowed bool, degraded ratelimit.Degraded, err error) string {
		switch {
		case err != nil || degraded != ratelimit.NotDegraded:
			return "policy"
		case allowed:
			return "admitted"
		}
		return "denied"
	}
	switch plan {
	case "lease":
		o, err := w.client.Acquire(ctx, key0, ratelimit.Concurrency{Limit: capacity, LeaseSec: long})
		if err == nil && o.Lease != nil {
			w.mu.Lock()
			w.held = append(w.held, o.Lease)
			w.mu.Unlock()
		}
		return verdict(o.Outcome.Decision.Allowed, o.Outcome.Degraded, err), nil
	case "reserve":
		o, err := w.client.Reserve(ctx, key0, bucket(), 2)
		if err == nil && o.Reservation != nil {
			// A refund that does not arrive leaves the unit spent: under-admission.
			_, _ = o.Reservation.Settle(ctx, 1)
		}
		return verdict(o.Outcome.Decision.Allowed, o.Outcome.Degraded, err), nil
	}
	algos, ok := plans[plan]
	if !ok {
		return "", fmt.Errorf("no plan %q", plan)
	}
	var limits []ratelimit.Limit
	for i, a := range algos {
		limits = append(limits, ratelimit.Limit{Key: fmt.Sprintf("{%s}:%d", key, i), Algorithm: a})
	}
	o, err := w.client.CheckAll(ctx, limits, 1)
	return verdict(o.Allowed, o.Degraded, err), nil
}

func main() {
	sentinel := flag.String("sentinel", "", "Sentinels, host:port,...")
	master := flag.String("master", "mymaster", "the master's name at the Sentinels")
	cluster := flag.String("cluster", "", "cluster nodes, host:port,...")
	durable := flag.Bool("durable", false, "durable admissions (WAIT 1 100)")
	flag.Parse()
	var conn ratelimit.Conn
	switch {
	case *sentinel != "":
		conn = redigoadapter.NewSentinel(strings.Split(*sentinel, ","), *master)
	case *cluster != "":
		conn = redigoadapter.NewCluster(strings.Split(*cluster, ","))
	default:
		fmt.Fprintln(os.Stderr, "failoverworker: -sentinel or -cluster")
		os.Exit(2)
	}
	client := ratelimit.New(conn, ratelimit.Options{Timeout: 500 * time.Millisecond,
		Policy: ratelimit.FailClosed, Mode: ratelimit.ChooseModule})
	if *durable {
		var err error
		client, err = client.WithDurability(ratelimit.Durability{Replicas: 1,
			Timeout: 100 * time.Millisecond, Short: ratelimit.ShortAckDeny})
		if err != nil {
			fmt.Fprintln(os.Stderr, "failoverworker:", err)
			os.Exit(2)
		}
	}
	w := &worker{client: client}
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	reply := func(id, text string) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "%s %s\n", id, text)
		out.Flush()
	}
	in := bufio.NewScanner(os.Stdin)
	var running sync.WaitGroup
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 2 && f[1] == "short" {
			reply(f[0], fmt.Sprint(client.DurabilityStats().Short))
			continue
		}
		if len(f) != 4 || f[1] != "take" {
			fmt.Fprintf(os.Stderr, "failoverworker: a request is \"id take plan key\" or \"id short\", not %q\n", in.Text())
			os.Exit(2)
		}
		running.Add(1)
		go func(id, plan, key string) {
			defer running.Done()
			v, err := w.take(context.Background(), plan, key)
			if err != nil {
				fmt.Fprintln(os.Stderr, "failoverworker:", err)
				os.Exit(2)
			}
			reply(id, v)
		}(f[0], f[2], f[3])
	}
	running.Wait()
}
