package pipeline_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/sink"
)

// A region that speaks for the first time with data below the partition's
// committed checkpoint breaks the upstream assumption (each region
// announces its resolved ts before its data). Its events are still backed
// up, and late_events_total counts them; events above the checkpoint are
// not counted.
func TestLateEventsAreBackedUpAndCounted(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("late", 1)

	on := putBatch(1, 1, 0, 5, 100) // region 1, commit ts 100..104, resolved 104
	r.produceBatch(on)
	r.waitHandled(1)
	r.flush() // the partition's checkpoint is now ts(104)
	if n := testutil.ToFloat64(r.cons.MetricLateEvents()); n != 0 {
		t.Fatalf("late_events_total = %v after in-order events, want 0", n)
	}

	late := putBatch(2, 1, 100, 3, 50)   // region 2, never heard of, at 50..52
	after := putBatch(1, 1, 200, 2, 300) // region 1 goes on at 300
	r.produceBatch(late)
	r.produceBatch(after)
	r.waitHandled(3)
	r.flush()

	_, got := r.entries(id)
	for _, e := range append(append(on.Events, late.Events...), after.Events...) {
		if got[string(e.Key)+"\x00"+string(e.Value)] != 1 {
			t.Fatalf("an event is backed up %d times, want once (late events are kept)", got[string(e.Key)+"\x00"+string(e.Value)])
		}
	}
	if n := testutil.ToFloat64(r.cons.MetricLateEvents()); n != 3 {
		t.Fatalf("late_events_total = %v, want 3 (region 2's puts below the checkpoint)", n)
	}
}
