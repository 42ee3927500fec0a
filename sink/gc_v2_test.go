package sink_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// gc of layout v2: a shared cycle stays while any flow lists its meta; a
// cycle of another consumer group, the global checkpoint object and the
// newest catalog of each flow id are never deleted; older catalogs and
// unlisted cycles go once older than the grace.
func TestPlanGCV2(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	now := time.Now()
	old := now.Add(-2 * time.Hour)
	const base = 1 << 40
	evs := sharedEvents(base)
	cycle := func(id, group string, created time.Time) (sink.Meta, string) {
		m, p := sinktest.WriteCycleV2(t, b, sinktest.CycleV2{Prefix: "pre", CycleID: id, Group: group, ResolvedTS: base, Flows: sharedFlows, Entries: evs})
		b.SetCreated(m.DataPath, created)
		b.SetCreated(p, created)
		return m, p
	}
	shared, sharedPath := cycle("1-0-aa", "flowlog", old)     // listed by flow 2 only (flow 1 truncated it away)
	unlisted, unlistedPath := cycle("2-0-bb", "flowlog", old) // a fenced or crashed cycle
	young, youngPath := cycle("3-0-cc", "flowlog", old)       // unlisted, meta young
	b.SetCreated(youngPath, now)
	foreign, foreignPath := cycle("4-0-dd", "blue", old) // another deployment on the prefix
	crashed := sink.DataPathV2("pre", "sinktest", base, "5-0-ee")
	put(t, b, crashed, old) // a data object whose meta never made it
	ckpt := sink.CheckpointPathV2("pre", "flowlog")
	put(t, b, ckpt, old)
	var catalogs []string
	for rev := uint64(1); rev <= 3; rev++ {
		c := sink.CatalogPath("pre", "default", "a", "flowlog", 1, rev)
		put(t, b, c, old)
		catalogs = append(catalogs, c)
	}
	youngCatalog := sink.CatalogPath("pre", "default", "b", "flowlog", 2, 1)
	put(t, b, youngCatalog, now)
	put(t, b, sink.CatalogPath("pre", "default", "b", "flowlog", 2, 2), now)
	blueCatalog := sink.CatalogPath("pre", "default", "a", "blue", 1, 1)
	put(t, b, blueCatalog, old)

	plan, err := sink.PlanGC(ctx, b, sink.GCOptions{Prefix: "pre", Group: "flowlog", Grace: time.Hour, Now: func() time.Time { return now }, Parallel: 4,
		Refs: func(context.Context) (sink.GCRefs, error) {
			return sink.GCRefs{Metas: []string{sharedPath, sharedPath}, KnownIDs: map[uint32]bool{1: true, 2: true, 3: true}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range plan.Delete {
		got = append(got, o.Name)
	}
	slices.Sort(got)
	want := []string{unlisted.DataPath, unlistedPath, crashed, catalogs[0], catalogs[1]}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("PlanGC deletes %v\nwant %v", got, want)
	}
	if plan.Unknown != 3 || plan.Young != 3 || plan.Kept != 1 || len(plan.Warnings) != 0 {
		t.Errorf("unknown %d (want 3: the blue cycle and catalog), young %d (want 3: cycle 3, the older catalog of flow 2), kept %d (want 1: the checkpoint), warnings %v",
			plan.Unknown, plan.Young, plan.Kept, plan.Warnings)
	}
	if st := plan.Storage[sink.GCShared]; st == nil || st.LogBytes == 0 || st.GarbageBytes == 0 {
		t.Errorf("v2 storage = %+v, want log and garbage bytes", st)
	}
	if _, _, err := sink.DeleteObjects(ctx, b, plan.Delete, 2, nil); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{shared.DataPath, sharedPath, young.DataPath, youngPath, foreign.DataPath, foreignPath, ckpt, catalogs[2], youngCatalog, blueCatalog} {
		if _, err := b.Size(ctx, name); err != nil {
			t.Errorf("%s: %v, want kept", name, err)
		}
	}

	// Once no flow lists it, the shared cycle goes too.
	plan, err = sink.PlanGC(ctx, b, sink.GCOptions{Prefix: "pre", Group: "flowlog", Grace: time.Hour, Now: func() time.Time { return now },
		Refs: func(context.Context) (sink.GCRefs, error) {
			return sink.GCRefs{KnownIDs: map[uint32]bool{1: true}}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, o := range plan.Delete {
		got = append(got, o.Name)
	}
	slices.Sort(got)
	want = []string{shared.DataPath, sharedPath}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("with no flow listing it, PlanGC deletes %v\nwant %v", got, want)
	}
}
