package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
)

// rebalanceStatus is the part of a consumer's /status the scenarios read.
type rebalanceStatus struct {
	Running    bool `json:"running"`
	Partitions []struct {
		Partition int32 `json:"partition"`
		Next      int64 `json:"next_offset"`
	} `json:"partitions"`
}

// rebalanceGetStatus reads p's /status.
func rebalanceGetStatus(p *proc) (rebalanceStatus, error) {
	var st rebalanceStatus
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + p.Addr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// rebalanceAssignedStart returns, from p's log after byte offset from, the
// Redis start offset of each partition p was assigned (only assignments
// that started from a Redis offset).
func rebalanceAssignedStart(p *proc, from int) map[int32]int64 {
	out := map[int32]int64{}
	for _, l := range crashLogLines(p, from, "partition assigned") {
		part, _ := l["partition"].(float64)
		start, _ := l["start"].(string)
		if v, ok := strings.CutPrefix(start, "redis offset "); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				out[int32(part)] = n
			}
		}
	}
	return out
}

// TestRebalanceChurn checks rebalances: three consumers in one group on an
// 8-partition apply topic; during a rate-limited load one of them (seeded
// choice) is SIGKILLed and restarted every few seconds, and once one is
// stopped gracefully with SIGTERM. The oracle holds at the end, and the
// SIGTERMed member flushed and committed its partitions before releasing
// them: it exits 0 after a committed shutdown or revoke cycle, and each next
// owner starts at a Redis offset no lower than what the member had consumed
// just before the signal.
func TestRebalanceChurn(t *testing.T) {
	const partitions = 8
	c := startCluster(t, partitions)
	cfg := loadgen.Config{
		Events: 30_000, Tables: []int64{1, 2, 3}, Regions: 16, ValueSize: 300, Seed: 5201,
		StartTime: time.Date(2026, 3, 3, 23, 59, 50, 0, time.UTC), HeartbeatEvery: 8,
	}
	steps, loadSeconds := 8, 35.0
	if *crashSoak {
		cfg.Events, steps, loadSeconds = 150_000, 30, 150
	}
	rng := crashRNG(t, 2)
	st := expectLoad(cfg)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "rebal", "--tables", "1,2")

	args := []string{"--session-timeout", crashSessionTimeout, "--flush-interval", "1s", "--flush-size", "1MiB"}
	var cons []*proc
	for i := range 3 {
		cons = append(cons, c.startConsumer(t, fmt.Sprintf("rebal-%d", i+1), args...))
	}
	for _, p := range cons {
		crashWaitAssigned(t, p, 0, 30*time.Second)
	}
	load := crashLoadAsync(t, c, cfg, float64(st.events)/loadSeconds)

	kills, graceful := 0, 0
	for step := range steps {
		time.Sleep(2*time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		victim := cons[rng.IntN(len(cons))]
		if step != 2 {
			victim.Kill()
			kills++
			t.Logf("step %d: SIGKILL %s (load done: %v)", step, victim.name, load.Done())
			victim.Start()
			continue
		}
		graceful++
		rebalanceGraceful(t, victim, cons)
	}
	load.Wait(t)
	rep := oracleCheck(t, c, "rebal", []int64{1, 2}, cfg)
	t.Logf("rebalance: %d events produced in %d records, %d SIGKILLs, %d SIGTERMs; %s",
		st.events, st.records, kills, graceful, rep)
	crashCheckOffsetsAtEnd(t, c)
	for _, p := range cons {
		if err := p.Stop(); err != nil {
			t.Errorf("%s exit after SIGTERM: %v", p.name, err)
		}
	}
}

// rebalanceGraceful stops victim with SIGTERM while it holds partitions and
// checks that what it consumed was committed before the partitions moved,
// then starts it again.
func rebalanceGraceful(t *testing.T, victim *proc, all []*proc) {
	t.Helper()
	var held rebalanceStatus
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := rebalanceGetStatus(victim)
		if err != nil {
			return false, err.Error()
		}
		held = st
		return len(st.Partitions) > 0, victim.name + " holds no partition"
	})
	from := map[*proc]int{}
	for _, p := range all {
		from[p] = len(p.Log())
	}
	if err := victim.Stop(); err != nil {
		t.Fatalf("%s exit after SIGTERM: %v (want 0)", victim.name, err)
	}
	final := 0
	for _, l := range crashLogLines(victim, from[victim], "flush cycle committed") {
		if tr := l["trigger"]; tr == "shutdown" || tr == "revoke" {
			final++
		}
	}
	if final == 0 {
		t.Errorf("%s logged no committed shutdown or revoke cycle after SIGTERM", victim.name)
	}
	victim.Start()
	// Every partition it held moves to some member (it may be the restarted
	// victim itself), which starts at the Redis offset it committed.
	consumed := map[int32]int64{}
	for _, ps := range held.Partitions {
		if ps.Next >= 0 {
			consumed[ps.Partition] = ps.Next
		}
	}
	starts := map[int32]int64{}
	waitFor(t, 30*time.Second, func() (bool, string) {
		for _, p := range all {
			for part, off := range rebalanceAssignedStart(p, from[p]) {
				if _, ok := starts[part]; !ok {
					starts[part] = off
				}
			}
		}
		for part := range consumed {
			if _, ok := starts[part]; !ok {
				return false, fmt.Sprintf("partition %d of %s not reassigned from a Redis offset", part, victim.name)
			}
		}
		return true, ""
	})
	for part, next := range consumed {
		if starts[part] < next {
			t.Errorf("partition %d: %s had consumed up to %d before SIGTERM, the next owner started at Redis offset %d",
				part, victim.name, next, starts[part])
		}
	}
	t.Logf("SIGTERM %s: held %d partitions (consumed %v), next owners started at %v; %d final cycles",
		victim.name, len(held.Partitions), consumed, starts, final)
}
