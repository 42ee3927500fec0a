package backup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

var flow1 = backup.Flow{ID: 1, Catalog: "default", Name: "f"}

// truncate plans and commits a truncate of h's flow before until and
// deletes what it unreferenced, as consumer truncate does.
func truncate(t *testing.T, h *backuptest.History, until uint64) (*backup.TruncatePlan, backup.Committed) {
	t.Helper()
	ctx := context.Background()
	plan, err := backup.PlanTruncate(ctx, h.Source(), flow1, until, 4)
	if err != nil {
		t.Fatalf("plan truncate before %d: %v", until, err)
	}
	done, err := plan.Commit(ctx, h.Store)
	if err != nil {
		t.Fatalf("commit truncate before %d: %v", until, err)
	}
	if _, _, err := sink.DeleteObjects(ctx, h.Bucket, done.Objects, 4, nil); err != nil {
		t.Fatalf("delete: %v", err)
	}
	return plan, done
}

// TestTruncate: after a truncate, a restore at any ts at or above the
// snapshot writes byte for byte what it wrote before (prewritten values of
// later commits included) and below it is refused; a truncate needs a
// listed snapshot, plans without changing anything, removes the older
// snapshots, and a second one removes nothing.
func TestTruncate(t *testing.T) {
	ctx := context.Background()
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "t1", 7, 40, 10)
	s := h.MS(40*50*6/10+17, 0) // inside a cycle, 60% into the history
	until := s + 1000

	var ns *backup.NoSnapshotError
	if _, err := backup.PlanTruncate(ctx, h.Source(), flow1, until, 4); !errors.As(err, &ns) || ns.Oldest != 0 || ns.Until != until {
		t.Fatalf("truncate without a snapshot = %v, want a *backup.NoSnapshotError", err)
	}
	old := h.MS(300, 0)
	h.Snapshot(t, old)
	h.Snapshot(t, s)
	if _, err := backup.PlanTruncate(ctx, h.Source(), flow1, old-1, 4); !errors.As(err, &ns) || ns.Oldest != old {
		t.Fatalf("truncate below the oldest snapshot = %v, want a *backup.NoSnapshotError naming it", err)
	}
	base := h.Baseline(t, h.RestoreTSs(s)...)
	before, listed := h.StoredBytes(t), len(h.ListedMetas(t))

	plan, err := backup.PlanTruncate(ctx, h.Source(), flow1, until, 4)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Snapshot.TS != s || len(plan.Snapshots) != 1 || plan.Snapshots[0].TS != old || plan.Listed != listed ||
		len(plan.Metas) == 0 || plan.Kept+len(plan.Metas) != listed || plan.KeptOld[sink.TruncateKeepDefault] == 0 {
		t.Fatalf("plan: snapshot %+v, older %+v, %d of %d metas removed, %d kept (%v); want some kept for prewritten values",
			plan.Snapshot, plan.Snapshots, len(plan.Metas), plan.Listed, plan.Kept, plan.KeptOld)
	}
	objs, warnings := plan.Objects(ctx)
	if len(objs) == 0 || len(warnings) != 0 || h.StoredBytes(t) != before {
		t.Fatalf("plan objects %d, warnings %v; stored %d -> %d bytes: planning must change nothing", len(objs), warnings, before, h.StoredBytes(t))
	}
	// The plan's sizes are the objects' (the snapshot.meta of the older
	// snapshot included), so that the printed plan says what it frees.
	for _, o := range objs {
		if size, err := h.Bucket.Size(ctx, o.Name); err != nil || size != o.Size || size == 0 {
			t.Errorf("plan lists %s (%s) at %d bytes; the bucket has %d (%v)", o.Name, o.Kind, o.Size, size, err)
		}
	}

	done, err := plan.Commit(ctx, h.Store)
	if err != nil {
		t.Fatal(err)
	}
	if len(done.Removed.Metas) != len(plan.Metas) || len(done.Removed.Snapshots) != 1 || len(done.Objects) == 0 {
		t.Fatalf("committed %+v of plan %d metas", done.Removed, len(plan.Metas))
	}
	if _, _, err := sink.DeleteObjects(ctx, h.Bucket, done.Objects, 4, nil); err != nil {
		t.Fatal(err)
	}
	if after := len(h.ListedMetas(t)); after != plan.Kept {
		t.Errorf("metas %d -> %d, want the %d kept", listed, after, plan.Kept)
	}
	if tb, ok, err := h.Store.TruncatedBefore(ctx, 1); err != nil || !ok || tb != s {
		t.Errorf("truncated_before = %d, %v, %v; want %d", tb, ok, err, s)
	}
	if snaps, _ := h.Store.Snapshots(ctx, 1); len(snaps) != 1 || snaps[0].TS != s {
		t.Errorf("snapshots after truncate = %+v, want only the one at %d", snaps, s)
	}
	for _, n := range h.ObjectNames(t) {
		if strings.Contains(n, fmt.Sprintf("/snapshot/%020d-", old)) {
			t.Errorf("the older snapshot's object %s is still there", n)
		}
	}
	h.CheckRestores(t, base)

	stored := h.StoredBytes(t)
	if again, done := truncate(t, h, until); len(again.Metas) != 0 || len(done.Objects) != 0 || h.StoredBytes(t) != stored {
		t.Errorf("second truncate removed %d metas, %d objects", len(again.Metas), len(done.Objects))
	}
	// A snapshot below the truncation point is refused; one listed there
	// anyway (as before the truncate) leaves truncate nothing to do.
	var te *backup.TruncatedError
	if _, err := backup.Snapshot(ctx, h.Source(), h.Store, backup.SnapshotRequest{
		Request: backup.Request{Flow: h.Flow, TS: old, MaxClockSkew: backuptest.Skew}, TempDir: t.TempDir()}); !errors.As(err, &te) || te.TruncatedBefore != s {
		t.Errorf("snapshot below the truncation point = %v, want a *backup.TruncatedError at %d", err, s)
	}
	if err := h.Store.AddSnapshot(ctx, 1, sink.SnapshotMetaPath(h.Prefix, "default", "f", 1, old)); err != nil {
		t.Fatal(err)
	}
	var tp *backup.TruncatedPastError
	if _, err := backup.PlanTruncate(ctx, h.Source(), flow1, old+1, 4); !errors.As(err, &tp) || tp.TruncatedBefore != s || tp.Snapshot != old {
		t.Errorf("truncate below the truncation point = %v, want a *backup.TruncatedPastError", err)
	}
}

// TestTruncateCommitPlansAgain: a cycle committed between the plan and the
// commit is seen by the commit, which plans on the lists it reads; and a
// truncate that another went past before its commit is refused.
func TestTruncateCommitPlansAgain(t *testing.T) {
	ctx := context.Background()
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "t2", 3, 20, 8)
	s1, s2 := h.MS(20*50/2, 0), h.MS(20*50*3/4, 0)
	h.Snapshot(t, s1)
	h.Snapshot(t, s2)
	plan, err := backup.PlanTruncate(ctx, h.Source(), flow1, s1, 4)
	if err != nil {
		t.Fatal(err)
	}
	listed, kept := plan.Listed, plan.Kept
	h.Commit(t, h.MS(20*50+50, 0), sinktest.WritePut(1, 1, h.MS(20*50+10, 1), h.MS(20*50+20, 0), []byte("new"), true))
	if _, err := plan.Commit(ctx, h.Store); err != nil {
		t.Fatal(err)
	}
	if plan.Listed != listed+1 || plan.Kept != kept+1 {
		t.Errorf("after a commit in between, the plan saw %d metas and kept %d; want %d and %d", plan.Listed, plan.Kept, listed+1, kept+1)
	}

	stale, err := backup.PlanTruncate(ctx, h.Source(), flow1, s1, 4)
	if err != nil {
		t.Fatal(err)
	}
	truncate(t, h, s2)
	var tp *backup.TruncatedPastError
	if _, err := stale.Commit(ctx, h.Store); !errors.As(err, &tp) || tp.TruncatedBefore != s2 || tp.Snapshot != s1 {
		t.Fatalf("commit of a truncate another went past = %v, want a *backup.TruncatedPastError", err)
	}
}

// TestTruncateNeedsWholeSnapshot: a snapshot that lacks a table whose
// coverage window holds its ts (cut from that window) cannot be truncated
// at: the log before it is that table's only copy.
func TestTruncateNeedsWholeSnapshot(t *testing.T) {
	ctx := context.Background()
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "t3", 5, 10, 6)
	s := h.MS(10*50/2, 0)
	h.Snapshot(t, s)
	// Table 5 joins with a window from 0: the snapshot at s does not hold it.
	if err := h.Redis.Client(t).HSet(ctx, meta.NewKeys(h.RedisPrefix).Coverage(1), "5", `{"since":0,"until":null}`).Err(); err != nil {
		t.Fatal(err)
	}
	var is *backup.IncompleteSnapshotError
	if _, err := backup.PlanTruncate(ctx, h.Source(), flow1, s, 4); !errors.As(err, &is) || is.Snapshot != s || len(is.Missing) != 1 || is.Missing[0].TableID != 5 {
		t.Fatalf("truncate at a snapshot without table 5 = %v, want an *IncompleteSnapshotError naming it", err)
	}
	if tb, ok, _ := h.Store.TruncatedBefore(ctx, 1); ok {
		t.Fatalf("the refused truncate recorded truncated_before %d", tb)
	}
}

// TestTruncateV2SharedCycles: truncating flow 1 of layout v2 cycles that
// flow 2 shares removes only flow 1's references and deletes none of the
// shared objects: flow 2's restores are untouched, flow 1's at or above the
// snapshot too, and gc, which sees flow 2 list every cycle, deletes nothing.
func TestTruncateV2SharedCycles(t *testing.T) {
	ctx := context.Background()
	h := backuptest.NewHistoryV2(t, testenv.StartRedis(t), testenv.StartGCS(t), "t3", 9, 30, 10)
	s := h.MS(30*50*6/10+17, 0)
	h.Snapshot(t, s)
	base := h.Baseline(t, h.RestoreTSs(s)...)
	other := sink.Flow{Prefix: h.Prefix, Catalog: "default", Name: "other", ID: 2}
	listed2, err := backup.MetaPaths(ctx, h.Store, 2)
	if err != nil || len(listed2) == 0 {
		t.Fatalf("flow 2's metas: %v, %v", listed2, err)
	}
	restore2 := func() string {
		out := t.TempDir()
		if _, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: h.Bucket, Flow: other, MetaPaths: listed2, TS: h.Checkpoint, OutDir: out, TempDir: t.TempDir()}); err != nil {
			t.Fatalf("restore of flow 2: %v", err)
		}
		return fmt.Sprint(backuptest.ReadDir(t, out))
	}
	want2 := restore2()
	objects := h.ObjectNames(t)

	plan, done := truncate(t, h, s)
	if len(plan.Metas) == 0 || len(done.Removed.Metas) != len(plan.Metas) {
		t.Fatalf("truncate removed %d of %d planned metas, want some", len(done.Removed.Metas), len(plan.Metas))
	}
	for _, o := range done.Objects {
		if _, _, v2 := sink.V2Unit(h.Prefix, o.Name); v2 {
			t.Errorf("truncate of flow 1 deletes %s, a cycle flow 2 lists too", o.Name)
		}
	}
	if after := h.ObjectNames(t); fmt.Sprint(after) != fmt.Sprint(objects) {
		t.Errorf("objects changed by the truncate of shared cycles:\nbefore %v\nafter  %v", objects, after)
	}
	if again, err := backup.MetaPaths(ctx, h.Store, 2); err != nil || fmt.Sprint(again) != fmt.Sprint(listed2) {
		t.Errorf("flow 2's metas after flow 1's truncate: %v, %v; want unchanged", again, err)
	}
	if got := restore2(); got != want2 {
		t.Errorf("flow 2 restores differently after flow 1's truncate")
	}
	h.CheckRestores(t, base)

	plan2, err := sink.PlanGC(ctx, h.Bucket, sink.GCOptions{Prefix: h.Prefix, Group: backuptest.Group, Refs: backup.GCRefs(h.Store)})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan2.Delete) != 0 {
		t.Errorf("gc after the truncate deletes %d objects, want none: flow 2 lists every cycle", len(plan2.Delete))
	}
}
