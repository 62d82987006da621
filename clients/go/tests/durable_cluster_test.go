package tests

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/mna/redisc"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// Durable admissions on a cluster (redigoadapter.Cluster as the Pinner): the WAIT goes to the
// master of the call's key (of its first key for RL.ALL), on the connection the write went on.
// The first master has a replica, which acknowledges; the voters have none, so a WAIT there is
// short and the admission denied (ShortAckDeny), its unit spent on that master.

// keyInSlot is a key of the given slot.
func keyInSlot(t *testing.T, prefix string, slot int) string {
	for i := 0; i < 1_000_000; i++ {
		k := prefix + strconv.Itoa(i)
		if redisc.Slot(k) == slot {
			return k
		}
	}
	t.Fatalf("no key of slot %d", slot)
	return ""
}

func TestDurableAdmissionsOnAClusterWaitOnTheKeysMaster(t *testing.T) {
	w := startClusterWithReplica(t)
	ctx := context.Background()
	bucket := ratelimit.TokenBucket{Capacity: 10, RefillPerSec: 0.0001}
	waits := func() [3]int {
		return [3]int{calls(t, admin(t, w.master), "wait"), calls(t, admin(t, w.voters[0]), "wait"),
			calls(t, admin(t, w.voters[1]), "wait")}
	}
	names := map[ratelimit.ModeChoice]string{ratelimit.ChooseModule: "module", ratelimit.ChooseScript: "script"}
	for _, mode := range []ratelimit.ModeChoice{ratelimit.ChooseModule, ratelimit.ChooseScript} {
		conn := redigoadapter.NewCluster(w.addrs())
		defer conn.Close()
		base := ratelimit.New(conn, ratelimit.Options{Mode: mode, Timeout: 2 * time.Second})
		c, err := base.WithDurability(ratelimit.Durability{Replicas: 1, Timeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		before := waits()
		p := names[mode] + ":"
		onMaster := p + "k" // (a slot of the first master, checked below)
		onVoter := keyInSlot(t, p+"v:", firstMasterSlots)
		if redisc.Slot(onMaster) >= firstMasterSlots {
			t.Fatalf("%s is in slot %d", onMaster, redisc.Slot(onMaster))
		}
		// Acknowledged by the first master's replica.
		for _, left := range []int64{9, 8, 7} {
			o, err := c.Check(ctx, onMaster, bucket, 1)
			if err != nil || !o.Decision.Allowed || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != left {
				t.Fatalf("%s on the first master: %+v, %v", names[mode], o, err)
			}
		}
		limits := []ratelimit.Limit{{Key: "{" + onMaster + "}:a", Algorithm: bucket},
			{Key: "{" + onMaster + "}:b", Algorithm: bucket}}
		if o, err := c.CheckAll(ctx, limits, 2); err != nil || !o.Allowed || o.Decisions[1].Remaining != 8 {
			t.Fatalf("%s RL.ALL: %+v, %v", names[mode], o, err)
		}
		lease, err := c.Acquire(ctx, p+"jobs", ratelimit.Concurrency{Limit: 2, LeaseSec: 60})
		if err != nil || lease.Lease == nil || redisc.Slot(p+"jobs") >= firstMasterSlots {
			t.Fatalf("%s lease: %+v, %v (slot %d)", names[mode], lease, err, redisc.Slot(p+"jobs"))
		}
		// The voter has no replica: its WAIT answers 0, the admission is denied and its unit
		// stays spent there.
		for i := 0; i < 2; i++ {
			o, err := c.Check(ctx, onVoter, bucket, 1)
			if err != nil || o.Decision.Allowed || o.Degraded != ratelimit.NotDegraded {
				t.Fatalf("%s on a voter: %+v, %v", names[mode], o, err)
			}
		}
		if s := c.DurabilityStats(); s != (ratelimit.DurabilityStats{Acknowledged: 5, Short: 2}) {
			t.Fatalf("%s: %+v", names[mode], s)
		}
		after := waits()
		got := [3]int{after[0] - before[0], after[1] - before[1], after[2] - before[2]}
		if got != [3]int{5, 2, 0} {
			t.Fatalf("%s: WAITs on the first master and the voters: %v", names[mode], got)
		}
		peek, err := base.Peek(ctx, onVoter, bucket)
		if err != nil || peek.Decision.Remaining != 8 {
			t.Fatalf("%s: the voter's own count: %+v, %v", names[mode], peek, err)
		}
		t.Logf("%s: WAITs on the first master, voter 1, voter 2: %v", names[mode], got)
	}
}
