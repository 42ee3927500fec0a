package e2e

import (
	"context"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// zombieFenced sums flowlog_flush_cycles_total{result="fenced"} on p's
// /metrics.
func zombieFenced(p *proc) (float64, error) {
	m, err := scrapeMetricsWith(&http.Client{Timeout: 2 * time.Second}, "http://"+p.Addr)
	if err != nil {
		return 0, err
	}
	n, _ := m.get("flowlog_flush_cycles_total", `result="fenced"`)
	return n, nil
}

// TestZombieFencing checks fencing (docs/FORMAT.md, "Commit protocol"): of
// two consumers, one (the zombie) is frozen with SIGSTOP while it holds
// uncommitted data, until its partition leases move to the other; more data
// is produced and committed by the other; then the zombie continues
// (SIGCONT). Its commit must fail on the lease check (log "fenced",
// flush_cycles_total{result="fenced"}), what it uploaded stays unreferenced,
// and the oracle holds: nothing is lost or duplicated.
func TestZombieFencing(t *testing.T) {
	const partitions = 4
	c := startCluster(t, partitions)
	start := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	cfg1 := loadgen.Config{Events: 20_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 64, Seed: 5301, StartTime: start, HeartbeatEvery: 4}
	cfg2 := loadgen.Config{Events: 5_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 64, Seed: 5302, StartTime: start.Add(time.Hour)}
	if *crashSoak {
		cfg1.Events, cfg2.Events = 100_000, 50_000
	}
	st1, st2 := expectLoad(cfg1), expectLoad(cfg2)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "zombie", "--tables", "1,2")

	args := []string{"--session-timeout", crashSessionTimeout, "--flush-interval", "1s", "--flush-size", "4MiB"}
	other := c.startConsumer(t, "zombie-other", args...)
	crashWaitAssigned(t, other, 0, 30*time.Second)
	zombie := c.startConsumer(t, "zombie", args...)
	var held rebalanceStatus
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := rebalanceGetStatus(zombie)
		held = st
		return err == nil && len(st.Partitions) > 0, "zombie holds no partition yet"
	})

	load := crashLoadAsync(t, c, cfg1, float64(st1.events)/10)
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	ctx := context.Background()
	// Freeze the zombie while it is consuming: after it committed a cycle
	// with data, mid-way to the next.
	if !crashWaitDataCycle(zombie, 0, 20*time.Second) {
		t.Fatalf("the zombie committed no cycle with data")
	}
	time.Sleep(400 * time.Millisecond)
	held, err := rebalanceGetStatus(zombie)
	if err != nil {
		t.Fatalf("zombie status: %v", err)
	}
	leases := map[int32]meta.Lease{}
	for _, ps := range held.Partitions {
		l, ok, err := store.LeaseHolder(ctx, testenv.ApplyTopic, ps.Partition)
		if err != nil || !ok {
			t.Fatalf("lease of partition %d: %v (held %v)", ps.Partition, err, ok)
		}
		leases[ps.Partition] = l
	}
	zombie.Signal(syscall.SIGSTOP)
	frozenAt := time.Now()
	fromZombie := len(zombie.Log())
	t.Logf("SIGSTOP zombie holding partitions %v", leases)

	waitFor(t, 30*time.Second, func() (bool, string) {
		for p, was := range leases {
			l, _, err := store.LeaseHolder(ctx, testenv.ApplyTopic, p)
			if err != nil {
				return false, err.Error()
			}
			if l.Member == was.Member {
				return false, "partition " + strconv.Itoa(int(p)) + " lease still held by the zombie " + was.Member
			}
		}
		return true, ""
	})
	t.Logf("leases moved %v after SIGSTOP", time.Since(frozenAt).Round(time.Millisecond))
	load.Wait(t)
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg2)...)...)
	// The other member commits everything, the zombie's partitions included.
	waitFlowCheckpoint(context.Background(), t, store, "zombie", max(st1.maxResolved, st2.maxResolved), 60*time.Second)

	zombie.Signal(syscall.SIGCONT)
	// Two outcomes are right, and which one comes depends on who moves
	// first after SIGCONT: the zombie tries to commit and the lease check
	// fences it, or its client learns that the session expired and drops
	// the partitions before any commit.
	fenced := false
	waitFor(t, 30*time.Second, func() (bool, string) {
		n, err := zombieFenced(zombie)
		if err != nil {
			return false, err.Error()
		}
		fenced = n >= 1
		lost := crashLogLines(zombie, fromZombie, "partitions lost (the group session expired): dropping their uncommitted records; the new owner consumes them from the last commit")
		return fenced || len(lost) > 0, "zombie neither fenced (flush_cycles_total{result=\"fenced\"} 0) nor told its partitions were lost"
	})
	if fenced {
		waitFor(t, 10*time.Second, func() (bool, string) {
			lines := crashLogLines(zombie, fromZombie, "fenced: a partition lease moved to another member; dropping uncommitted state and rejoining")
			return len(lines) > 0, "zombie logged no \"fenced\" line after SIGCONT"
		})
	}
	// It rejoins and serves again.
	crashWaitAssigned(t, zombie, fromZombie, 30*time.Second)

	rep := oracleCheck(t, c, "zombie", []int64{1, 2}, cfg1, cfg2)
	t.Logf("zombie: %d+%d events produced in %d+%d records; %s", st1.events, st2.events, st1.records, st2.records, rep)
	if fenced && rep.unreferenced == 0 {
		t.Errorf("no unreferenced object: the zombie's fenced cycle should have left its uploads unreferenced")
	}
	crashCheckOffsetsAtEnd(t, c)
	for _, p := range []*proc{zombie, other} {
		if err := p.Stop(); err != nil {
			t.Errorf("%s exit after SIGTERM: %v", p.name, err)
		}
	}
}
