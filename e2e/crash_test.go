package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// Flags of the reliability scenarios: crash recovery, rebalance churn and
// zombie fencing.
var (
	crashSoak = flag.Bool("reliability-soak", false, "run the crash, rebalance and zombie scenarios longer (more events, more kills)")
	crashSeed = flag.Uint64("reliability-seed", 0, "seed of the kill points of the crash and rebalance scenarios (0: fixed default)")
)

// crashSessionTimeout is the group session timeout of the scenarios'
// consumers: the minimum of kfake and of Apache Kafka's default
// group.min.session.timeout.ms, so a killed member's partitions move in
// seconds.
const crashSessionTimeout = "6s"

// crashRNG returns the seeded RNG of a scenario, logging the seed.
func crashRNG(t testing.TB, def uint64) *rand.Rand {
	seed := def
	if *crashSeed != 0 {
		seed = *crashSeed
	}
	t.Logf("kill-point seed %d (-reliability-seed to change)", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// crashLoad is a producer load running in the background.
type crashLoad struct {
	done chan struct{}
	out  bytes.Buffer
	err  error
}

// crashLoadAsync starts `producer load` for cfg at rate events per second;
// the test fails at cleanup if it did not finish cleanly.
func crashLoadAsync(t testing.TB, c *cluster, cfg loadgen.Config, rate float64) *crashLoad {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	args := append([]string{"load", "--brokers", c.Broker.Addr, "--rate", strconv.FormatFloat(rate, 'f', 0, 64)}, loadArgs(cfg)...)
	cmd := exec.CommandContext(ctx, binary(t, "producer"), args...)
	l := &crashLoad{done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &l.out, &l.out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start producer: %v", err)
	}
	go func() {
		defer close(l.done)
		defer cancel()
		l.err = cmd.Wait()
	}()
	t.Cleanup(func() {
		cancel()
		<-l.done
	})
	return l
}

// Wait waits for the load to finish and fails the test if it failed.
func (l *crashLoad) Wait(t testing.TB) {
	t.Helper()
	<-l.done
	if l.err != nil {
		t.Fatalf("producer load: %v\n%s", l.err, l.out.String())
	}
}

// Done reports whether the load has finished.
func (l *crashLoad) Done() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// crashLogLines returns the JSON log lines of p after byte offset from
// whose msg is msg, decoded.
func crashLogLines(p *proc, from int, msg string) []map[string]any {
	log := p.Log()
	if from > len(log) {
		from = len(log)
	}
	var out []map[string]any
	for _, line := range strings.Split(log[from:], "\n") {
		if !strings.HasPrefix(line, "{") || !strings.Contains(line, msg) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// crashWaitAssigned waits until p has logged a partition assignment after
// byte offset from of its log.
func crashWaitAssigned(t testing.TB, p *proc, from int, timeout time.Duration) {
	t.Helper()
	waitForOrStop(t, timeout, func() (bool, string, error) {
		if len(crashLogLines(p, from, "partition assigned")) > 0 {
			return true, "", nil
		}
		if !p.Running() {
			return false, "", fmt.Errorf("%s exited: %v", p.name, p.Wait())
		}
		return false, p.name + " has no partition assigned", nil
	})
}

// TestCrashRecovery checks the commit protocol against crashes: one consumer,
// SIGKILLed at seeded random points (during fetch, temp-file writes, uploads
// and commits: the flush interval is 1s and the size trigger small) at least
// 10 times during a rate-limited load, restarted each time. After the final
// checkpoint the oracle holds: restore equals the expected state, verify is
// clean, nothing is referenced twice.
func TestCrashRecovery(t *testing.T) {
	c := startCluster(t, 4)
	cfg := loadgen.Config{
		Events: 40_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 100, Seed: 5101,
		StartTime: time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC), HeartbeatEvery: 8,
	}
	kills, loadSeconds := 10, 45.0
	if *crashSoak {
		cfg.Events, kills, loadSeconds = 200_000, 40, 150
	}
	rng := crashRNG(t, 1)
	st := expectLoad(cfg)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "crash", "--tables", "1,2")

	args := []string{"--session-timeout", crashSessionTimeout, "--flush-interval", "1s", "--flush-size", "512KiB"}
	cons := c.startConsumer(t, "crash-consumer", args...)
	load := crashLoadAsync(t, c, cfg, float64(st.events)/loadSeconds)
	from := 0
	committedBetween := 0
	for i := range kills {
		crashWaitAssigned(t, cons, from, 30*time.Second)
		// Even kills: a random point in the consumer's working life
		// (0.2-2.2s covers about two flush cycles: interval 1s, freeze at
		// 0.8s). Odd kills: 0.55-0.95s after a cycle with data committed,
		// around the next freeze, upload and commit.
		var delay time.Duration
		if i%2 == 1 && crashWaitDataCycle(cons, from, 5*time.Second) {
			delay = 550*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond)))
		} else {
			delay = 200*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
		}
		time.Sleep(delay)
		committedBetween += len(crashLogLines(cons, from, "flush cycle committed"))
		from = len(cons.Log())
		cons.Kill()
		t.Logf("kill %d, %v after assignment or a data cycle (load done: %v)", i+1, delay.Round(time.Millisecond), load.Done())
		cons.Start()
	}
	load.Wait(t)
	rep := oracleCheck(t, c, "crash", []int64{1, 2}, cfg)
	t.Logf("crash: %d events produced in %d records, %d kills, %d cycles committed between kills; %s",
		st.events, st.records, kills, committedBetween, rep)
	if committedBetween == 0 {
		t.Errorf("no flush cycle committed between kills: the kills never landed in a working consumer")
	}
	crashCheckOffsetsAtEnd(t, c)
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}

// crashCheckOffsetsAtEnd checks that every apply partition's Redis offset
// equals its end offset: everything was consumed and committed.
func crashCheckOffsetsAtEnd(t testing.TB, c *cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Broker.Addr))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	end, err := kadm.NewClient(cl).ListEndOffsets(ctx, testenv.ApplyTopic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	end.Each(func(e kadm.ListedOffset) {
		if e.Offset == 0 {
			return // no region hashed to this partition
		}
		if r, ok, err := store.Offset(ctx, e.Topic, e.Partition); err != nil || !ok || r != e.Offset {
			t.Errorf("partition %d: Redis offset %d (set %v, %v), end offset %d", e.Partition, r, ok, err, e.Offset)
		}
	})
}

// crashWaitDataCycle waits up to timeout for p to log a committed flush
// cycle with data after byte offset from, and reports whether it did.
func crashWaitDataCycle(p *proc, from int, timeout time.Duration) bool {
	from = max(from, len(p.Log()))
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, l := range crashLogLines(p, from, "flush cycle committed") {
			if n, _ := l["flows"].(float64); n > 0 {
				return true
			}
		}
	}
	return false
}
