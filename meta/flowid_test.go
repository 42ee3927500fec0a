package meta_test

import (
	"context"
	"errors"
	"testing"

	"github.com/flowlog/flowlog/meta"
)

// Flow ids are never reused, or a new flow would read a dropped flow's
// backup as its own (docs/FORMAT.md, "FlowDDL records"): an explicit create
// of the id of a
// dropped flow whose backup catalog exists is rejected, and flow:seq hands
// out ids past every id seen, also when a dropped flow's id is next.
func TestFlowIDsAreNeverReused(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	seven := meta.FlowID(7)
	d := newDDL(meta.OpCreate, "orders", 1)
	d.FlowID = &seven
	apply(t, s, d, at(1))
	if err := s.Commit(ctx, meta.Commit{Metas: []meta.MetaRef{{FlowID: 7, Path: "default/orders/v1/backupmeta/x.meta", MinResolvedTS: 1}}}); err != nil {
		t.Fatalf("commit a meta of flow 7: %v", err)
	}
	apply(t, s, newDDL(meta.OpDrop, "orders"), at(2))

	for _, name := range []string{"orders", "other"} {
		again := newDDL(meta.OpCreate, name, 2)
		again.FlowID = &seven
		if _, err := s.ApplyDDL(ctx, again, at(3)); !errors.Is(err, meta.ErrFlowIDInUse) {
			t.Fatalf("create %s with the dropped flow's id 7: %v, want ErrFlowIDInUse", name, err)
		}
	}
	// An id whose coverage key is present is used too, and the sequence
	// skips used ids: seq is 7, and 8 has a coverage window.
	if err := rdb.HSet(ctx, "flowlog:{flowlog}:coverage:8", "1", `{"since":1,"until":null}`).Err(); err != nil {
		t.Fatal(err)
	}
	res := apply(t, s, newDDL(meta.OpCreate, "orders", 1), at(3))
	if res.FlowID != 9 {
		t.Fatalf("re-created orders got id %d, want 9 (7 dropped with a backup, 8 used by a coverage window)", res.FlowID)
	}
	if refs, err := s.Metas(ctx, 9); err != nil || len(refs) != 0 {
		t.Fatalf("the new flow starts with metas %v (%v), want none of the old flow's", refs, err)
	}
}
