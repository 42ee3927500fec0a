package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// snapshot takes a snapshot of flow default/f as of ts (0: the checkpoint).
func snapshot(t *testing.T, e *backuptest.Env, ts uint64) (backup.SnapshotResult, []backup.Event, error) {
	t.Helper()
	var events []backup.Event
	res, err := backup.Snapshot(context.Background(), e.Source(), e.Store, backup.SnapshotRequest{
		Request: backup.Request{Flow: flowF, TS: ts, MaxClockSkew: backuptest.Skew, Notify: func(ev backup.Event) { events = append(events, ev) }},
		TempDir: t.TempDir(),
	})
	return res, events, err
}

// TestSnapshot takes a snapshot at the checkpoint and checks that it is
// listed and its objects exist, that a second one at the same ts does
// nothing, that a restore after more commits starts from it and equals the
// restore from the log alone, and that once a truncation point is recorded
// restores and snapshots below it are refused.
func TestSnapshot(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	snapTS := e.TS(50 * time.Minute)
	res, events, err := snapshot(t, e, 0)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	wantPath := fmt.Sprintf("pre/default/f/v1/snapshot/%020d-1/snapshot.meta", snapTS)
	if res.TS != snapTS || res.Existing != "" || res.Stats.MetaPath != wantPath || res.Stats.Tables != 2 || res.Stats.Keys != 2 || res.Stats.Objects != 3 {
		t.Fatalf("snapshot result %+v, want 2 tables, 2 keys and 3 objects at %s", res, wantPath)
	}
	if n := len(events); n == 0 || events[n-1] != (backup.Snapshotting{Flow: res.Flow, TS: snapTS, Tables: 2, Metas: 2}) {
		t.Errorf("events %+v, want Snapshotting last", events)
	}
	refs, err := e.Store.Snapshots(ctx, 1)
	if err != nil || len(refs) != 1 || refs[0].TS != snapTS || refs[0].Path != wantPath {
		t.Fatalf("snapshots listed = %+v, %v; want one at %d", refs, err, snapTS)
	}
	dir := strings.TrimSuffix(wantPath, "snapshot.meta")
	for _, name := range []string{wantPath, dir + "1.snap", dir + "2.snap"} {
		if _, err := e.Bucket.Size(ctx, name); err != nil {
			t.Errorf("snapshot object %s: %v", name, err)
		}
	}
	if again, _, err := snapshot(t, e, 0); err != nil || again.Existing != wantPath || again.Stats.Objects != 0 {
		t.Fatalf("second snapshot at the same ts = %+v, %v; want the existing one and nothing written", again, err)
	}

	e.Commit(t, e.TS(58*time.Minute), sinktest.WritePut(1, 2, e.TS(54*time.Minute), e.TS(55*time.Minute), []byte("after"), true))
	withSnap, rs, _, err := restore(t, e.Source(), flowF, 0, nil)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if rs.Stats.FromSnapshot != 2 || rs.Stats.SnapshotTS != snapTS {
		t.Fatalf("restore stats %+v, want both tables from the snapshot at %d", rs.Stats, snapTS)
	}
	want := []string{backuptest.Row(1, 1, "late", e.TS(48*time.Minute)), backuptest.Row(1, 2, "after", e.TS(55*time.Minute))}
	if got := backuptest.ReadTable(t, filepath.Join(withSnap, "1.jsonl")); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table 1 = %v, want %v", got, want)
	}
	logOnly := filepath.Join(t.TempDir(), "log")
	rs, err = backup.Restore(ctx, e.Source(), backup.RestoreRequest{Request: backup.Request{Flow: flowF, MaxClockSkew: backuptest.Skew},
		LogOnly: true, OutDir: logOnly, TempDir: t.TempDir()})
	if err != nil || rs.Stats.FromSnapshot != 0 {
		t.Fatalf("restore from the log alone: %+v, %v", rs.Stats, err)
	}
	for _, f := range []string{"1.jsonl", "2.jsonl"} {
		a, _ := os.ReadFile(filepath.Join(withSnap, f))
		b, _ := os.ReadFile(filepath.Join(logOnly, f))
		if string(a) != string(b) || len(a) == 0 {
			t.Fatalf("%s: %q with the snapshot, %q from the log alone", f, a, b)
		}
	}

	// A truncation point as truncate records it.
	if err := e.Redis.Client(t).Set(ctx, meta.NewKeys("flowlog").TruncatedBefore(1), fmt.Sprint(snapTS), 0).Err(); err != nil {
		t.Fatal(err)
	}
	below := e.TS(20 * time.Minute)
	var te *backup.TruncatedError
	if _, _, _, err := restore(t, e.Source(), flowF, below, nil); !errors.As(err, &te) || te.Table != -1 || te.TS != below || te.TruncatedBefore != snapTS {
		t.Fatalf("restore below the truncation point = %v, want a *backup.TruncatedError at %d", err, snapTS)
	}
	if _, _, err := snapshot(t, e, below); !errors.As(err, &te) || te.TruncatedBefore != snapTS {
		t.Fatalf("snapshot below the truncation point = %v, want a *backup.TruncatedError at %d", err, snapTS)
	}
}
