package tests

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"
	"github.com/mna/redisc"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// Cluster failovers followed through redigoadapter.Cluster: a cluster of three masters, the
// first (slots 0 to 16381) with a replica. A manual CLUSTER FAILOVER turns the master into a
// replica that answers MOVED, which the next call follows; a master frozen with SIGSTOP answers
// nothing, the calls meanwhile are the policy's within their deadline, and once its replica took
// over (CLUSTER FAILOVER FORCE) the slots are read again and the calls reach it. Either way the
// new master carries on from the replicated count, to the token.

// withReplica is a cluster whose first master has a replica.
type withReplica struct {
	master, replica *server
	voters          []*server
}

// firstMasterSlots are the slots of the first master: 0 to 16381; the voters have 16382 and
// 16383.
const firstMasterSlots = 16382

func (w *withReplica) addrs() []string {
	return []string{w.master.addr(), w.replica.addr(), w.voters[0].addr(), w.voters[1].addr()}
}

func clusterInfo(s *server, what string) string {
	c, err := redis.DialTimeout("tcp", s.addr(), time.Second, time.Second, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	text, _ := redis.String(c.Do("CLUSTER", what))
	return text
}

func startClusterWithReplica(t *testing.T) *withReplica {
	t.Helper()
	quick := []string{"--repl-diskless-sync-delay", "0"}
	w := &withReplica{master: start(t, serverOpts{module: true, cluster: true, extra: quick})}
	for i := 0; i < 2; i++ {
		w.voters = append(w.voters, start(t, serverOpts{module: true, cluster: true}))
	}
	w.replica = start(t, serverOpts{module: true, cluster: true, extra: quick})
	m := admin(t, w.master)
	must(t, m, "CLUSTER", "ADDSLOTSRANGE", 0, firstMasterSlots-1)
	for i, v := range w.voters {
		must(t, admin(t, v), "CLUSTER", "ADDSLOTS", firstMasterSlots+i)
	}
	for _, other := range []*server{w.voters[0], w.voters[1], w.replica} {
		must(t, m, "CLUSTER", "MEET", "127.0.0.1", other.port)
	}
	all := []*server{w.master, w.replica, w.voters[0], w.voters[1]}
	waitLong(t, "the cluster to form", func() bool {
		for _, s := range all {
			info := clusterInfo(s, "INFO")
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:4") {
				return false
			}
		}
		return true
	})
	masterID, err := redis.String(m.Do("CLUSTER", "MYID"))
	if err != nil {
		t.Fatal(err)
	}
	must(t, admin(t, w.replica), "CLUSTER", "REPLICATE", masterID)
	replicaID, err := redis.String(admin(t, w.replica).Do("CLUSTER", "MYID"))
	if err != nil {
		t.Fatal(err)
	}
	waitLong(t, "every node to know the replica", func() bool {
		for _, s := range all {
			known := false
			for _, l := range strings.Split(clusterInfo(s, "NODES"), "\n") {
				if strings.HasPrefix(l, replicaID) && strings.Contains(l, "slave") && strings.Contains(l, masterID) {
					known = true
				}
			}
			if !known {
				return false
			}
		}
		return true
	})
	// In sync on both sides: the replica's link up, and the master counting it online (a WAIT
	// counts only the replicas the master has online).
	waitLong(t, "the replica in sync", func() bool {
		return replicationField(w.replica, "master_link_status") == "up" &&
			strings.Contains(replicationField(w.master, "slave0"), "state=online")
	})
	return w
}

// waitLong polls cond every 20 ms for at most 30 s.
func waitLong(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func replicationField(s *server, field string) string {
	c, err := redis.DialTimeout("tcp", s.addr(), time.Second, time.Second, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	info, _ := redis.String(c.Do("INFO", "replication"))
	for _, l := range strings.Split(info, "\r\n") {
		if v := strings.TrimPrefix(l, field+":"); v != l {
			return v
		}
	}
	return ""
}

// caughtUp waits until the replica has read every write of the master.
func caughtUp(t *testing.T, master, replica *server) {
	t.Helper()
	written, err := strconv.ParseInt(replicationField(master, "master_repl_offset"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	waitLong(t, "the replica to catch up", func() bool {
		read, err := strconv.ParseInt(replicationField(replica, "slave_repl_offset"), 10, 64)
		return err == nil && read >= written
	})
}

var followBucket = ratelimit.TokenBucket{Capacity: 10, RefillPerSec: 0.0001}

func followOptions() ratelimit.Options {
	return ratelimit.Options{Timeout: 500 * time.Millisecond, Policy: ratelimit.FailClosed,
		Mode: ratelimit.ChooseModule}
}

// clusterSpentThree is a cluster with a replica, a client of it through redigoadapter.Cluster,
// and three tokens of ten taken from "k" (a slot of the first master), the replica caught up.
func clusterSpentThree(t *testing.T) (*withReplica, *redigoadapter.Cluster, *ratelimit.Client) {
	w := startClusterWithReplica(t)
	if slot := redisc.Slot("k"); slot >= firstMasterSlots {
		t.Fatalf("k is in slot %d", slot)
	}
	conn := redigoadapter.NewCluster(w.addrs())
	t.Cleanup(func() { conn.Close() })
	c := ratelimit.New(conn, followOptions())
	for _, left := range []int64{9, 8, 7} {
		o, err := c.Check(context.Background(), "k", followBucket, 1)
		if err != nil || !o.Decision.Allowed || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != left {
			t.Fatalf("before the failover: %+v, %v", o, err)
		}
	}
	caughtUp(t, w.master, w.replica)
	return w, conn, c
}

// remainingOn is what the node itself says is left of key (a peek of a client of its own).
func remainingOn(t *testing.T, s *server, key string) int64 {
	t.Helper()
	p, err := client(s, ratelimit.Options{Mode: ratelimit.ChooseModule}).Peek(context.Background(), key, followBucket)
	if err != nil || p.Degraded != ratelimit.NotDegraded {
		t.Fatalf("peek on %s: %+v, %v", s.addr(), p, err)
	}
	return p.Decision.Remaining
}

func TestAClusterFailoverIsFollowedThroughMoved(t *testing.T) {
	w, conn, c := clusterSpentThree(t)
	must(t, admin(t, w.replica), "CLUSTER", "FAILOVER")
	waitLong(t, "the replica to take over", func() bool {
		return role(t, w.replica) == "master" && role(t, w.master) == "slave"
	})
	// The old master, a replica now, answers MOVED: the first call follows it.
	o, err := c.Check(context.Background(), "k", followBucket, 1)
	if err != nil || o.Degraded != ratelimit.NotDegraded || !o.Decision.Allowed || o.Decision.Remaining != 6 {
		t.Fatalf("after the failover: %+v, %v", o, err)
	}
	// Followed by the redirection: the slots were read once, at the first call.
	if n := conn.Readings(); n != 1 {
		t.Fatalf("the slots read %d times", n)
	}
	if left := remainingOn(t, w.replica, "k"); left != 6 {
		t.Fatalf("the new master's own count: %d", left)
	}
}

func TestAFrozenClusterMasterIsFollowedOnceItsReplicaTookOver(t *testing.T) {
	w, conn, c := clusterSpentThree(t)
	ctx := context.Background()
	if err := w.master.signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer w.master.signal(syscall.SIGCONT)

	// Frozen and not replaced yet: 20 callers at once, each answered by the policy within its
	// deadline (the first ones wait for the frozen node up to the timeout, the others fail at
	// once while the slots are read again).
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			began := time.Now()
			o, err := c.Check(ctx, "k", followBucket, 1)
			took := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			if took > slowest {
				slowest = took
			}
			if err != nil || o.Degraded != ratelimit.DegradedFailClosed || o.Decision.Allowed {
				t.Errorf("a call to the frozen master: %+v, %v", o, err)
			}
		}()
	}
	wg.Wait()
	if slowest > 500*time.Millisecond+250*time.Millisecond {
		t.Fatalf("a call to the frozen master took %v (timeout 500 ms)", slowest)
	}

	must(t, admin(t, w.replica), "CLUSTER", "FAILOVER", "FORCE")
	waitLong(t, "the replica to take over", func() bool { return role(t, w.replica) == "master" })
	promoted := time.Now()
	deadline := promoted.Add(20 * time.Second)
	byPolicy := 0
	var o ratelimit.Outcome
	for {
		began := time.Now()
		var err error
		o, err = c.Check(ctx, "k", followBucket, 1)
		if took := time.Since(began); took > 750*time.Millisecond {
			t.Fatalf("a call took %v (timeout 500 ms)", took)
		}
		if err != nil {
			t.Fatal(err)
		}
		if o.Degraded == ratelimit.NotDegraded {
			break
		}
		if o.Degraded != ratelimit.DegradedFailClosed {
			t.Fatalf("%+v", o)
		}
		byPolicy++
		if time.Now().After(deadline) {
			t.Fatal("the client never reached the new master")
		}
		time.Sleep(50 * time.Millisecond)
	}
	reached := time.Since(promoted)
	if !o.Decision.Allowed || o.Decision.Remaining != 6 {
		t.Fatalf("on the new master: %+v", o)
	}
	if left := remainingOn(t, w.replica, "k"); left != 6 {
		t.Fatalf("the new master's own count: %d", left)
	}
	if conn.Readings() < 2 {
		t.Fatalf("the slots read %d times", conn.Readings())
	}
	// (The breaker, opened by the calls that timed out, answers for its cooldown of 1 s too.)
	t.Logf("after the promotion: %d call(s) answered by the policy, 50 ms apart, the new master reached %v after it with remaining 6; the slots read %d times; the slowest call to the frozen master %v",
		byPolicy, reached.Round(time.Millisecond), conn.Readings(), slowest.Round(time.Millisecond))
}

// A slot being migrated: its key is not on the node that owns the slot, which answers ASK; the
// call goes to the importing node (ASKING, then the command) without changing the slot map.
func TestAnAskIsFollowedDuringASlotMigration(t *testing.T) {
	nodes := startCluster(t, true)
	const key = "moving"
	slot := redisc.Slot(key)
	var from, to *server
	for _, n := range nodes {
		if _, err := admin(t, n).Do("GET", key); err == nil {
			from = n
		}
	}
	for _, n := range nodes {
		if n != from {
			to = n
			break
		}
	}
	if from == nil {
		t.Fatal("no node owns the key's slot")
	}
	id := func(s *server) string {
		v, err := redis.String(admin(t, s).Do("CLUSTER", "MYID"))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	must(t, admin(t, to), "CLUSTER", "SETSLOT", slot, "IMPORTING", id(from))
	must(t, admin(t, from), "CLUSTER", "SETSLOT", slot, "MIGRATING", id(to))
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr())
	}
	conn := redigoadapter.NewCluster(addrs)
	defer conn.Close()
	c := ratelimit.New(conn, followOptions())
	for _, left := range []int64{9, 8, 7} {
		o, err := c.Check(context.Background(), key, followBucket, 1)
		if err != nil || !o.Decision.Allowed || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != left {
			t.Fatalf("during the migration: %+v, %v", o, err)
		}
	}
	// The key is on the importing node (asked with ASKING), not on the owner.
	on := admin(t, to)
	must(t, on, "ASKING")
	if n, err := redis.Int(on.Do("EXISTS", key)); err != nil || n != 1 {
		t.Fatalf("on the importing node: %d, %v", n, err)
	}
	// (The owner answers ASK for a key of a migrating slot that it does not have.)
	if _, err := admin(t, from).Do("EXISTS", key); err == nil || !strings.HasPrefix(err.Error(), "ASK ") {
		t.Fatalf("on the owner: %v", err)
	}
	if asked := calls(t, on, "asking"); asked != 3+1 {
		t.Fatalf("%d ASKING on the importing node", asked)
	}
	if n := conn.Readings(); n != 1 {
		t.Fatalf("the slots read %d times", n)
	}
}
