package tests

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// Durable admissions against a master and a real replica (--replicaof): WAIT after every
// admitting write, on the connection the write went on; what a short acknowledgement becomes;
// WAITAOF where the server has it, WAIT on Redis 7.0.

func TestDurableAdmissionsWaitForTheReplica(t *testing.T) {
	master := start(t, serverOpts{module: true, extra: []string{"--repl-diskless-sync-delay", "0"}})
	replica := start(t, serverOpts{module: true, extra: []string{"--replicaof", "127.0.0.1",
		strconv.Itoa(master.port)}})
	a, r := admin(t, master), admin(t, replica)
	waitFor(t, "the replica in sync", func() bool {
		info, _ := redis.String(r.Do("INFO", "replication"))
		return strings.Contains(info, "master_link_status:up")
	})
	ctx := context.Background()
	bucket := ratelimit.TokenBucket{Capacity: 5, RefillPerSec: 0.0001}
	base := client(master, ratelimit.Options{Mode: ratelimit.ChooseModule, Timeout: 2 * time.Second,
		Policy: ratelimit.FailClosed, FailClosedRetryMs: 700})

	// Refused: no replica asked, or a WAIT as long as the client's timeout.
	var u *ratelimit.UnsupportedError
	if _, err := base.WithDurability(ratelimit.Durability{Replicas: 0, Timeout: time.Second}); !errors.As(err, &u) {
		t.Fatalf("0 replicas: %v", err)
	}
	if _, err := base.WithDurability(ratelimit.Durability{Replicas: 1, Timeout: 2 * time.Second}); !errors.As(err, &u) {
		t.Fatalf("a WAIT of the client's timeout: %v", err)
	}

	// One replica acknowledges every admission: the replica holds the write when it is answered.
	c, err := base.WithDurability(ratelimit.Durability{Replicas: 1, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < 6; i++ {
		o, err := c.Check(ctx, "durable", bucket, 1)
		if err != nil || o.Decision.Allowed != (i < 5) || o.Degraded != ratelimit.NotDegraded {
			t.Fatalf("check %d: %+v, %v", i, o, err)
		}
		if i < 5 {
			onMaster, _ := redis.String(a.Do("GET", "durable"))
			onReplica, _ := redis.String(r.Do("GET", "durable"))
			if onMaster == "" || onMaster != onReplica {
				t.Fatalf("check %d: master %q, replica %q", i, onMaster, onReplica)
			}
		}
	}
	// Five admissions waited for, the denial not; a peek writes nothing and waits for nothing.
	if _, err := c.Peek(ctx, "durable", bucket); err != nil {
		t.Fatal(err)
	}
	if s := c.DurabilityStats(); s != (ratelimit.DurabilityStats{Acknowledged: 5}) || calls(t, a, "wait") != 5 {
		t.Fatalf("%+v, %d WAITs", s, calls(t, a, "wait"))
	}
	// RL.ALL and a partial grant go the same way.
	limits := []ratelimit.Limit{{Key: "{d}:a", Algorithm: bucket}, {Key: "{d}:b", Algorithm: bucket}}
	if o, err := c.CheckAll(ctx, limits, 2); err != nil || !o.Allowed {
		t.Fatalf("check all: %+v, %v", o, err)
	}
	if o, err := c.CheckUpto(ctx, "{d}:a", bucket, 10); err != nil || o.Granted != 3 {
		t.Fatalf("check upto: %+v, %v", o, err)
	}
	if s := c.DurabilityStats(); s.Acknowledged != 7 || calls(t, a, "wait") != 7 {
		t.Fatalf("%+v, %d WAITs", s, calls(t, a, "wait"))
	}

	// Two replicas asked, one there: each short acknowledgement as Short says.
	short := func(s ratelimit.ShortAck) *ratelimit.Client {
		c, err := base.WithDurability(ratelimit.Durability{Replicas: 2, Timeout: 50 * time.Millisecond, Short: s})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	deny := short(ratelimit.ShortAckDeny)
	o, err := deny.Check(ctx, "short:deny", bucket, 1)
	if err != nil || o.Decision != (ratelimit.Decision{RetryAfterMs: 700, Remaining: 4, ResetAfterMs: 10_000_000, Limit: 5}) ||
		o.Granted != 0 || o.Degraded != ratelimit.NotDegraded {
		t.Fatalf("deny: %+v, %v", o, err)
	}
	// The unit stays spent on the master: under-admission, never over.
	if stored, _ := redis.String(a.Do("GET", "short:deny")); !strings.HasPrefix(stored, "tb 4") {
		t.Fatalf("short:deny holds %q", stored)
	}
	admit := short(ratelimit.ShortAckAdmit)
	if o, err := admit.Check(ctx, "short:admit", bucket, 1); err != nil || !o.Decision.Allowed || o.Granted != 1 {
		t.Fatalf("admit: %+v, %v", o, err)
	}
	policy := short(ratelimit.ShortAckFailurePolicy)
	if o, err := policy.Check(ctx, "short:policy", bucket, 1); err != nil || o.Decision.Allowed ||
		o.Degraded != ratelimit.DegradedFailClosed || o.Decision.RetryAfterMs != 700 {
		t.Fatalf("failure policy: %+v, %v", o, err)
	}
	for name, cl := range map[string]*ratelimit.Client{"deny": deny, "admit": admit, "policy": policy} {
		if s := cl.DurabilityStats(); s != (ratelimit.DurabilityStats{Short: 1}) {
			t.Fatalf("%s: %+v", name, s)
		}
	}

	// WAITAOF: a replica without appendonly never acknowledges it; a server without it (Redis
	// 7.0) is sent WAIT instead, which the replica acknowledges.
	info, err := redis.Values(a.Do("COMMAND", "INFO", "waitaof"))
	if err != nil {
		t.Fatal(err)
	}
	hasWaitaof := len(info) > 0 && info[0] != nil
	aof, err := base.WithDurability(ratelimit.Durability{Replicas: 1, Timeout: 100 * time.Millisecond, AOF: true})
	if err != nil {
		t.Fatal(err)
	}
	waits := calls(t, a, "wait")
	for i := 0; i < 2; i++ {
		o, err := aof.Check(ctx, "aof", bucket, 1)
		if err != nil || o.Decision.Allowed == hasWaitaof {
			t.Fatalf("aof check %d (WAITAOF %v): %+v, %v", i, hasWaitaof, o, err)
		}
	}
	s := aof.DurabilityStats()
	if hasWaitaof {
		if s != (ratelimit.DurabilityStats{Short: 2}) || calls(t, a, "waitaof") != 2 || calls(t, a, "wait") != waits {
			t.Fatalf("WAITAOF: %+v, %d WAITAOF, %d WAIT", s, calls(t, a, "waitaof"), calls(t, a, "wait")-waits)
		}
	} else if s != (ratelimit.DurabilityStats{Acknowledged: 2}) || calls(t, a, "wait") != waits+2 {
		t.Fatalf("without WAITAOF: %+v, %d WAIT", s, calls(t, a, "wait")-waits)
	}
	t.Logf("WAITAOF on this server: %v; %+v", hasWaitaof, s)
}
