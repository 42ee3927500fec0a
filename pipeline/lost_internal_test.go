package pipeline

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// A layout v2 temp file holds the events of every partition of its key.
// When partitions are lost (the group session expired), a file of lost
// partitions only is dropped; one that also holds a partition still owned
// cannot give the lost events back alone, so nothing of the generation may
// commit: the next freeze completes its cycle with meta.ErrLeaseLost and
// removes the files, the partitions' offsets stay where they were
// committed, and the consume loop ends the session (which rejoins and
// consumes every partition again from its last commit).
func TestLostPartitionInASharedChunkEndsTheSession(t *testing.T) {
	dir := t.TempDir()
	set := &meta.FlowSet{IDs: []meta.FlowID{1}, Flows: []*meta.Flow{{ID: 1}}}
	s := &session{
		c: &Consumer{cfg: Config{TempDir: dir, MaxOpenFiles: 4, Compression: sink.CompressionNone},
			d: Deps{ApplyTopic: "apply"}, log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		fl: &flusher{kafkaPending: map[int32]int64{}, kafkaGone: map[int32]bool{}},
		parts: map[int32]*partState{
			0: {partition: 0, next: 10, cycleFrom: 4, regions: map[uint64]*regionState{}},
			1: {partition: 1, next: 7, cycleFrom: 2, regions: map[uint64]*regionState{}},
			2: {partition: 2, next: 3, cycleFrom: 3, regions: map[uint64]*regionState{}},
		},
	}
	s.gen = newGeneration(dir, s.nextGen(), 4, sink.CompressionNone, nil)
	put := func(table int64, part int32, region uint64) {
		t.Helper()
		key := fileKey{set: set, table: table, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}
		f, err := s.gen.regionFile(key, region)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.append(event.AppendDataKey(nil, event.RowKey(table, int64(region)), 5), []byte("v"), 5, 0); err != nil {
			t.Fatal(err)
		}
		f.countRegion(region)
		f.countPartition(part)
	}
	put(1, 1, 11) // table 1: partition 1 only
	put(2, 0, 10) // table 2: partitions 0 and 1
	put(2, 1, 11) //
	put(3, 0, 10) // table 3: partition 0 only
	if n := len(s.gen.files); n != 3 {
		t.Fatalf("%d files, want one per table", n)
	}

	s.onLost(t.Context(), nil, map[string][]int32{"apply": {2}})
	if s.lost != nil || len(s.gen.files) != 3 {
		t.Fatalf("losing a partition without events: lost = %v, %d files; want nil and 3", s.lost, len(s.gen.files))
	}

	s.onLost(t.Context(), nil, map[string][]int32{"apply": {1}})
	if !errors.Is(s.lost, meta.ErrLeaseLost) {
		t.Fatalf("lost = %v, want a meta.ErrLeaseLost", s.lost)
	}
	for k := range s.gen.files {
		if k.table == 1 {
			t.Error("the file of the lost partition alone is still in the generation")
		}
	}
	if n := len(s.gen.files); n != 2 {
		t.Fatalf("%d files after the loss, want the 2 that hold partition 0", n)
	}

	cyc := s.freeze(triggerInterval)
	select {
	case <-cyc.done:
	default:
		t.Fatal("the cycle of a generation with lost events was handed to the flusher")
	}
	if !errors.Is(cyc.err, meta.ErrLeaseLost) || len(cyc.files) != 0 || len(cyc.parts) != 0 {
		t.Fatalf("cycle err %v with %d files and %d partition commits; want meta.ErrLeaseLost and nothing to commit", cyc.err, len(cyc.files), len(cyc.parts))
	}
	if ps := s.parts[0]; ps.cycleFrom != 4 {
		t.Errorf("partition 0's cycle offset moved to %d, want 4: its events were dropped", ps.cycleFrom)
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
}
