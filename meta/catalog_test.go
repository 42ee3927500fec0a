package meta_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/meta"
)

// catalogRev reads flow id's catalog revision and whether it is dirty.
func catalogRev(t *testing.T, s *meta.Store, rdb *redis.Client, id meta.FlowID) (uint64, bool) {
	t.Helper()
	ctx := context.Background()
	v, err := rdb.HGet(ctx, s.Keys().CatalogRev(id), "rev").Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	rev, _ := strconv.ParseUint(v, 10, 64)
	dirty, err := rdb.SIsMember(ctx, s.Keys().CatalogDirty(), strconv.FormatUint(uint64(id), 10)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return rev, dirty
}

// Every change of a flow's catalog content moves its catalog revision and
// makes it dirty in the same transaction, and nothing else does: the
// commits and checkpoint advances of cycles leave it alone, so that idle
// flows cost a cycle nothing.
func TestCatalogRevisionFollowsContent(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	const topic = "apply"
	lease, err := s.AcquireLease(ctx, topic, 0, "m")
	if err != nil {
		t.Fatal(err)
	}
	var id meta.FlowID
	next := int64(0)
	apply := func(op string, tables ...uint32) {
		t.Helper()
		next++
		a, err := s.ApplyDDL(ctx, meta.DDL{Op: op, Flow: meta.FlowInfo{FlowName: "f", SourceTableIDs: tables}}, meta.DDLPosition{Topic: "ddl", Partition: 2, NextOffset: next})
		if err != nil {
			t.Fatal(err)
		}
		id = a.FlowID
	}
	steps := []struct {
		name    string
		do      func()
		changes bool
	}{
		{"create", func() { apply("create", 1) }, true},
		{"a cycle's commit", func() {
			err := s.Commit(ctx, meta.Commit{Leases: []meta.Lease{lease}, Flows: []meta.FlowID{id}, LastFlushTS: 7,
				Metas:      []meta.MetaRef{{FlowID: id, Path: "backup/v2/meta/x.meta", MinResolvedTS: 5}},
				Partitions: []meta.PartitionCommit{{Topic: topic, Partition: 0, NextOffset: 3, Checkpoint: 9, HasCheckpoint: true}},
				Coverage:   []meta.CoverageReport{{FlowID: id, Seq: 1, Topic: topic, Partition: 0, Since: meta.CoverageValue{TS: 4}, Until: meta.CoverageValue{TS: 4}}}})
			if err != nil {
				t.Fatal(err)
			}
		}, false},
		{"a checkpoint advance", func() {
			if _, _, err := s.AdvanceCheckpoints(ctx, []meta.FlowID{id}, 9, 1<<62); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"finalisation", func() {
			if n, err := s.FinalizeCoverage(ctx, topic, []int32{0}); err != nil || n != 1 {
				t.Fatalf("finalize: %d, %v", n, err)
			}
		}, true},
		{"finalisation with nothing to finalise", func() {
			if _, err := s.FinalizeCoverage(ctx, topic, []int32{0}); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"replace", func() { apply("replace", 1, 2) }, true},
		{"resume of an active flow", func() { apply("resume") }, false},
		{"resume of a fatal flow", func() {
			if err := s.SetFlowFatal(ctx, id, "x"); err != nil {
				t.Fatal(err)
			}
			apply("resume")
		}, true},
		{"snapshot listed", func() {
			if err := s.AddSnapshot(ctx, id, snapPath(id, 100)); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"truncate", func() {
			_, err := s.Truncate(ctx, id, meta.SnapshotRef{FlowID: id, TS: 100, Path: snapPath(id, 100)}, func(context.Context, []meta.MetaRef, []meta.SnapshotRef) (meta.TruncateDrop, error) {
				return meta.TruncateDrop{Metas: []string{"backup/v2/meta/x.meta"}}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}, true},
		{"drop", func() { apply("drop") }, true},
	}
	var rev uint64
	for _, st := range steps {
		if _, err := s.CatalogWritten(ctx, id, rev); err != nil { // clean before each step
			t.Fatal(err)
		}
		st.do()
		got, dirty := catalogRev(t, s, rdb, id)
		if st.changes && (got <= rev || !dirty) { // finalisation moves it once per MULTI it writes
			t.Fatalf("%s: rev %d (dirty %v), want past %d and dirty", st.name, got, dirty, rev)
		}
		if !st.changes && (got != rev || dirty) {
			t.Fatalf("%s: rev %d (dirty %v), want it left at %d, clean", st.name, got, dirty, rev)
		}
		rev = got
	}
	cs, err := s.CatalogState(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if cs.Exists || !cs.HasInfo || cs.Info.FlowName != "f" || !slices.Equal(cs.Info.SourceTableIDs, []uint32{1, 2}) || cs.CheckpointTS != 9 {
		t.Errorf("state of the dropped flow: %+v, want its last definition and checkpoint", cs)
	}
	if cs.DDL == nil || *cs.DDL != (meta.DDLPosition{Topic: "ddl", Partition: 2, NextOffset: next}) {
		t.Errorf("DDL position %+v, want the drop's (ddl/2 next %d)", cs.DDL, next)
	}
	if cs.Rev != rev || len(cs.Windows) != 1 || cs.TruncatedBefore != 100 || len(cs.Pending) != 2 {
		t.Fatalf("state %+v, want rev %d, table 1's window, truncated before 100, the replace's and drop's pending steps", cs, rev)
	}
	if p := cs.Pending; !slices.Equal(p[0].Added, []uint32{2}) || len(p[0].Removed) != 0 || len(p[1].Added) != 0 || !slices.Equal(p[1].Removed, []uint32{1, 2}) {
		t.Errorf("pending steps %+v, want the replace adding table 2 and the drop removing 1 and 2", cs.Pending)
	}
}

// A catalog upload is recorded only at the revision it read: a change in
// between keeps the flow dirty for the next writer.
func TestCatalogWrittenOnlyAtItsRevision(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	a, err := s.ApplyDDL(ctx, meta.DDL{Op: "create", Flow: meta.FlowInfo{FlowName: "f", SourceTableIDs: []uint32{1}}}, meta.DDLPosition{Topic: "ddl", NextOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	read, err := s.CatalogState(ctx, a.FlowID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ApplyDDL(ctx, meta.DDL{Op: "replace", Flow: meta.FlowInfo{FlowName: "f", SourceTableIDs: []uint32{2}}}, meta.DDLPosition{Topic: "ddl", NextOffset: 2}); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.CatalogWritten(ctx, a.FlowID, read.Rev); err != nil || ok {
		t.Fatalf("recorded rev %d written after a change moved it on: %v, %v", read.Rev, ok, err)
	}
	if rev, dirty := catalogRev(t, s, rdb, a.FlowID); !dirty || rev != read.Rev+1 {
		t.Fatalf("rev %d dirty %v, want %d and dirty", rev, dirty, read.Rev+1)
	}
	if ok, err := s.CatalogWritten(ctx, a.FlowID, read.Rev+1); err != nil || !ok {
		t.Fatalf("recording the current rev: %v, %v", ok, err)
	}
	if _, dirty := catalogRev(t, s, rdb, a.FlowID); dirty {
		t.Fatal("still dirty after its current rev was written")
	}
	if v, _ := rdb.Get(ctx, s.Keys().CatalogWritten(a.FlowID)).Result(); v != strconv.FormatUint(read.Rev+1, 10) {
		t.Fatalf("catalog:written = %q", v)
	}
	if err := s.SkipCatalogRev(ctx, a.FlowID, read.Rev+1); err != nil {
		t.Fatal(err)
	}
	if rev, dirty := catalogRev(t, s, rdb, a.FlowID); !dirty || rev != read.Rev+2 {
		t.Fatalf("after a skip: rev %d dirty %v, want %d and dirty", rev, dirty, read.Rev+2)
	}
}

// Flows of a Redis that an older version wrote (no catalog revisions) are
// made dirty once, the dropped ones with a backup included.
func TestInitCatalogsMarksOlderFlowsOnce(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	info, routes := testFlow()
	if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, s.Keys().Metas(20), redis.Z{Score: 1, Member: "p/default/gone/v1/backupmeta/x.meta"}).Err(); err != nil {
		t.Fatal(err)
	}
	keys, _ := rdb.Keys(ctx, s.Keys().Base()+"catalog:*").Result()
	if err := rdb.Del(ctx, keys...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.InitCatalogs(ctx); err != nil {
		t.Fatal(err)
	}
	dirty, err := s.DirtyCatalogs(ctx)
	slices.Sort(dirty)
	if err != nil || !slices.Equal(dirty, []meta.FlowID{10, 20}) {
		t.Fatalf("dirty after init: %v (%v), want the live flow and the dropped one with metas", dirty, err)
	}
	for _, id := range dirty {
		if _, err := s.CatalogWritten(ctx, id, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.InitCatalogs(ctx); err != nil {
		t.Fatal(err)
	}
	if dirty, _ := s.DirtyCatalogs(ctx); len(dirty) != 0 {
		t.Fatalf("a second init made %v dirty again", dirty)
	}
}

// One transaction advances every live flow and the global checkpoint:
// forward only, never past the ceiling, a stored value past it replaced,
// a missing flow left alone.
func TestAdvanceCheckpoints(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	for _, id := range []meta.FlowID{1, 2} {
		info, routes := testFlow()
		info.FlowName = "f" + strconv.Itoa(int(id))
		if err := s.CreateFlow(ctx, id, info, routes); err != nil {
			t.Fatal(err)
		}
	}
	k := s.Keys()
	if err := rdb.HSet(ctx, k.FlowState(2), "checkpoint_ts", "500").Err(); err != nil {
		t.Fatal(err)
	}
	adv, g, err := s.AdvanceCheckpoints(ctx, []meta.FlowID{1, 2, 3}, 100, 1000)
	if err != nil || !slices.Equal(adv, []meta.FlowID{1}) || g != 100 {
		t.Fatalf("advance to 100: %v global %d (%v), want flow 1 moved, global 100", adv, g, err)
	}
	if n, _ := rdb.Exists(ctx, k.FlowState(3)).Result(); n != 0 {
		t.Fatal("a missing flow got a state")
	}
	if adv, g, err = s.AdvanceCheckpoints(ctx, []meta.FlowID{1, 2}, 50, 1000); err != nil || len(adv) != 0 || g != 100 {
		t.Fatalf("advance to 50: %v global %d (%v), want nothing moved back", adv, g, err)
	}
	if err := rdb.Set(ctx, k.GlobalCheckpoint(), "99999", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if adv, g, err = s.AdvanceCheckpoints(ctx, []meta.FlowID{1, 2}, 600, 1000); err != nil || !slices.Equal(adv, []meta.FlowID{1, 2}) || g != 600 {
		t.Fatalf("advance to 600: %v global %d (%v), want both flows and the global (stored past the ceiling) at 600", adv, g, err)
	}
	if got, ok, err := s.GlobalCheckpointTS(ctx); err != nil || !ok || got != 600 {
		t.Fatalf("global checkpoint %d %v %v", got, ok, err)
	}
}
