package meta_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/meta"
)

// stormTables are n consecutive table ids from first.
func stormTables(first, n uint32) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = first + uint32(i)
	}
	return ts
}

// stormRig is a store with one apply partition (lease held) whose reports
// the test makes.
type stormRig struct {
	t     *testing.T
	s     *meta.Store
	rdb   *redis.Client
	lease meta.Lease
	off   int64
}

const stormTopic = "flowlog.apply"

func newStormRig(t *testing.T) *stormRig {
	// A DDL of 100,000 tables holds Redis for most of a second, several on
	// a busy machine: more than the client's default 3 s read timeout
	// allows. (The consumer's catch-up retries such a DDL, and a retry of
	// one that went through is skipped; here it would fail the test.)
	srv := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: time.Minute})
	t.Cleanup(func() { rdb.Close() })
	s := meta.NewStore(rdb, "", nil)
	l, err := s.AcquireLease(context.Background(), stormTopic, 0, "m")
	if err != nil {
		t.Fatal(err)
	}
	return &stormRig{t: t, s: s, rdb: rdb, lease: l}
}

func (r *stormRig) ddl(op string, tables []uint32) meta.Applied {
	r.t.Helper()
	r.off++
	return apply(r.t, r.s, meta.DDL{Op: op, Flow: meta.FlowInfo{FlowName: "wide", SourceTableIDs: tables}}, at(r.off))
}

// report makes the partition report every pending step with since and
// until, as crossed at once up to upto (0: each step on its own).
func (r *stormRig) report(since, until, upto uint64) {
	r.t.Helper()
	ctx := context.Background()
	pending, err := r.s.PendingCoverage(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	c := meta.Commit{Leases: []meta.Lease{r.lease}}
	for _, pf := range pending {
		for _, e := range pf.Entries {
			c.Coverage = append(c.Coverage, meta.CoverageReport{FlowID: pf.ID, Seq: e.Seq, Topic: stormTopic, Partition: 0,
				Since: meta.CoverageValue{TS: since}, Until: meta.CoverageValue{TS: until}, Upto: upto})
		}
	}
	if err := r.s.Commit(ctx, c); err != nil {
		r.t.Fatal(err)
	}
}

// finalize calls FinalizeCoverage until nothing is pending, and returns how
// many calls that took and the windows written.
func (r *stormRig) finalize() (calls, wrote int) {
	r.t.Helper()
	ctx := context.Background()
	for {
		n, err := r.s.FinalizeCoverage(ctx, stormTopic, []int32{0})
		if err != nil {
			r.t.Fatal(err)
		}
		calls++
		wrote += n
		if pending, err := r.s.PendingCoverage(ctx); err != nil || len(pending) == 0 {
			return calls, wrote
		}
		if n == 0 {
			r.t.Fatalf("finalize made no progress with steps pending")
		}
	}
}

// newWideFlow creates flow "wide" of tables a = 1..n, its windows final
// since 100, and returns them with the other set b = n+1..2n.
func newWideFlow(t *testing.T, n uint32) (r *stormRig, a, b []uint32, id meta.FlowID) {
	t.Helper()
	r = newStormRig(t)
	a, b = stormTables(1, n), stormTables(n+1, n)
	id = r.ddl(meta.OpCreate, a).FlowID
	r.report(100, 100, 0)
	if calls, wrote := r.finalize(); wrote != int(n) {
		t.Fatalf("create finalized %d windows in %d calls, want %d", wrote, calls, n)
	}
	return r, a, b, id
}

// redisBytes is the memory Redis uses for data (INFO memory).
func (r *stormRig) redisBytes() int64 {
	info, err := r.rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory_dataset:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	r.t.Fatal("no used_memory_dataset in INFO memory")
	return 0
}

// TestCoverageReplaceStorm is the replace storm of a wide flow: a create of
// 100,000 tables, then 50 replaces alternating between two disjoint sets
// of 100,000. Seen by the partition in one registry refresh, the 50 steps
// are one cell whose net change is nothing: every table of the first set
// keeps its window, the second set gets none, no history, and the pending
// state is gone. Redis holds a few MB for it, where one entry per table
// and replace took 772 MB.
func TestCoverageReplaceStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 5 million tables through Redis")
	}
	const n = 100_000
	ctx := context.Background()
	r, a, b, id := newWideFlow(t, n)

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	start := time.Now()
	for i := range 50 {
		set := b
		if i%2 == 1 {
			set = a
		}
		r.ddl(meta.OpReplace, set)
	}
	applied := time.Since(start)
	pending, err := r.s.PendingCoverage(ctx)
	if err != nil || len(pending) != 1 || len(pending[0].Entries) != 50 {
		t.Fatalf("pending after 50 replaces: %+v (%v), want one flow with 50 steps", pending, err)
	}
	stormBytes := r.redisBytes()
	r.report(500, 400, pending[0].Entries[49].Seq) // one refresh crossed all 50
	calls, wrote := r.finalize()
	runtime.ReadMemStats(&ms)
	t.Logf("50 replaces of %d tables applied in %v; Redis data %.1f MB with them pending; finalized in %d calls writing %d windows; %.0f MB allocated in all",
		n, applied.Round(time.Millisecond), float64(stormBytes)/1e6, calls, wrote, float64(ms.TotalAlloc-before)/1e6)
	if wrote != 0 {
		t.Errorf("a storm crossed at once wrote %d windows, want none (its net change is nothing)", wrote)
	}
	cur, hist, err := r.s.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur) != n || len(hist) != 0 {
		t.Fatalf("after the storm: %d current windows and %d earlier ones, want %d and none", len(cur), len(hist), n)
	}
	for _, tb := range []uint32{1, n / 2, n} {
		if w := cur[tb]; w.Since != 100 || w.Until != nil {
			t.Errorf("table %d after the storm: %+v, want its window since 100, open", tb, w)
		}
	}
	if _, ok := cur[n+1]; ok {
		t.Errorf("table %d of the other set has a window", n+1)
	}
	if keys := scanKeys(t, r.rdb, fmt.Sprintf("coverage:%d:step:*", id)); len(keys) != 0 {
		t.Errorf("step keys left after the storm: %d", len(keys))
	}
	if stormBytes > 100<<20 {
		t.Errorf("Redis data with the storm pending: %.1f MB, want a few", float64(stormBytes)/1e6)
	}
}

// TestCoverageReplaceStormObserved: the same storm when the partition
// crosses each replace on its own (each its own cell). Every replace
// changes 200,000 windows, as it must, a chunk at a time over several
// calls. With nothing moving in between, the windows a table gets are
// all [300, 500], which the newest holds: the history keeps none of them,
// only each table's first window. A truncation point past that one
// empties the history; restores choose as before at every ts.
func TestCoverageReplaceStormObserved(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: millions of table windows through Redis")
	}
	const n = 100_000
	ctx := context.Background()
	r, a, b, id := newWideFlow(t, n)
	maxCalls := 0
	for i := range 6 {
		set := b
		if i%2 == 1 {
			set = a
		}
		r.ddl(meta.OpReplace, set)
		r.report(300, 500, 0) // since 300 <= until 500: each new window holds [300, 500]
		calls, wrote := r.finalize()
		maxCalls = max(maxCalls, calls)
		if wrote != 2*n {
			t.Fatalf("replace %d wrote %d windows, want %d", i, wrote, 2*n)
		}
	}
	cur, hist, err := r.s.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("6 replaces observed one by one: %d FinalizeCoverage calls at most per replace; %d current windows, %d earlier ones", maxCalls, len(cur), len(hist))
	if maxCalls < 2 {
		t.Errorf("a replace of %d windows was written in %d call: the per-call bound did not apply", 2*n, maxCalls)
	}
	// Table 1: (100, 500] first, then [300, 500] twice and [300, open):
	// the two [300, 500] lie inside the current window, so only the
	// first stays. Table n+1: [300, 500] three times, the last current:
	// nothing earlier stays.
	perTable := map[uint32]int{}
	for _, w := range hist {
		perTable[w.TableID]++
	}
	if perTable[1] != 1 || perTable[n+1] != 0 || len(hist) != n {
		t.Errorf("history: %d windows, table 1 has %d, table %d has %d; want one per table of the first set, none of the second",
			len(hist), perTable[1], n+1, perTable[n+1])
	}
	for _, tc := range []struct {
		table uint32
		ts    uint64
		ok    bool
		since uint64
	}{{1, 99, false, 0}, {1, 200, true, 100}, {1, 400, true, 300}, {n + 1, 200, false, 0}, {n + 1, 400, true, 300}, {n + 1, 600, false, 0}} {
		w, ok := meta.WindowAt(cur, hist, tc.table, tc.ts)
		if ok != tc.ok || ok && w.Since != tc.since {
			t.Errorf("WindowAt(table %d, %d) = %+v %v, want ok=%v since %d", tc.table, tc.ts, w, ok, tc.ok, tc.since)
		}
	}
	// Truncated past the history's windows: none of them can be chosen.
	if err := r.rdb.Set(ctx, meta.NewKeys("").TruncatedBefore(uint32(id)), "501", 0).Err(); err != nil {
		t.Fatal(err)
	}
	dropped, err := r.s.PruneHistory(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, hist, _ = r.s.Windows(ctx, id); len(hist) != 0 || dropped != n {
		t.Errorf("after truncating past them: %d earlier windows left, %d dropped; want none left, %d dropped", len(hist), dropped, n)
	}
}

func scanKeys(t *testing.T, rdb *redis.Client, pattern string) []string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}
