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
	var leases []meta.Lease
	for p := range int32(2) {
		l, err := s.AcquireLease(ctx, topic, p, "m")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
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
					c.Coverage = append(c.Coverage, meta.CoverageReport{FlowID: id, Seq: e.Seq, Topic: topic, Partition: p, TS: v})
				}
				for _, p := range idle {
					c.Coverage = append(c.Coverage, meta.CoverageReport{FlowID: id, Seq: e.Seq, Topic: topic, Partition: p, Idle: true})
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

// A DDL that removes tables records, in their pending until entries, the
// flow's checkpoint when it was applied: how far a restore may trust the
// tables' open windows until every partition has reported.
func TestPendingUntilRecordsCheckpoint(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t)
	id := apply(t, s, newDDL(meta.OpCreate, "f", 1, 2, 3), at(1)).FlowID
	if _, err := s.AdvanceCheckpoint(ctx, id, 500); err != nil {
		t.Fatal(err)
	}
	apply(t, s, newDDL(meta.OpReplace, "f", 1, 3), at(2))
	if _, err := s.AdvanceCheckpoint(ctx, id, 700); err != nil {
		t.Fatal(err)
	}
	apply(t, s, newDDL(meta.OpReplace, "f", 1), at(3))
	apply(t, s, newDDL(meta.OpReplace, "f", 1, 2), at(4)) // table 2 back: its first until stays pending
	apply(t, s, newDDL(meta.OpReplace, "f", 1), at(5))
	pending, err := s.PendingCoverage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var entries []meta.CoverageEntry
	for _, pf := range pending {
		if pf.ID == id {
			entries = pf.Entries
		}
	}
	got := meta.PendingUntil(entries)
	if len(got) != 2 || got[2] != 500 || got[3] != 700 {
		t.Fatalf("PendingUntil = %v, want table 2 at 500 (its first removal) and table 3 at 700; entries %+v", got, entries)
	}
	for _, e := range entries {
		if e.Kind == meta.CoverageSince && e.Ckpt != 0 {
			t.Errorf("since entry %+v carries a checkpoint", e)
		}
	}
	// A drop records the checkpoint too, before flow:state goes.
	id2 := apply(t, s, newDDL(meta.OpCreate, "g", 7), at(6)).FlowID
	if _, err := s.AdvanceCheckpoint(ctx, id2, 900); err != nil {
		t.Fatal(err)
	}
	apply(t, s, newDDL(meta.OpDrop, "g"), at(7))
	if pending, err = s.PendingCoverage(ctx); err != nil {
		t.Fatal(err)
	}
	for _, pf := range pending {
		if pf.ID == id2 {
			if got := meta.PendingUntil(pf.Entries); got[7] != 900 {
				t.Errorf("after the drop: PendingUntil = %v, want table 7 at 900", got)
			}
			return
		}
	}
	t.Fatal("the drop left no pending entry")
}
