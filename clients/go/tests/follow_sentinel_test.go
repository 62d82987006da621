package tests

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// The other Sentinel cases of following a failover (the switch is in sentinel_test.go): a
// master killed with SIGKILL, the calls answered by the policy until the Sentinel promoted the
// replica; and a master turned replica by hand, whose READONLY is a rejection and after which the
// next call asks the Sentinels. Each time the new master carries on from the replicated count.

// sentinelSpentThree is a master and a replica with the module, a Sentinel watching them, a
// client through redigoadapter.NewSentinel, and three tokens of ten taken from "k", the replica
// caught up.
func sentinelSpentThree(t *testing.T) (master, replica *server, sentinel string, follow *redigoadapter.Sentinel,
	c *ratelimit.Client) {
	master = start(t, serverOpts{module: true, extra: []string{"--repl-diskless-sync-delay", "0"}})
	replica = start(t, serverOpts{module: true, extra: []string{"--replicaof", "127.0.0.1",
		strconv.Itoa(master.port)}})
	waitLong(t, "the replica in sync", func() bool {
		return replicationField(replica, "master_link_status") == "up"
	})
	sentinel = startSentinel(t, master.port)
	follow = redigoadapter.NewSentinel([]string{sentinel}, sentinelMaster)
	c = ratelimit.New(follow, followOptions())
	for _, left := range []int64{9, 8, 7} {
		o, err := c.Check(context.Background(), "k", followBucket, 1)
		if err != nil || !o.Decision.Allowed || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != left {
			t.Fatalf("before the failover: %+v, %v", o, err)
		}
	}
	caughtUp(t, master, replica)
	return master, replica, sentinel, follow, c
}

func TestAKilledMasterIsFollowedThroughTheSentinels(t *testing.T) {
	master, replica, _, follow, c := sentinelSpentThree(t)
	ctx := context.Background()
	master.kill()
	// The connection is gone: the policy answers until the Sentinel has promoted the replica
	// (400 ms to see the master down, then the election and the promotion).
	o, err := c.Check(ctx, "k", followBucket, 1)
	if err != nil || o.Degraded != ratelimit.DegradedFailClosed || o.Decision.Allowed {
		t.Fatalf("the call that met the dead master: %+v, %v", o, err)
	}
	byPolicy := 1
	deadline := time.Now().Add(30 * time.Second)
	for {
		o, err = c.Check(ctx, "k", followBucket, 1)
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
		time.Sleep(100 * time.Millisecond)
	}
	if !o.Decision.Allowed || o.Decision.Remaining != 6 {
		t.Fatalf("on the new master: %+v", o)
	}
	if addr, err := follow.MasterAddress(ctx); err != nil || addr != replica.addr() || role(t, replica) != "master" {
		t.Fatalf("the Sentinels name %q (%v); the replica is a %s", addr, err, role(t, replica))
	}
	t.Logf("answered by the failure policy: %d calls, 100 ms apart, then remaining 6 on the new master", byPolicy)
}

func TestAMasterTurnedReplicaAnswersReadonlyAndTheNextCallAsksTheSentinels(t *testing.T) {
	// An operator's switch by hand: the replica promoted, the master made its replica (its
	// client connections stay open), the Sentinel told the new address.
	master, replica, sentinel, follow, c := sentinelSpentThree(t)
	ctx := context.Background()
	must(t, admin(t, replica), "REPLICAOF", "NO", "ONE")
	must(t, admin(t, master), "REPLICAOF", "127.0.0.1", replica.port)
	s := dialSentinel(t, sentinel)
	must(t, s, "SENTINEL", "REMOVE", sentinelMaster)
	must(t, s, "SENTINEL", "MONITOR", sentinelMaster, "127.0.0.1", replica.port, 1)
	if addr, err := follow.MasterAddress(ctx); err != nil || addr != replica.addr() {
		t.Fatalf("the Sentinels name %q (%v)", addr, err)
	}
	// The pool still reaches the old master: READONLY, a rejection and never the policy.
	_, err := c.Check(ctx, "k", followBucket, 1)
	var rejected *ratelimit.RejectedError
	if !errors.As(err, &rejected) || rejected.Code() != "READONLY" {
		t.Fatalf("expected READONLY: %v", err)
	}
	o, err := c.Check(ctx, "k", followBucket, 1)
	if err != nil || !o.Decision.Allowed || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != 6 {
		t.Fatalf("on the new master: %+v, %v", o, err)
	}
	if c.BreakerOpen() {
		t.Fatal("the breaker opened")
	}
}

// dialSentinel is a plain connection to the Sentinel at addr, closed when the test ends.
func dialSentinel(t *testing.T, addr string) redis.Conn {
	t.Helper()
	c, err := redis.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
