package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/mna/redisc"

	"redis-rate-limiter/ratelimit"
)

// Cluster is a Redis Cluster (redisc) as a ratelimit.Conn, as docs/go.md shows it: a command
// goes to the node of its first argument's slot, and redirections (MOVED, ASK) are followed.
type Cluster struct{ *redisc.Cluster }

func (c Cluster) Do(ctx context.Context, args ...interface{}) (interface{}, error) {
	conn := c.Get()
	defer conn.Close()
	rc, err := redisc.RetryConn(conn, 4, 50*time.Millisecond)
	if err != nil {
		return nil, err
	}
	return rc.Do(args[0].(string), args[1:]...)
}

// clusterPort is a free port whose cluster bus port (+10000) is free too.
func clusterPort() int {
	for {
		p := freePort()
		if p >= 55000 {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000)); err == nil {
			l.Close()
			return p
		}
	}
}

// startCluster starts 3 masters (with the module or without) and waits until the cluster is ok.
func startCluster(t *testing.T, module bool) []*server {
	t.Helper()
	var nodes []*server
	var addrs []string
	for i := 0; i < 3; i++ {
		n := start(t, serverOpts{module: module, cluster: true})
		nodes = append(nodes, n)
		addrs = append(addrs, n.addr())
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		c := admin(t, n)
		for {
			info, _ := redis.String(c.Do("CLUSTER", "INFO"))
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster never became ok:\n%s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}

func clusterClient(t *testing.T, nodes []*server) *ratelimit.Client {
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr())
	}
	c := &redisc.Cluster{
		StartupNodes: addrs,
		DialOptions:  []redis.DialOption{redis.DialConnectTimeout(time.Second)},
		CreatePool: func(addr string, opts ...redis.DialOption) (*redis.Pool, error) {
			return &redis.Pool{MaxIdle: 16, IdleTimeout: time.Minute,
				Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr, opts...) }}, nil
		},
	}
	if err := c.Refresh(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return ratelimit.New(Cluster{c}, ratelimit.Options{Timeout: 2 * time.Second})
}

func TestAThreeMasterCluster(t *testing.T) {
	for _, module := range []bool{true, false} {
		expect := ratelimit.ModeScript
		if module {
			expect = ratelimit.ModeModule
		}
		t.Run(expect.String(), func(t *testing.T) {
			nodes := startCluster(t, module)
			cl := clusterClient(t, nodes)
			clusterDecides(t, nodes, cl, expect)
		})
	}
}

func clusterDecides(t *testing.T, nodes []*server, cl *ratelimit.Client, expect ratelimit.Mode) {
	ctx := context.Background()
	bucket := ratelimit.TokenBucket{Capacity: 3, RefillPerSec: 0.0001}
	for k := 0; k < 60; k++ {
		key := "user:" + strconv.Itoa(k)
		allowed := 0
		for i := 0; i < 5; i++ {
			o, err := cl.Check(ctx, key, bucket, 1)
			if err != nil || o.Degraded != ratelimit.NotDegraded || o.Mode != expect {
				t.Fatalf("%s: %+v %v", key, o, err)
			}
			if o.Decision.Allowed {
				allowed++
			}
		}
		if allowed != 3 {
			t.Fatalf("%s: %d admitted", key, allowed)
		}
	}
	var sizes []int64
	var total int64
	for _, n := range nodes {
		size, err := redis.Int64(admin(t, n).Do("DBSIZE"))
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, size)
		total += size
	}
	if total != 60 || sizes[0] == 0 || sizes[1] == 0 || sizes[2] == 0 {
		t.Fatalf("keys per shard: %v", sizes)
	}

	// Several limits in one call: one hash tag puts them in one slot, on every shard.
	window := ratelimit.FixedWindow{Limit: 2, WindowSec: 3600}
	for _, who := range []string{"a", "b", "c", "d", "e", "f"} {
		limits := []ratelimit.Limit{{Key: "{" + who + "}:route", Algorithm: bucket},
			{Key: "{" + who + "}:client", Algorithm: window}}
		var got []string
		for i := 0; i < 3; i++ {
			o, err := cl.CheckAll(ctx, limits, 1)
			if err != nil || o.Mode != expect {
				t.Fatalf("%s: %+v %v", who, o, err)
			}
			got = append(got, fmt.Sprint(o.Allowed, o.DeniedBy, o.Decisions[0].Remaining, o.Decisions[1].Remaining))
		}
		if want := "[true 0 2 1 true 0 1 0 false 2 1 0]"; fmt.Sprint(got) != want {
			t.Fatalf("%s: %v, want %v", who, got, want)
		}
	}
	// Without a common hash tag Redis refuses the call (CROSSSLOT): an error, not a degraded
	// answer.
	_, err := cl.CheckAll(ctx, []ratelimit.Limit{{Key: "user:1", Algorithm: bucket},
		{Key: "user:2", Algorithm: window}}, 1)
	var rejected *ratelimit.RejectedError
	if !errors.As(err, &rejected) || rejected.Code() != "CROSSSLOT" {
		t.Fatalf("across slots: %v", err)
	}

	// Leases on every shard, given back.
	two := ratelimit.Concurrency{Limit: 2, LeaseSec: 60}
	for _, key := range []string{"jobs:a", "jobs:b", "jobs:c", "jobs:d"} {
		var held []*ratelimit.Lease
		for i := 0; i < 3; i++ {
			o, err := cl.Acquire(ctx, key, two)
			if err != nil || o.Outcome.Decision.Allowed != (i < 2) || o.Outcome.Mode != expect {
				t.Fatalf("%s %d: %+v %v", key, i, o, err)
			}
			if o.Lease != nil {
				held = append(held, o.Lease)
			}
		}
		for _, l := range held {
			if freed, err := l.Release(ctx); err != nil || !freed {
				t.Fatalf("%s: %v %v", key, freed, err)
			}
		}
	}

	// Reservations settled on every shard, and two limits under one tag settled in one call.
	budget := ratelimit.TokenBucket{Capacity: 10000, RefillPerSec: 0.001}
	for _, key := range []string{"tokens:a", "tokens:b", "tokens:c", "tokens:d"} {
		r, err := cl.Reserve(ctx, key, budget, 4000)
		if err != nil || r.Reservation == nil || r.Outcome.Decision.Remaining != 6000 {
			t.Fatalf("%s: %+v %v", key, r, err)
		}
		s, err := r.Reservation.Settle(ctx, 1000)
		if err != nil || s.Mode != expect || s.Decisions[0].Remaining != 9000 {
			t.Fatalf("%s: %+v %v", key, s, err)
		}
	}
	both := []ratelimit.Limit{{Key: "{t}:tokens", Algorithm: budget},
		{Key: "{t}:minute", Algorithm: ratelimit.FixedWindow{Limit: 12000, WindowSec: 60}}}
	r, err := cl.ReserveAll(ctx, both, 4000)
	if err != nil || r.Reservation == nil {
		t.Fatalf("%+v %v", r, err)
	}
	s, err := r.Reservation.Settle(ctx, 7000)
	if err != nil || s.Decisions[0].Remaining != 3000 || s.Decisions[1].Remaining != 5000 {
		t.Fatalf("%+v %v", s, err)
	}
}
