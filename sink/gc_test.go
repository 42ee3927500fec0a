package sink_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

func put(t *testing.T, b *sink.MemBucket, name string, created time.Time) {
	t.Helper()
	body := []byte(name)
	if err := b.Upload(context.Background(), sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
		t.Fatal(err)
	}
	b.SetCreated(name, created)
}

func TestPlanGC(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	now := time.Now()
	old := now.Add(-2 * time.Hour)
	cycle := func(id string, created time.Time) (sink.Meta, string) {
		m, p := sinktest.WriteCycle(t, b, sinktest.Cycle{Prefix: "pre", Catalog: "default", Flow: "f", FlowID: 1, CycleID: id, ResolvedTS: 100,
			Entries: []sinktest.Entry{sinktest.WritePut(1, 1, 90, 95, []byte("v"), true)}})
		b.SetCreated(m.DataPath, created)
		b.SetCreated(p, created)
		return m, p
	}
	refA, refAPath := cycle("a", old)     // listed
	zombie, zombiePath := cycle("b", old) // never listed: garbage
	young, youngPath := cycle("c", old)   // unlisted, but its meta is young
	b.SetCreated(youngPath, now.Add(-time.Minute))

	dir := sink.FlowDir("pre", "default", "f")
	listedSnap := sink.SnapshotMetaPath("pre", "default", "f", 1, 100)
	sm, err := sink.EncodeSnapshotMeta(sink.SnapshotMeta{Version: 1, Flow: "default/f", FlowID: 1, TS: 100,
		Tables: []sink.SnapshotTable{{TableID: 1, DataPath: sink.SnapshotTablePath("pre", "default", "f", 1, 100, 1), Since: 50}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(ctx, sink.Object{Name: listedSnap, Body: bytes.NewReader(sm), Size: int64(len(sm)), CRC32C: sink.CRC32C(sm)}); err != nil {
		t.Fatal(err)
	}
	b.SetCreated(listedSnap, old)
	put(t, b, sink.SnapshotTablePath("pre", "default", "f", 1, 100, 1), old)
	halfSnap := sink.SnapshotTablePath("pre", "default", "f", 1, 200, 1) // unlisted, old
	put(t, b, halfSnap, old)
	runningSnap := sink.SnapshotTablePath("pre", "default", "f", 1, 300, 1) // unlisted, one object young
	put(t, b, runningSnap, old)
	put(t, b, sink.SnapshotTablePath("pre", "default", "f", 1, 300, 2), now)
	put(t, b, sink.CheckpointPath("pre", "default", "f", "g", 1), old)
	put(t, b, dir+"/README", old)
	put(t, b, "elsewhere/default/f/v1/backupmeta/00000000000000000001-1-x.meta", old)

	var late string
	plan, err := sink.PlanGC(ctx, b, sink.GCOptions{Prefix: "pre", Grace: time.Hour, Now: func() time.Time { return now }, Parallel: 4,
		Refs: func(ctx context.Context) (sink.GCRefs, error) {
			// A cycle uploaded and committed after the listing: not
			// listed, so never deleted by this run.
			_, late = cycle("d", old)
			return sink.GCRefs{Metas: []string{refAPath}, Snapshots: []string{listedSnap}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range plan.Delete {
		got = append(got, o.Name)
	}
	slices.Sort(got)
	want := []string{zombie.DataPath, zombiePath, halfSnap}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("PlanGC deletes %v\nwant %v", got, want)
	}
	if plan.Young != 4 || plan.Kept != 2 || len(plan.Warnings) != 0 {
		t.Errorf("plan: young %d (want 4: cycle c and snapshot 300), kept %d (want 2: checkpoint, README), warnings %v", plan.Young, plan.Kept, plan.Warnings)
	}
	st := plan.Storage["default/f"]
	if st == nil || st.LogBytes == 0 || st.SnapshotBytes == 0 || st.GarbageBytes == 0 {
		t.Errorf("storage = %+v, want log, snapshot and garbage bytes", st)
	}
	n, _, err := sink.DeleteObjects(ctx, b, plan.Delete, 2, nil)
	if err != nil || n != 3 {
		t.Fatalf("DeleteObjects = %d, %v", n, err)
	}
	for _, name := range []string{refA.DataPath, refAPath, young.DataPath, youngPath, late, listedSnap, runningSnap} {
		if _, err := b.Size(ctx, name); err != nil {
			t.Errorf("%s: %v, want kept", name, err)
		}
	}

	// A listed meta that names a data object outside its cycle's name
	// keeps that object too; a listed meta that is missing is a warning.
	odd := dir + "/20260101/00/5-1-other.log"
	put(t, b, odd, old)
	m := refA
	m.DataPath = odd
	m.CycleID = "e"
	mb, _ := sink.EncodeMeta(m)
	oddMeta := dir + "/backupmeta/00000000000000000100-1-e.meta"
	if err := b.Upload(ctx, sink.Object{Name: oddMeta, Body: bytes.NewReader(mb), Size: int64(len(mb)), CRC32C: sink.CRC32C(mb)}); err != nil {
		t.Fatal(err)
	}
	b.SetCreated(oddMeta, old)
	// Objects of a flow id Redis never had belong to another deployment.
	other := dir + "/backupmeta/00000000000000000100-2-x.meta"
	put(t, b, other, old)
	plan, err = sink.PlanGC(ctx, b, sink.GCOptions{Prefix: "pre", Grace: time.Hour, Now: func() time.Time { return now },
		Refs: func(context.Context) (sink.GCRefs, error) {
			return sink.GCRefs{Metas: []string{refAPath, oddMeta, dir + "/backupmeta/00000000000000000100-1-gone.meta"},
				KnownIDs: map[uint32]bool{1: true}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Unknown != 1 {
		t.Errorf("plan.Unknown = %d, want 1 (flow id 2)", plan.Unknown)
	}
	for _, o := range plan.Delete {
		if o.Name == odd || o.Name == refA.DataPath || o.Name == other {
			t.Errorf("PlanGC deletes %s, which a listed meta references", o.Name)
		}
	}
	if len(plan.Warnings) != 1 {
		t.Errorf("warnings = %v, want one for the missing listed meta", plan.Warnings)
	}
}
