package meta_test

import (
	"context"
	"testing"

	"github.com/flowlog/flowlog/meta"
)

// TestCoverageFinalizersRace is two finalizers on one cell: the second
// reads the cell, the first writes and ends it, a later DDL adds a step,
// and only then does the second write. The second must see that its cell
// is gone, and the next cell must still become final with the right
// windows: a cursor written for an ended cell would wedge every later
// step of the flow.
func TestCoverageFinalizersRace(t *testing.T) {
	ctx := context.Background()
	r := newStormRig(t)
	id := r.ddl(meta.OpCreate, []uint32{1, 2}).FlowID
	r.report(100, 100, 0)
	raced := false
	restore := meta.SetBeforeFirstChunk(func() {
		if raced {
			return
		}
		raced = true
		r.finalize() // the other finalizer takes the same cell to its end
		r.ddl(meta.OpReplace, []uint32{1, 2, 3})
		r.report(300, 300, 0)
	})
	if _, err := r.s.FinalizeCoverage(ctx, stormTopic, []int32{0}); err != nil {
		t.Fatalf("the finalizer that lost the race: %v", err)
	}
	restore()
	if !raced {
		t.Fatal("the race was not staged: no cell was written")
	}
	r.finalize()
	cur, _, err := r.s.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]uint64{1: 100, 2: 100, 3: 300}
	if len(cur) != len(want) {
		t.Fatalf("windows %v, want tables %v", cur, want)
	}
	for table, since := range want {
		if w, ok := cur[table]; !ok || w.Since != since || w.Until != nil {
			t.Errorf("table %d: window %+v, want open since %d", table, w, since)
		}
	}
}

// TestCoverageStaleCursorRepaired is the state an earlier version's race
// left: a cursor naming a cell whose steps are gone, and a later step
// pending. Finalizing drops the cursor and goes on with the step.
func TestCoverageStaleCursorRepaired(t *testing.T) {
	ctx := context.Background()
	r := newStormRig(t)
	id := r.ddl(meta.OpCreate, []uint32{1}).FlowID
	r.report(100, 100, 0)
	r.finalize()
	r.ddl(meta.OpReplace, []uint32{1, 2})
	r.report(200, 200, 0)
	if err := r.rdb.Set(ctx, r.s.Keys().CoverageFin(uint32(id)), "1:1:1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.finalize()
	cur, _, err := r.s.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if w := cur[2]; w.Since != 200 {
		t.Fatalf("table 2: window %+v, want since 200 (windows %v)", w, cur)
	}
	if n, err := r.rdb.Exists(ctx, r.s.Keys().CoverageFin(uint32(id))).Result(); err != nil || n != 0 {
		t.Fatalf("cursor still stored: %d %v", n, err)
	}
}
