package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// A table's coverage window starts at the highest commit ts the partition
// had seen before it routed the table and ends at the partition's
// checkpoint where it stopped routing it: the bounds within which every
// event of the table is backed up (docs/FORMAT.md, "Coverage rule").
func TestCoverageWindowOfAddedAndRemovedTable(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	r.createFlow("other", 9) // the consumer is running and has a flow
	handled := func(n int64) {
		t.Helper()
		r.eventually(10*time.Second, func() bool {
			st := r.cons.Status()
			return len(st.Partitions) == 1 && st.Partitions[0].Next == n
		}, "records handled")
	}
	r.produceBatch(putBatch(1, 1, 0, 5, 0)) // before the flow: not captured
	handled(1)
	id := r.createFlow("windowed", 1)
	r.produceBatch(putBatch(1, 1, 100, 5, 100))
	handled(2)
	r.flush()
	ctx := context.Background()
	window := func() (meta.Window, bool) {
		cur, _, err := r.store.Windows(ctx, id)
		w, ok := cur[1]
		return w, err == nil && ok
	}
	r.eventually(10*time.Second, func() bool { _, ok := window(); return ok }, "table 1's window opened")
	if w, _ := window(); w.Since != ts(4) || w.Until != nil {
		t.Fatalf("window after create = since %d until %v, want since %d (the last ts seen before), open", w.Since, w.Until, ts(4))
	}

	r.produce(testenv.DDLTopic, "windowed", ddl("replace", "windowed", 2), "application/json")
	r.produceBatch(putBatch(1, 1, 200, 5, 200)) // after the removal: not captured
	handled(3)
	r.flush()
	r.flush()
	r.eventually(10*time.Second, func() bool { w, ok := window(); return ok && w.Until != nil }, "table 1's window closed")
	if w, _ := window(); w.Since != ts(4) || *w.Until != ts(104) {
		t.Fatalf("window after removal = (%d, %d], want (%d, %d]", w.Since, *w.Until, ts(4), ts(104))
	}
	for _, f := range r.cons.Status().Flows {
		if f.ID == id && (len(f.Windows) != 2 || f.Windows[0].Until == nil || f.Windows[1].TableID != 2 || f.Windows[1].Until != nil) {
			t.Errorf("/status windows of the flow = %+v, want table 1's closed and table 2's open", f.Windows)
		}
	}
	cur, _, _ := r.store.Windows(ctx, id)
	if w, ok := cur[2]; !ok || w.Since != ts(104) {
		t.Fatalf("table 2's window = %+v (%v), want since %d", w, ok, ts(104))
	}
}
