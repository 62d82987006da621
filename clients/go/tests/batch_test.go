package tests

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gomodule/redigo/redis"

	"redis-rate-limiter/ratelimit"
)

// Leased batches across processes: workers (this test binary run again, one process each) check
// one hot key of a fixed window of 1,000 under the stopped test clock, many goroutines each; one
// of them is killed with SIGKILL while its batch holds units. Redis's count must be exactly what
// the processes admitted plus what the killed one held (no more than one batch lost, nothing
// admitted twice), and no process admits a unit Redis did not grant it.

const batchLimit = 1000

var batchWindow = ratelimit.FixedWindow{Limit: batchLimit, WindowSec: 3600}

func batchWorkerClient(addr, key string) *ratelimit.Client {
	return ratelimit.New(Redigo{pool(addr)}, ratelimit.Options{Mode: ratelimit.ChooseModule,
		Policy: ratelimit.FailClosed, Timeout: 2 * time.Second}).
		WithBatching(ratelimit.NewBatching().HotKey(key).Lease(time.Minute))
}

// TestBatchWorkerProcess is a worker when RL_BATCH_WORKER says which (else it does nothing):
// "survivor" checks the key from 8 goroutines 400 times each, closes the client and prints what
// it admitted; "victim" checks once per line of its standard input and prints, after each
// check, whether it was admitted and the units its batch holds (once its returns have landed).
func TestBatchWorkerProcess(t *testing.T) {
	role, addr, key := os.Getenv("RL_BATCH_WORKER"), os.Getenv("RL_BATCH_ADDR"), os.Getenv("RL_BATCH_KEY")
	if role == "" {
		t.Skip("a worker of TestLeasedBatchesAcrossProcessesAdmitExactlyWhatRedisCounted")
	}
	c := batchWorkerClient(addr, key)
	ctx := context.Background()
	switch role {
	case "survivor":
		var admitted, degraded, local atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 400; i++ {
					o, err := c.Check(ctx, key, batchWindow, 1)
					if err != nil {
						panic(err)
					}
					if o.Degraded != ratelimit.NotDegraded {
						degraded.Add(1)
					} else if o.Decision.Allowed {
						admitted.Add(1)
						if o.AnsweredLocally == ratelimit.LocalBatch {
							local.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		returned := c.Close(ctx)
		s := c.BatchStats()
		fmt.Printf("admitted %d degraded %d local %d returned %d refills %d granted %d\n",
			admitted.Load(), degraded.Load(), local.Load(), returned, s.Refills, s.Granted)
	case "victim":
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			o, err := c.Check(ctx, key, batchWindow, 1)
			if err != nil || o.Degraded != ratelimit.NotDegraded {
				fmt.Printf("error %v %v\n", err, o.Degraded)
				continue
			}
			// Returns go in the background: wait until none is on its way.
			var s ratelimit.BatchStats
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
				s = c.BatchStats()
				if s.Granted == s.Used+s.Returned+s.Lapsed+s.Held {
					break
				}
				time.Sleep(time.Millisecond)
			}
			fmt.Printf("%v %d\n", o.Decision.Allowed, s.Held)
		}
	}
}

func TestLeasedBatchesAcrossProcessesAdmitExactlyWhatRedisCounted(t *testing.T) {
	s := start(t, serverOpts{module: true, testClock: true})
	a := admin(t, s)
	setClock(t, a, t0)
	key := "batch:hot"
	worker := func(role string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestBatchWorkerProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RL_BATCH_WORKER="+role, "RL_BATCH_ADDR="+s.addr(),
			"RL_BATCH_KEY="+key)
		cmd.Stderr = os.Stderr
		return cmd
	}
	// The victim takes batches and admits 20 to 40 requests, the last 20 while the survivors
	// run, then dies holding what its batch holds.
	victim := worker("victim")
	stdin, err := victim.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := victim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	replies := bufio.NewScanner(stdout)
	victimAdmitted, held := 0, int64(0)
	// One check of the victim: whether it was admitted (its batch's units kept in held).
	check := func() bool {
		if _, err := io.WriteString(stdin, "check\n"); err != nil {
			t.Fatal(err)
		}
		if !replies.Scan() {
			t.Fatalf("the victim stopped: %v", replies.Err())
		}
		f := strings.Fields(replies.Text())
		if len(f) != 2 || f[0] == "error" {
			t.Fatalf("victim: %q", replies.Text())
		}
		held, _ = strconv.ParseInt(f[1], 10, 64)
		if f[0] == "true" {
			victimAdmitted++
			return true
		}
		return false
	}
	// 20 admissions on the fresh limit first.
	for i := 0; i < 20; i++ {
		if !check() {
			t.Fatalf("the victim's check %d was denied", i)
		}
	}
	// The survivors run meanwhile.
	type result struct {
		out string
		err error
	}
	results := make(chan result, 2)
	for i := 0; i < 2; i++ {
		cmd := worker("survivor")
		go func() {
			out, err := cmd.Output()
			results <- result{string(out), err}
		}()
	}
	// Up to 20 more, while the survivors take the rest (they may use the limit up first).
	for i := 0; i < 20 && check(); i++ {
	}
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = victim.Wait()
	survivors, fromBatches := int64(0), int64(0)
	for i := 0; i < 2; i++ {
		r := <-results
		if r.err != nil {
			t.Fatalf("survivor: %v\n%s", r.err, r.out)
		}
		var admitted, degraded, local, returned, refills, granted int64
		line := ""
		for _, l := range strings.Split(r.out, "\n") {
			if strings.HasPrefix(l, "admitted ") {
				line = l
			}
		}
		if _, err := fmt.Sscanf(line, "admitted %d degraded %d local %d returned %d refills %d granted %d",
			&admitted, &degraded, &local, &returned, &refills, &granted); err != nil {
			t.Fatalf("survivor's output %q: %v", r.out, err)
		}
		t.Logf("survivor: admitted %d (%d from a batch), %d refills granting %d, %d returned on close",
			admitted, local, refills, granted, returned)
		if degraded != 0 {
			t.Fatalf("survivor: %d degraded", degraded)
		}
		survivors += admitted
		fromBatches += local
	}
	if fromBatches == 0 {
		t.Fatal("no survivor admitted from a batch")
	}
	count := int64(0)
	stored, err := redis.String(a.Do("GET", key))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(stored, "fw %d", &count); err != nil {
		t.Fatalf("stored %q: %v", stored, err)
	}
	t.Logf("Redis counted %d: survivors admitted %d, the victim %d and held %d when killed",
		count, survivors, victimAdmitted, held)
	// 6,400 checks on a limit of 1,000: it is used up, exactly what was admitted plus the
	// victim's batch (lost: at most one batch), never more.
	if count != batchLimit || count != survivors+int64(victimAdmitted)+held || held > 1024 {
		t.Fatalf("Redis counted %d; admitted %d + %d, the victim held %d", count, survivors,
			victimAdmitted, held)
	}
}
