package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
	"redis-rate-limiter/ratelimit/redigoadapter"
)

// A Sentinel switch followed through redigoadapter.Sentinel: a master and a replica with the
// module, a Sentinel (the server binary run with --sentinel) watching them; after SENTINEL
// FAILOVER the client reaches the promoted replica, which carries on from the replicated count.

const sentinelMaster = "mymaster"

func startSentinel(t *testing.T, masterPort int) string {
	t.Helper()
	dir := t.TempDir()
	port := freePort()
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 400\n"+
		"sentinel failover-timeout %s 4000\n", port, dir, filepath.Join(dir, "sentinel.log"),
		sentinelMaster, masterPort, sentinelMaster, sentinelMaster)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(serverBinary(), conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// Ready once it has read the replica's INFO (a replica it has not read is no candidate).
	waitFor(t, "the Sentinel to see the replica", func() bool {
		c, err := redis.Dial("tcp", addr)
		if err != nil {
			return false
		}
		defer c.Close()
		replicas, err := redis.Values(c.Do("SENTINEL", "REPLICAS", sentinelMaster))
		if err != nil {
			return false
		}
		for _, r := range replicas {
			fields, _ := redis.StringMap(r, nil)
			refresh, err := strconv.Atoi(fields["info-refresh"])
			if fields["flags"] == "slave" && fields["master-link-status"] == "ok" && err == nil && refresh < 5000 {
				return true
			}
		}
		return false
	})
	return addr
}

func role(t *testing.T, s *server) string {
	c, err := redis.Dial("tcp", s.addr())
	if err != nil {
		return ""
	}
	defer c.Close()
	v, err := redis.Values(c.Do("ROLE"))
	if err != nil || len(v) == 0 {
		return ""
	}
	r, _ := redis.String(v[0], nil)
	return r
}

func TestASentinelSwitchIsFollowed(t *testing.T) {
	master := start(t, serverOpts{module: true, extra: []string{"--repl-diskless-sync-delay", "0"}})
	replica := start(t, serverOpts{module: true, extra: []string{"--replicaof", "127.0.0.1",
		strconv.Itoa(master.port)}})
	r := admin(t, replica)
	waitFor(t, "the replica in sync", func() bool {
		info, _ := redis.String(r.Do("INFO", "replication"))
		return strings.Contains(info, "master_link_status:up")
	})
	sentinel := startSentinel(t, master.port)
	follow := redigoadapter.NewSentinel([]string{sentinel}, sentinelMaster)
	c := ratelimit.New(follow, ratelimit.Options{Mode: ratelimit.ChooseModule,
		Timeout: 500 * time.Millisecond, Policy: ratelimit.FailClosed})
	ctx := context.Background()
	bucket := ratelimit.TokenBucket{Capacity: 10, RefillPerSec: 0.0001}
	for _, left := range []int64{9, 8, 7} {
		o, err := c.Check(ctx, "k", bucket, 1)
		if err != nil || !o.Decision.Allowed || o.Degraded != ratelimit.NotDegraded || o.Decision.Remaining != left {
			t.Fatalf("before the switch: %+v, %v", o, err)
		}
	}
	// The replica caught up with the three writes.
	waitFor(t, "the replica's copy", func() bool {
		v, _ := redis.String(r.Do("GET", "k"))
		m, _ := redis.String(admin(t, master).Do("GET", "k"))
		return v != "" && v == m
	})
	s, err := redis.Dial("tcp", sentinel)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Do("SENTINEL", "FAILOVER", sentinelMaster); err != nil {
		t.Fatal(err)
	}
	// The Sentinel promotes the replica, then turns the old master into its replica.
	deadline := time.Now().Add(20 * time.Second)
	for {
		addr, err := follow.MasterAddress(ctx)
		if err == nil && addr == replica.addr() && role(t, master) == "slave" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never a switch: master %q (%v), old master's role %q", addr, err, role(t, master))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Calls until one reaches the new master: those that met the old connection are the
	// policy's (or READONLY's) answers and take nothing; the first answered carries on from 7.
	var answered ratelimit.Outcome
	failed := 0
	for i := 0; i < 5; i++ {
		o, err := c.Check(ctx, "k", bucket, 1)
		if err == nil && o.Degraded == ratelimit.NotDegraded {
			answered = o
			break
		}
		failed++
	}
	if !answered.Decision.Allowed || answered.Decision.Remaining != 6 || failed != 1 {
		t.Fatalf("after the switch: %+v, %d calls failed first", answered, failed)
	}
	direct := client(replica, ratelimit.Options{Mode: ratelimit.ChooseModule})
	if p, err := direct.Peek(ctx, "k", bucket); err != nil || p.Decision.Remaining != 6 {
		t.Fatalf("the new master's own count: %+v, %v", p, err)
	}
	t.Logf("%d call(s) answered by the policy or READONLY after the switch, then remaining 6 on the new master", failed)
}
