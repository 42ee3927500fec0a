package meta_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/meta"
)

func snapPath(id meta.FlowID, ts uint64) string {
	return fmt.Sprintf("p/default/f/v1/snapshot/%020d-%d/snapshot.meta", ts, id)
}

func TestTruncate(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	const id = meta.FlowID(3)
	k := s.Keys()
	for i, p := range []string{"m1", "m2", "m3"} {
		if err := rdb.ZAdd(ctx, k.Metas(id), redis.Z{Score: float64(i), Member: p}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	old, snap := snapPath(id, 100), snapPath(id, 200)
	dropAll := func(context.Context, []meta.MetaRef, []meta.SnapshotRef) (meta.TruncateDrop, error) {
		return meta.TruncateDrop{Metas: []string{"m1"}}, nil
	}
	if _, err := s.Truncate(ctx, id, meta.SnapshotRef{FlowID: id, TS: 200, Path: snap}, dropAll); !errors.Is(err, meta.ErrSnapshotNotListed) {
		t.Fatalf("Truncate at an unlisted snapshot: %v, want ErrSnapshotNotListed", err)
	}
	if _, ok, _ := s.TruncatedBefore(ctx, id); ok {
		t.Fatal("a refused truncate set truncated_before")
	}
	for _, p := range []string{old, snap} {
		if err := s.AddSnapshot(ctx, id, p); err != nil {
			t.Fatal(err)
		}
	}

	// The plan sees what the transaction read; a cycle committed while it
	// decides makes the transaction run it again on the new list.
	calls := 0
	var seen [][]string
	plan := func(ctx context.Context, metas []meta.MetaRef, snaps []meta.SnapshotRef) (meta.TruncateDrop, error) {
		calls++
		var paths []string
		for _, m := range metas {
			paths = append(paths, m.Path)
		}
		seen = append(seen, paths)
		if calls == 1 {
			if err := rdb.ZAdd(ctx, k.Metas(id), redis.Z{Score: 9, Member: "m4"}).Err(); err != nil {
				return meta.TruncateDrop{}, err
			}
		}
		if len(snaps) != 2 {
			return meta.TruncateDrop{}, fmt.Errorf("plan saw snapshots %v", snaps)
		}
		return meta.TruncateDrop{Metas: []string{"m1", "m2", "never-listed"}, Snapshots: []string{old}}, nil
	}
	done, err := s.Truncate(ctx, id, meta.SnapshotRef{FlowID: id, TS: 200, Path: snap}, plan)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 || !slices.Contains(seen[1], "m4") {
		t.Errorf("plan calls = %d, lists seen %v; want a second call that sees m4", calls, seen)
	}
	if fmt.Sprint(done.Metas) != "[m1 m2]" || fmt.Sprint(done.Snapshots) != fmt.Sprint([]string{old}) {
		t.Errorf("Truncate removed %+v, want m1 m2 and the older snapshot", done)
	}
	left, err := rdb.ZRange(ctx, k.Metas(id), 0, -1).Result()
	if err != nil || fmt.Sprint(left) != "[m3 m4]" {
		t.Errorf("metas after truncate = %v, %v; want [m3 m4]", left, err)
	}
	snaps, err := s.Snapshots(ctx, id)
	if err != nil || len(snaps) != 1 || snaps[0].Path != snap {
		t.Errorf("snapshots after truncate = %+v, %v; want only %s", snaps, err, snap)
	}
	if ts, ok, err := s.TruncatedBefore(ctx, id); err != nil || !ok || ts != 200 {
		t.Errorf("TruncatedBefore = %d, %v, %v; want 200", ts, ok, err)
	}

	// Again at the same snapshot: nothing left to drop, nothing changes.
	if done, err := s.Truncate(ctx, id, meta.SnapshotRef{FlowID: id, TS: 200, Path: snap}, dropAll); err != nil || len(done.Metas) != 0 {
		t.Errorf("repeated Truncate = %+v, %v; want nothing removed", done, err)
	}
	// Never backwards: a truncate at an older snapshot is refused.
	if err := s.AddSnapshot(ctx, id, old); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Truncate(ctx, id, meta.SnapshotRef{FlowID: id, TS: 100, Path: old}, dropAll); !errors.Is(err, meta.ErrTruncatedPast) {
		t.Errorf("Truncate below truncated_before: %v, want ErrTruncatedPast", err)
	}
	if ts, _, _ := s.TruncatedBefore(ctx, id); ts != 200 {
		t.Errorf("truncated_before moved back to %d", ts)
	}
	// A plan may not drop the snapshot it truncates at, or a newer one.
	bad := func(context.Context, []meta.MetaRef, []meta.SnapshotRef) (meta.TruncateDrop, error) {
		return meta.TruncateDrop{Snapshots: []string{snap}}, nil
	}
	if _, err := s.Truncate(ctx, id, meta.SnapshotRef{FlowID: id, TS: 200, Path: snap}, bad); err == nil {
		t.Error("Truncate let a plan drop the snapshot it truncates at")
	}
}

func TestBackupIDs(t *testing.T) {
	ctx := context.Background()
	rdb := startRedis(t).Client(t)
	s := meta.NewStore(rdb, "a[b]*", nil)
	other := meta.NewStore(rdb, "a", nil)
	k := s.Keys()
	for _, key := range []string{k.Metas(5), k.Metas(12), k.Coverage(40), other.Keys().Metas(77)} {
		if err := rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "x"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddSnapshot(ctx, 9, snapPath(9, 100)); err != nil {
		t.Fatal(err)
	}
	ids, err := s.BackupIDs(ctx)
	if err != nil || fmt.Sprint(ids) != "[5 9 12]" {
		t.Fatalf("BackupIDs = %v, %v; want [5 9 12] (not the other prefix's 77, not coverage-only 40)", ids, err)
	}
	if err := rdb.SAdd(ctx, k.Flows(), "3").Err(); err != nil {
		t.Fatal(err)
	}
	ids, err = s.KnownFlowIDs(ctx)
	if err != nil || fmt.Sprint(ids) != "[3 5 9 12 40]" {
		t.Fatalf("KnownFlowIDs = %v, %v; want [3 5 9 12 40]", ids, err)
	}
}
