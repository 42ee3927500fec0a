package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// stormDDL is a create or replace of flow "wide" with tables first..first+n-1.
func stormDDL(op string, first, n uint32) []byte {
	var b strings.Builder
	b.WriteString(`{"op":"` + op + `","flow":{"flow_name":"wide","source_table_ids":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(first+i), 10))
	}
	b.WriteString(`]}}`)
	return []byte(b.String())
}

// TestHostileReplaceStorm: a create of a flow of 100,000 tables, then 50
// replaces alternating between two disjoint sets of 100,000, with loads on
// tables of both sets before and after. The first three replaces are each
// made final before the next (each its own cell of 200,000 window
// changes), the others come as fast as they can be published. The consumer, at its default
// --max-memory (128 MiB), stays under 192 MiB of RSS throughout (a watchdog
// kills it past), is killed with SIGKILL in the middle of the storm and
// restarted, and then commits everything: every DDL applied, no coverage
// step pending, the checkpoint past both loads, every offset. Every table of
// the final set has an open window and none of the other set has one; the
// history holds at most one window per table; Redis holds tens of MB, not
// hundreds; and restore gives the tables of the final set exactly their
// events inside their window, and leaves the tables of the other set out.
func TestHostileReplaceStorm(t *testing.T) {
	if os.Getenv("FLOWLOG_E2E_RACE") == "1" {
		t.Skip("FLOWLOG_E2E_RACE=1: a race-detector consumer's RSS says nothing about its memory bound")
	}
	if testing.Short() {
		t.Skip("-short: 5 million table changes")
	}
	const (
		n       = 100_000
		storm   = 50
		paced   = 3  // replaces each made final before the next is published
		killAt  = 25 // replaces applied when the consumer is killed
		parts   = 2
		timeout = 6 * time.Minute
	)
	setA, setB := uint32(1), uint32(n+1)
	tables := []int64{1, 2, int64(setB), int64(setB) + 1}
	c := startCluster(t, parts)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+2*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Broker.Addr), kgo.DefaultProduceTopic(testenv.DDLTopic),
		kgo.ProducerBatchMaxBytes(4<<20), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	publish := func(v []byte) {
		t.Helper()
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("wide"), Value: v}).FirstErr(); err != nil {
			t.Fatalf("publish DDL: %v", err)
		}
	}
	load1 := loadgen.Config{Events: 4000, Tables: tables, Regions: 4, ValueSize: 64, Seed: 2407,
		StartTime: time.Date(2026, 6, 5, 10, 0, 0, 0, time.UTC)}
	load2 := loadgen.Config{Events: 4000, Tables: tables, Regions: 4, ValueSize: 64, Seed: 2408,
		StartTime: time.Date(2026, 6, 5, 11, 0, 0, 0, time.UTC)}

	start := func(name string) (*proc, *rssWatchdog) {
		// A short session timeout lets the restarted consumer take the
		// killed one's partitions soon.
		p := c.startConsumer(t, name, "--max-memory", "128MiB", "--session-timeout", "6s")
		return p, watchRSS(t, p, memoryBound)
	}
	cons, dog := start("storm-1")
	alive := func(p *proc, d *rssWatchdog) error {
		if over := d.killed.Load(); over > 0 {
			return fmt.Errorf("RSS %.1f MiB passed the %d MiB bound: the watchdog killed the consumer", float64(over)/(1<<20), memoryBound>>20)
		}
		if p.hasExited() {
			return errors.New("the consumer exited")
		}
		return nil
	}
	ddlDone := func(want int64) func() (bool, string, error) {
		return func() (bool, string, error) {
			if err := alive(cons, dog); err != nil {
				return false, "", err
			}
			off, _, err := store.DDLOffset(ctx, testenv.DDLTopic, 0)
			if err != nil {
				return false, err.Error(), nil
			}
			return off >= want, fmt.Sprintf("ddl offset %d, want %d", off, want), nil
		}
	}

	publish(stormDDL(meta.OpCreate, setA, n))
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load1)...)...)
	began := time.Now()
	for i := range storm {
		set := setB
		if i%2 == 1 {
			set = setA
		}
		publish(stormDDL(meta.OpReplace, set, n))
		if i < paced {
			// Each its own cell: 200,000 windows written, B's windows
			// closed, A's first one into the history.
			waitForOrStop(t, timeout, ddlDone(int64(2+i)))
			waitForOrStop(t, timeout, func() (bool, string, error) {
				if err := alive(cons, dog); err != nil {
					return false, "", err
				}
				pending, err := store.PendingCoverage(ctx)
				if err != nil || len(pending) > 0 {
					return false, fmt.Sprintf("replace %d: coverage pending (%v)", i, err), nil
				}
				return true, "", nil
			})
		}
		if i+1 == killAt {
			waitForOrStop(t, timeout, ddlDone(int64(1+killAt)))
			peak1 := dog.peak.Load()
			dog.halt()
			cons.Kill()
			t.Logf("consumer killed with %d replaces applied, %.1fs into the storm; its RSS peaked at %.1f MiB",
				killAt, time.Since(began).Seconds(), float64(peak1)/(1<<20))
			cons, dog = start("storm-2")
		}
	}
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load2)...)...)
	adm := newAdmin(t, c.Broker.Addr)
	end := map[int32]int64{}
	endOffsets(ctx, t, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	adm.Close()
	covered := map[int64]bool{1: true, 2: true}
	maxResolved := max(expectedEvents(load1, covered).maxResolved, expectedEvents(load2, covered).maxResolved)

	waitForOrStop(t, timeout, func() (bool, string, error) {
		if ok, msg, err := ddlDone(1 + storm)(); !ok || err != nil {
			return ok, msg, err
		}
		pending, err := store.PendingCoverage(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		if len(pending) > 0 {
			return false, fmt.Sprintf("%d coverage steps pending", len(pending[0].Entries)), nil
		}
		id, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, "wide")
		if err != nil || !ok {
			return false, fmt.Sprintf("flow wide: %v", err), nil
		}
		st, err := store.FlowState(ctx, id)
		if err != nil || st.CheckpointTS < maxResolved {
			return false, fmt.Sprintf("checkpoint %d, want %d (%v)", st.CheckpointTS, maxResolved, err), nil
		}
		for p, e := range end {
			if o, _, err := store.Offset(ctx, testenv.ApplyTopic, p); err != nil || o != e {
				return false, fmt.Sprintf("partition %d: Redis offset %d (%v), end %d", p, o, err, e), nil
			}
		}
		return true, "", nil
	})
	took := time.Since(began)
	peak2 := dog.peak.Load()
	dog.halt()
	mem, err := peakRSS(cons)
	if err != nil {
		t.Fatal(err)
	}
	redisMB := redisDataMB(t, c.Redis)
	t.Logf("storm committed %v after it began; restarted consumer VmHWM %.1f MiB (largest VmRSS sample %.1f MiB) against %d MiB; Redis data %.1f MB",
		took.Round(time.Millisecond), float64(mem.peak)/(1<<20), float64(peak2)/(1<<20), memoryBound>>20, redisMB)
	if mem.peak >= memoryBound {
		t.Errorf("consumer VmHWM %.1f MiB, want under %d MiB", float64(mem.peak)/(1<<20), memoryBound>>20)
	}
	if redisMB > 150 {
		t.Errorf("Redis holds %.1f MB after the storm, want tens", redisMB)
	}

	id, _, _ := store.FlowIDByName(ctx, meta.DefaultCatalog, "wide")
	cur, hist, err := store.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	openA, openB := 0, 0
	for tb, w := range cur {
		if w.Until == nil {
			if tb < setB {
				openA++
			} else {
				openB++
			}
		}
	}
	perTable := map[uint32]int{}
	for _, w := range hist {
		perTable[w.TableID]++
	}
	worst := 0
	for _, k := range perTable {
		worst = max(worst, k)
	}
	t.Logf("%d current windows (%d open of the final set, %d of the other), %d earlier ones, at most %d for a table", len(cur), openA, openB, len(hist), worst)
	if openA != n || openB != 0 || len(cur) != 2*n {
		t.Errorf("%d windows, %d tables of the final set have an open window and %d of the other; want %d windows, %d and 0", len(cur), openA, openB, 2*n, n)
	}
	if worst > 1 {
		t.Errorf("a table keeps %d earlier windows: the history kept windows no restore can choose", worst)
	}

	// Restore at the checkpoint: the final set's tables hold exactly their
	// events inside their current window; the other set's are left out.
	st, _ := store.FlowState(ctx, id)
	out := t.TempDir()
	res := oracleRun(t, "restore", c.oracleConn(), "--flow", "wide", "--tables", fmt.Sprintf("1,2,%d,%d", setB, setB+1),
		"--ts", strconv.FormatUint(st.CheckpointTS, 10), "--out", out, "--temp-dir", t.TempDir())
	if res.code != 0 {
		t.Fatalf("restore exited %d:\n%s", res.code, res.out)
	}
	for _, tb := range []int64{int64(setB), int64(setB) + 1} {
		if !strings.Contains(res.out, "table "+strconv.FormatInt(tb, 10)+": ") {
			t.Errorf("restore did not name table %d of the other set as left out:\n%s", tb, res.out)
		}
	}
	muts := append(loadgen.Mutations(load1), loadgen.Mutations(load2)...)
	for _, tb := range []int64{1, 2} {
		w := cur[uint32(tb)]
		var inside []loadgen.Mutation
		for _, m := range muts {
			if m.CommitTS > w.Since {
				inside = append(inside, m)
			}
		}
		want := loadgen.Expected(inside, st.CheckpointTS)[tb]
		got := oracleReadRestore(t, filepath.Join(out, strconv.FormatInt(tb, 10)+".jsonl"))
		if len(want) == 0 || len(got) != len(want) {
			t.Errorf("table %d restored %d keys, want %d (window since %d)", tb, len(got), len(want), w.Since)
			continue
		}
		for k, r := range want {
			if g, ok := got[k]; !ok || string(g.Value) != string(r.Value) || g.CommitTS != r.CommitTS {
				t.Errorf("table %d key %x: restored %+v, want %+v", tb, k, g, r)
				break
			}
		}
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}

// redisDataMB is the memory a redis-server uses for data, in MB.
func redisDataMB(t *testing.T, r *testenv.Redis) float64 {
	t.Helper()
	info, err := r.Client(t).Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory_dataset:"); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n / 1e6
		}
	}
	t.Fatal("no used_memory_dataset in INFO memory")
	return 0
}
