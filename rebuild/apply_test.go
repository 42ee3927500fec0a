package rebuild

import (
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// TestStateCheckpoints: a recovered live flow takes the group's checkpoint
// object (or, without one, its own v1 object), and so does the global
// checkpoint key; a dropped flow keeps the checkpoint its drop recorded in
// its catalog.
func TestStateCheckpoints(t *testing.T) {
	p := &Plan{Group: "g", Checkpoint: 900, CheckpointPath: "v2/global_checkpoint/g.ts", Catalogs: []sink.Catalog{
		{FlowID: 1, Name: "live", CheckpointTS: 500},
		{FlowID: 2, Name: "gone", Dropped: true, CheckpointTS: 700},
		{FlowID: 3, Name: "gone-early", Dropped: true},
	}}
	r, err := p.State()
	if err != nil {
		t.Fatal(err)
	}
	if r.GlobalCheckpoint != 900 {
		t.Errorf("global checkpoint %d, want the object's 900", r.GlobalCheckpoint)
	}
	want := map[uint32]uint64{1: 900, 2: 700, 3: 900}
	for _, f := range r.Flows {
		if f.CheckpointTS != want[uint32(f.ID)] {
			t.Errorf("flow %d: checkpoint %d, want %d", f.ID, f.CheckpointTS, want[uint32(f.ID)])
		}
	}
	v1 := &Plan{Group: "g", FlowCheckpoints: map[uint32]uint64{1: 400}, Catalogs: []sink.Catalog{{FlowID: 1, Name: "live", CheckpointTS: 300}}}
	if r, err := v1.State(); err != nil || len(r.Flows) != 1 || r.Flows[0].CheckpointTS != 400 || r.GlobalCheckpoint != 0 {
		t.Errorf("layout v1: %+v, %v; want the flow's own object, 400", r.Flows, err)
	}
}
