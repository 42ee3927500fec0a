package meta_test

import (
	"context"
	"testing"

	"github.com/flowlog/flowlog/meta"
)

// Coverage windows through their whole life: the DDL opens pending
// entries, partition reports ride in commits, and an entry becomes final
// only once every partition with records reported it. A window final too
// early would let a restore claim events no partition had routed yet
// (docs/FORMAT.md, "Coverage rule").
func TestCoverageWindowsLifecycle(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	const topic = "flowlog.apply"
	leases := leasesOf(t, s, topic, 2)
	withRecords := []int32{0, 1}
	report := func(id meta.FlowID, vals map[int32]uint64, idle ...int32) {
		t.Helper()
		pending, err := s.PendingCoverage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := meta.Commit{Leases: leases}
		for _, pf := range pending {
			if pf.ID != id {
				continue
			}
			for _, e := range pf.Entries {
				for p, v := range vals {
					ts := meta.CoverageValue{TS: v}
					c.Coverage = append(c.Coverage, meta.CoverageReport{FlowID: id, Seq: e.Seq, Topic: topic, Partition: p, Since: ts, Until: ts})
				}
				for _, p := range idle {
					idle := meta.CoverageValue{Idle: true}
					c.Coverage = append(c.Coverage, meta.CoverageReport{FlowID: id, Seq: e.Seq, Topic: topic, Partition: p, Since: idle, Until: idle})
				}
			}
		}
		if err := s.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	finalize := func() int {
		t.Helper()
		n, err := s.FinalizeCoverage(ctx, topic, withRecords)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	windows := func(id meta.FlowID) (map[uint32]meta.Window, []meta.Window) {
		t.Helper()
		cur, hist, err := s.Windows(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return cur, hist
	}

	id := apply(t, s, newDDL(meta.OpCreate, "f", 1, 2), at(1)).FlowID
	report(id, map[int32]uint64{0: 100})
	if n := finalize(); n != 0 {
		t.Fatalf("finalized %d entries with partition 1 not reported", n)
	}
	if cur, _ := windows(id); len(cur) != 0 {
		t.Fatalf("windows before every partition reported: %v", cur)
	}
	report(id, map[int32]uint64{1: 250})
	report(id, map[int32]uint64{1: 999}) // a later report of the same entry is ignored
	if n := finalize(); n != 2 {
		t.Fatalf("finalized %d entries, want 2 (tables 1 and 2)", n)
	}
	cur, _ := windows(id)
	if w := cur[1]; w.Since != 250 || w.Until != nil || cur[2].Since != 250 {
		t.Fatalf("windows after create = %+v, want since 250 (max of the reports), open", cur)
	}

	// Replace: table 2 out, table 3 in. Partition 1 has no live region.
	replace := newDDL(meta.OpReplace, "f", 1, 3)
	apply(t, s, replace, at(2))
	report(id, map[int32]uint64{0: 400}, 1)
	if n := finalize(); n != 2 {
		t.Fatalf("finalized %d entries after replace, want 2", n)
	}
	cur, _ = windows(id)
	if w := cur[2]; w.Until == nil || *w.Until != 400 || w.Since != 250 {
		t.Fatalf("table 2 after removal = %+v, want (250, 400] (idle partition left out)", w)
	}
	if w := cur[3]; w.Since != 400 || w.Until != nil {
		t.Fatalf("table 3 after adding = %+v, want since 400", w)
	}
	if w, ok := meta.WindowAt(cur, nil, 2, 300); !ok || w.Since != 250 {
		t.Fatalf("WindowAt(table 2, 300) = %+v, %v", w, ok)
	}
	if _, ok := meta.WindowAt(cur, nil, 2, 401); ok {
		t.Fatal("table 2 restorable after its removal")
	}
	if _, ok := meta.WindowAt(cur, nil, 3, 399); ok {
		t.Fatal("table 3 restorable before it was added")
	}

	// Table 2 again: a new window, the old one in history.
	apply(t, s, newDDL(meta.OpReplace, "f", 1, 2, 3), at(3))
	report(id, map[int32]uint64{0: 700, 1: 650})
	finalize()
	cur, hist := windows(id)
	if w := cur[2]; w.Since != 700 || w.Until != nil {
		t.Fatalf("table 2 re-added = %+v, want since 700", w)
	}
	if len(hist) != 1 || hist[0].TableID != 2 || hist[0].Since != 250 || *hist[0].Until != 400 {
		t.Fatalf("history = %+v, want table 2's (250, 400]", hist)
	}
	if w, ok := meta.WindowAt(cur, hist, 2, 300); !ok || w.Since != 250 {
		t.Fatalf("WindowAt(table 2, 300) with history = %+v, %v", w, ok)
	}
	if _, ok := meta.WindowAt(cur, hist, 2, 500); ok {
		t.Fatal("table 2 restorable in the gap between its windows")
	}

	// Drop closes every window; the catalog outlives the flow.
	apply(t, s, newDDL(meta.OpDrop, "f"), at(4))
	report(id, map[int32]uint64{0: 900, 1: 800})
	finalize()
	cur, _ = windows(id)
	for _, tb := range []uint32{1, 2, 3} {
		if w := cur[tb]; w.Until == nil || *w.Until != 800 {
			t.Fatalf("table %d after drop = %+v, want until 800", tb, w)
		}
	}
	if pending, _ := s.PendingCoverage(ctx); len(pending) != 0 {
		t.Fatalf("pending after everything finalized: %+v", pending)
	}
}

// A cell is the run of steps every partition crossed at once. Steps A
// (table 2 out), B (table 2 back) and C (table 3 in): if both partitions
// crossed all three in one refresh, nothing routed the definition without
// table 2, so its window goes on and only table 3 gets one; if partition 1
// crossed A on its own, table 2 was not routed there for a while, so its
// window ends at A and a new one starts at B.
func TestCoverageCellsFollowEveryPartition(t *testing.T) {
	for _, tc := range []struct {
		name      string
		p1AOnly   bool
		wantHist  int
		wantSince uint64 // table 2's current window
	}{
		{"both crossed A to C at once", false, 0, 10},
		{"partition 1 crossed A alone", true, 1, 70},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, _ := newStore(t)
			const topic = "flowlog.apply"
			leases := leasesOf(t, s, topic, 2)
			commit := func(reps ...meta.CoverageReport) {
				t.Helper()
				if err := s.Commit(ctx, meta.Commit{Leases: leases, Coverage: reps}); err != nil {
					t.Fatal(err)
				}
			}
			rep := func(id meta.FlowID, seq uint64, p int32, since, until, upto uint64) meta.CoverageReport {
				return meta.CoverageReport{FlowID: id, Seq: seq, Topic: topic, Partition: p,
					Since: meta.CoverageValue{TS: since}, Until: meta.CoverageValue{TS: until}, Upto: upto}
			}
			id := apply(t, s, newDDL(meta.OpCreate, "f", 1, 2), at(1)).FlowID
			commit(rep(id, 1, 0, 10, 10, 1), rep(id, 1, 1, 10, 10, 1))
			if _, err := s.FinalizeCoverage(ctx, topic, []int32{0, 1}); err != nil {
				t.Fatal(err)
			}
			apply(t, s, newDDL(meta.OpReplace, "f", 1), at(2))       // A = step 2
			apply(t, s, newDDL(meta.OpReplace, "f", 1, 2), at(3))    // B = step 3
			apply(t, s, newDDL(meta.OpReplace, "f", 1, 2, 3), at(4)) // C = step 4
			for seq := uint64(2); seq <= 4; seq++ {
				commit(rep(id, seq, 0, 50, 40, 4))
				if tc.p1AOnly && seq == 2 {
					commit(rep(id, seq, 1, 60, 55, 2))
				} else {
					commit(rep(id, seq, 1, 70, 65, 4))
				}
			}
			for range 3 {
				if _, err := s.FinalizeCoverage(ctx, topic, []int32{0, 1}); err != nil {
					t.Fatal(err)
				}
			}
			cur, hist, err := s.Windows(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if w := cur[2]; w.Since != tc.wantSince || w.Until != nil || len(hist) != tc.wantHist {
				t.Fatalf("table 2: current %+v, %d earlier windows; want since %d open, %d earlier", w, len(hist), tc.wantSince, tc.wantHist)
			}
			if tc.p1AOnly && (hist[0].Since != 10 || *hist[0].Until != 40) {
				t.Fatalf("table 2's earlier window %+v, want (10, 40]: the min of A's untils", hist[0])
			}
			if w := cur[3]; w.Since != 70 || w.Until != nil {
				t.Fatalf("table 3: %+v, want since 70 (the max of the since reports)", w)
			}
			if w := cur[1]; w.Since != 10 || w.Until != nil {
				t.Fatalf("table 1: %+v, want its window untouched", w)
			}
			if pending, _ := s.PendingCoverage(ctx); len(pending) != 0 {
				t.Fatalf("pending left: %+v", pending)
			}
		})
	}
}

// Truncate drops the earlier windows that end below its point (no restore
// can choose them) and keeps the others.
func TestTruncatePrunesHistory(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	const topic = "flowlog.apply"
	l, err := s.AcquireLease(ctx, topic, 0, "m")
	if err != nil {
		t.Fatal(err)
	}
	step := func(ts uint64) {
		t.Helper()
		pending, err := s.PendingCoverage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := meta.Commit{Leases: []meta.Lease{l}}
		for _, pf := range pending {
			for _, e := range pf.Entries {
				v := meta.CoverageValue{TS: ts}
				c.Coverage = append(c.Coverage, meta.CoverageReport{FlowID: pf.ID, Seq: e.Seq, Topic: topic, Partition: 0, Since: v, Until: v})
			}
		}
		if err := s.Commit(ctx, c); err != nil {
			t.Fatal(err)
		}
		if _, err := s.FinalizeCoverage(ctx, topic, []int32{0}); err != nil {
			t.Fatal(err)
		}
	}
	id := apply(t, s, newDDL(meta.OpCreate, "f", 1, 2), at(1)).FlowID
	step(10)
	apply(t, s, newDDL(meta.OpReplace, "f", 3), at(2)) // 1, 2 out at 40
	step(40)
	apply(t, s, newDDL(meta.OpReplace, "f", 1, 3), at(3)) // 1 back at 60: (10, 40] into the history
	step(60)
	apply(t, s, newDDL(meta.OpReplace, "f", 3), at(4)) // 1 out at 90
	step(90)
	apply(t, s, newDDL(meta.OpReplace, "f", 1, 3), at(5)) // 1 back at 120: (60, 90] into the history
	step(120)
	if _, hist, _ := s.Windows(ctx, id); len(hist) != 2 {
		t.Fatalf("history before the truncate: %+v, want table 1's two earlier windows", hist)
	}
	snap := snapPath(id, 70)
	if err := s.AddSnapshot(ctx, id, snap); err != nil {
		t.Fatal(err)
	}
	done, err := s.Truncate(ctx, id, meta.SnapshotRef{FlowID: id, TS: 70, Path: snap},
		func(context.Context, []meta.MetaRef, []meta.SnapshotRef) (meta.TruncateDrop, error) {
			return meta.TruncateDrop{}, nil
		})
	if err != nil || done.HistoryErr != nil {
		t.Fatalf("truncate: %v, %v", err, done.HistoryErr)
	}
	cur, hist, err := s.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if done.HistoryPruned != 1 || len(hist) != 1 || hist[0].Since != 60 || *hist[0].Until != 90 {
		t.Fatalf("after truncating at 70: pruned %d, history %+v; want (10, 40] gone and (60, 90] kept", done.HistoryPruned, hist)
	}
	if w, ok := meta.WindowAt(cur, hist, 1, 80); !ok || w.Since != 60 {
		t.Fatalf("WindowAt(table 1, 80) = %+v %v, want the kept (60, 90]", w, ok)
	}
}

// Pending entries and reports of the per-table format earlier versions
// wrote are made final as steps of one table each.
func TestCoverageLegacyEntries(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	k := meta.NewKeys("")
	const topic = "flowlog.apply"
	id := uint32(7)
	for _, cmd := range [][]any{
		{"RPUSH", k.CoveragePending(id), `{"seq":1,"kind":"since","table":5}`, `{"seq":2,"kind":"since","table":6}`, `{"seq":3,"kind":"until","table":5}`},
		{"SET", k.CoverageSeq(id), "3"},
		{"SADD", k.CoverageFlows(), "7"},
		{"HSET", k.CoverageParts(id), "1/" + topic + "/0", "100", "2/" + topic + "/0", "100", "3/" + topic + "/0", "250"},
		{"RPUSH", k.CoverageHistory(id), `{"table_id":6,"since":1,"until":2}`},
	} {
		if err := rdb.Do(ctx, cmd...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.FinalizeCoverage(ctx, topic, []int32{0}); err != nil {
		t.Fatal(err)
	}
	cur, hist, err := s.Windows(ctx, meta.FlowID(id))
	if err != nil {
		t.Fatal(err)
	}
	if w := cur[5]; w.Since != 100 || w.Until == nil || *w.Until != 250 {
		t.Errorf("table 5: %+v, want (100, 250]", w)
	}
	if w := cur[6]; w.Since != 100 || w.Until != nil {
		t.Errorf("table 6: %+v, want since 100, open", w)
	}
	if len(hist) != 1 || hist[0].TableID != 6 || hist[0].Since != 1 {
		t.Errorf("history %+v, want the earlier version's list entry", hist)
	}
	if pending, _ := s.PendingCoverage(ctx); len(pending) != 0 {
		t.Errorf("pending left: %+v", pending)
	}
}

// leasesOf takes the leases of partitions 0..n-1 of topic for member "m".
func leasesOf(t *testing.T, s *meta.Store, topic string, n int32) []meta.Lease {
	t.Helper()
	var leases []meta.Lease
	for p := range n {
		l, err := s.AcquireLease(context.Background(), topic, p, "m")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	return leases
}
