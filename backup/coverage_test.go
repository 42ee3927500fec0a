package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// leftOut returns the LeftOut events of events.
func leftOut(events []backup.Event) []backup.LeftOut {
	var out []backup.LeftOut
	for _, e := range events {
		if l, ok := e.(backup.LeftOut); ok {
			out = append(out, l)
		}
	}
	return out
}

// setWindows replaces flow 1's current coverage windows with windows
// (table id -> JSON window).
func setWindows(t *testing.T, e *backuptest.Env, windows map[string]string) {
	t.Helper()
	if err := e.Redis.Client(t).HSet(context.Background(), meta.NewKeys(e.RedisPrefix).Coverage(1), windows).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreWithinCoverageWindows: a restore reads each table only inside
// the coverage window that holds its ts, reports every table it leaves out
// with that table's windows, and fails when it leaves out all of them.
func TestRestoreWithinCoverageWindows(t *testing.T) {
	e := backuptest.NewTimed(t)
	// Table 1 was added at 5m (its put at exactly 5m is before the window);
	// table 2 was removed at 5m30s, before its put at 6m.
	until2 := e.TS(5*time.Minute + 30*time.Second)
	setWindows(t, e, map[string]string{
		"1": fmt.Sprintf(`{"since":%d,"until":null}`, e.TS(5*time.Minute)),
		"2": fmt.Sprintf(`{"since":0,"until":%d}`, until2),
	})

	out, _, events, err := restore(t, e.Source(), flowF, e.TS(30*time.Minute), nil)
	if err != nil {
		t.Fatalf("restore at 30m: %v", err)
	}
	left := leftOut(events)
	if len(left) != 1 || left[0].Table != 2 || left[0].TS != e.TS(30*time.Minute) || len(left[0].Windows) != 1 ||
		left[0].Windows[0].Until == nil || *left[0].Windows[0].Until != until2 {
		t.Errorf("left out %+v, want table 2 with its window ending at %d", left, until2)
	}
	if got := backuptest.ReadTable(t, filepath.Join(out, "1.jsonl")); len(got) != 0 {
		t.Errorf("table 1 at 30m = %v, want empty: its only put before 30m is not inside its window", got)
	}
	if _, err := os.Stat(filepath.Join(out, "2.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("table 2 restored although its window ended before 30m (stat: %v)", err)
	}

	out, _, _, err = restore(t, e.Source(), flowF, e.TS(50*time.Minute), nil)
	if err != nil {
		t.Fatalf("restore at the checkpoint: %v", err)
	}
	late := []string{backuptest.Row(1, 1, "late", e.TS(48*time.Minute))}
	if got := backuptest.ReadTable(t, filepath.Join(out, "1.jsonl")); fmt.Sprint(got) != fmt.Sprint(late) {
		t.Errorf("table 1 at the checkpoint = %v, want %v", got, late)
	}

	// Close table 1's window too: at 30m nothing is restorable.
	setWindows(t, e, map[string]string{"1": fmt.Sprintf(`{"since":%d,"until":%d}`, e.TS(5*time.Minute), e.TS(10*time.Minute))})
	_, _, events, err = restore(t, e.Source(), flowF, e.TS(30*time.Minute), nil)
	var un *backup.UncoveredError
	if !errors.As(err, &un) || un.NoWindow || un.TS != e.TS(30*time.Minute) || len(leftOut(events)) != 2 {
		t.Fatalf("restore with every table outside its window = %v, left out %+v; want an *UncoveredError after both tables", err, leftOut(events))
	}
}

// TestRestoreTablesWithoutWindow: a table being added is left out as
// establishing, one that is not the flow's as having no window at all, and
// a flow with no window yet has nothing restorable.
func TestRestoreTablesWithoutWindow(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	info, _, err := e.Store.FlowInfo(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A REPLACE that adds table 3: its window waits for the partitions.
	next := info
	next.SourceTableIDs = []uint32{1, 2, 3}
	if err := e.Store.UpdateFlow(ctx, 1, info, next, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	_, _, events, err := restore(t, e.Source(), flowF, 0, map[int64]bool{1: true, 3: true, 7: true})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	left := leftOut(events)
	if len(left) != 2 || left[0].Table != 3 || !left[0].Establishing || len(left[0].Windows) != 0 ||
		left[1].Table != 7 || left[1].Establishing || len(left[1].Windows) != 0 {
		t.Errorf("left out %+v, want table 3 establishing and table 7 with no window", left)
	}

	rdb := e.Redis.Client(t)
	k := meta.NewKeys("flowlog")
	if err := rdb.Del(ctx, k.Coverage(1), k.CoveragePending(1), k.CoverageFlows()).Err(); err != nil {
		t.Fatal(err)
	}
	var un *backup.UncoveredError
	if _, _, _, err := restore(t, e.Source(), flowF, 0, nil); !errors.As(err, &un) || !un.NoWindow {
		t.Fatalf("restore of a flow without windows = %v, want an *UncoveredError with NoWindow", err)
	}
}

// TestRestoreDroppedFlowCheckpointBeforeWindows: a dropped flow whose
// global_checkpoint object stopped before its coverage windows began
// (dropped before a checkpoint advance passed their since) is restorable up
// to its windows' ends: final windows need every apply partition's report,
// and each report is committed with the data before its boundary. With the
// object missing it is restorable the same way; while a window is still
// open the restore fails.
func TestRestoreDroppedFlowCheckpointBeforeWindows(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	info, _, err := e.Store.FlowInfo(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Store.DestroyFlow(ctx, 1, info); err != nil {
		t.Fatal(err)
	}
	ckptPath := sink.CheckpointPath("pre", "default", "f", backuptest.Group, 1)
	e.PutObject(ckptPath, sink.EncodeCheckpoint(e.TS(3*time.Minute)))
	windows := func(until2 string) map[string]string {
		return map[string]string{
			"1": fmt.Sprintf(`{"since":%d,"until":%d}`, e.TS(4*time.Minute), e.TS(50*time.Minute)),
			"2": fmt.Sprintf(`{"since":%d,"until":%s}`, e.TS(4*time.Minute), until2),
		}
	}
	byID := backup.Lookup{ID: 1}
	late := []string{backuptest.Row(1, 1, "late", e.TS(48*time.Minute))}
	nine := []string{backuptest.Row(2, 9, "nine", e.TS(6*time.Minute))}
	check := func(name string, unreadable bool) {
		t.Helper()
		out, res, events, err := restore(t, e.Source(), byID, 0, nil)
		if err != nil {
			t.Fatalf("%s: restore: %v", name, err)
		}
		if res.TS != e.TS(50*time.Minute) {
			t.Errorf("%s: restored as of %d, want the windows' end %d", name, res.TS, e.TS(50*time.Minute))
		}
		var sawEnd, sawUnreadable bool
		for _, ev := range events {
			switch ev := ev.(type) {
			case backup.AtWindowsEnd:
				sawEnd = ev.End == e.TS(50*time.Minute)
			case backup.CheckpointUnreadable:
				sawUnreadable = ev.Err != nil
			}
		}
		if !sawEnd || sawUnreadable != unreadable {
			t.Errorf("%s: events %+v, want AtWindowsEnd at the windows' end and CheckpointUnreadable %v", name, events, unreadable)
		}
		if got := backuptest.ReadTable(t, filepath.Join(out, "1.jsonl")); fmt.Sprint(got) != fmt.Sprint(late) {
			t.Errorf("%s: table 1 = %v, want %v", name, got, late)
		}
		if got := backuptest.ReadTable(t, filepath.Join(out, "2.jsonl")); fmt.Sprint(got) != fmt.Sprint(nine) {
			t.Errorf("%s: table 2 = %v, want %v", name, got, nine)
		}
	}

	setWindows(t, e, windows(fmt.Sprint(e.TS(50*time.Minute))))
	check("checkpoint object before the windows", false)
	if err := e.Bucket.Delete(ctx, ckptPath); err != nil {
		t.Fatal(err)
	}
	check("checkpoint object missing", true)

	setWindows(t, e, windows("null")) // table 2's window is not final yet
	e.PutObject(ckptPath, sink.EncodeCheckpoint(e.TS(3*time.Minute)))
	out, _, events, err := restore(t, e.Source(), byID, 0, nil)
	var un *backup.UncoveredError
	if !errors.As(err, &un) || len(leftOut(events)) != 2 {
		t.Fatalf("restore with an open window and the checkpoint before every window = %v, left out %+v", err, leftOut(events))
	}
	if _, err := os.Stat(filepath.Join(out, "1.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed restore wrote table 1 (stat: %v)", err)
	}
}

// TestRestoreWhileTableRemoved: a table removed from the flow has no until
// until every apply partition has said where it stopped routing it. One
// partition stopped at 52m and no longer backs the table up; the other goes
// on, and the checkpoint moves to 60m. A restore at 60m must not write the
// table as its open window says (its change at 55m on the stopped
// partition is in no chunk): it is complete only up to the checkpoint when
// the removal was applied (50m), and left out past that until the removal
// is final, when its until says.
func TestRestoreWhileTableRemoved(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	const topic = "flowlog.apply"
	p1, err := e.Store.AcquireLease(ctx, topic, 1, "member-1")
	if err != nil {
		t.Fatal(err)
	}
	info, _, err := e.Store.FlowInfo(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	next := info
	next.SourceTableIDs = []uint32{1}
	if err := e.Store.UpdateFlow(ctx, 1, info, next, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	pending, err := e.Store.PendingCoverage(ctx)
	if err != nil || len(pending) != 1 || len(pending[0].Entries) != 1 {
		t.Fatalf("pending coverage %+v, %v; want the step removing table 2", pending, err)
	}
	seq := pending[0].Entries[0].Seq
	report := func(l meta.Lease, ts uint64) meta.CoverageReport {
		v := meta.CoverageValue{TS: ts}
		return meta.CoverageReport{FlowID: 1, Seq: seq, Topic: topic, Partition: l.Partition, Since: v, Until: v}
	}
	// Partition 0 stopped routing table 2 at 52m and committed up to 60m:
	// (2,9) changed to "gone" at 55m there, and nothing backed it up.
	e.Commit(t, e.TS(60*time.Minute), sinktest.WritePut(1, 1, e.TS(53*time.Minute), e.TS(54*time.Minute), []byte("after"), true))
	commit := func(l meta.Lease, off int64, reps ...meta.CoverageReport) {
		t.Helper()
		err := e.Store.Commit(ctx, meta.Commit{Leases: []meta.Lease{l}, Coverage: reps,
			Partitions: []meta.PartitionCommit{{Topic: topic, Partition: l.Partition, NextOffset: off, Checkpoint: e.TS(60 * time.Minute), HasCheckpoint: true}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Store.FinalizeCoverage(ctx, topic, []int32{0, 1}); err != nil {
			t.Fatal(err)
		}
	}
	commit(e.Lease, 10, report(e.Lease, e.TS(52*time.Minute)))
	commit(p1, 10) // partition 1 still routes table 2: no report yet

	nine := []string{backuptest.Row(2, 9, "nine", e.TS(6*time.Minute))}
	out, _, events, err := restore(t, e.Source(), flowF, e.TS(60*time.Minute), nil)
	if err != nil {
		t.Fatalf("restore at 60m: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "2.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("table 2 restored at 60m from a window only known complete up to 50m: %v", backuptest.ReadTable(t, filepath.Join(out, "2.jsonl")))
	}
	left := leftOut(events)
	if len(left) != 1 || left[0].Table != 2 || !left[0].Removing || left[0].CompleteUpTo != e.TS(50*time.Minute) {
		t.Errorf("left out %+v, want table 2 being removed, complete up to %d", left, e.TS(50*time.Minute))
	}
	out, _, _, err = restore(t, e.Source(), flowF, e.TS(50*time.Minute), nil)
	if err != nil {
		t.Fatalf("restore at 50m: %v", err)
	}
	if got := backuptest.ReadTable(t, filepath.Join(out, "2.jsonl")); fmt.Sprint(got) != fmt.Sprint(nine) {
		t.Errorf("table 2 at 50m = %v, want %v", got, nine)
	}

	// Partition 1 reports 58m: the removal is final, until = 52m.
	commit(p1, 11, report(p1, e.TS(58*time.Minute)))
	cur, _, err := e.Store.Windows(ctx, 1)
	if err != nil || cur[2].Until == nil || *cur[2].Until != e.TS(52*time.Minute) {
		t.Fatalf("table 2's window %+v, %v; want until 52m", cur[2], err)
	}
	out, _, _, err = restore(t, e.Source(), flowF, e.TS(51*time.Minute), nil)
	if err != nil {
		t.Fatalf("restore at 51m: %v", err)
	}
	if got := backuptest.ReadTable(t, filepath.Join(out, "2.jsonl")); fmt.Sprint(got) != fmt.Sprint(nine) {
		t.Errorf("table 2 at 51m, inside its final window = %v, want %v", got, nine)
	}
	_, _, events, err = restore(t, e.Source(), flowF, e.TS(60*time.Minute), nil)
	if left := leftOut(events); err != nil || len(left) != 1 || left[0].Removing || len(left[0].Windows) != 1 {
		t.Errorf("at 60m after the removal is final: %v, left out %+v; want table 2 outside its window", err, left)
	}
}
