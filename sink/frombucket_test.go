package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// What the bucket alone says of a flow: its newest catalog per flow id,
// its name by id, its metas (v2 ones of its group that serve it, and its v1
// ones), and the group's checkpoint.
func TestFromBucketDiscovery(t *testing.T) {
	const base = 1 << 40
	ctx := context.Background()
	b := sink.NewMemBucket()
	evs := sharedEvents(base)
	_, p1 := sinktest.WriteCycleV2(t, b, sinktest.CycleV2{Prefix: "pre", CycleID: "2-0-aa", ResolvedTS: base + 2, Flows: sharedFlows, Entries: evs})
	_, p2 := sinktest.WriteCycleV2(t, b, sinktest.CycleV2{Prefix: "pre", CycleID: "1-0-bb", ResolvedTS: base + 1, Flows: sharedFlows[:2], Entries: only2(evs)})
	sinktest.WriteCycleV2(t, b, sinktest.CycleV2{Prefix: "pre", CycleID: "3-0-cc", Group: "blue", ResolvedTS: base, Flows: sharedFlows, Entries: evs})
	_, v1 := sinktest.WriteCycle(t, b, sinktest.Cycle{Prefix: "pre", Catalog: "default", Flow: "c", FlowID: 3, CycleID: "old", ResolvedTS: base - 5, Entries: only(evs, 3)})
	sinktest.WriteCycle(t, b, sinktest.Cycle{Prefix: "pre", Catalog: "default", Flow: "c", FlowID: 9, CycleID: "dropped", ResolvedTS: base - 9, Entries: only(evs, 3)})
	put := func(name string, body []byte) {
		if err := b.Upload(ctx, sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
			t.Fatal(err)
		}
	}
	put(sink.MetaPathV2("pre", "x", base, "junk"), []byte("not json")) // unreadable: listed by nobody

	cat := func(id uint32, name string, rev uint64, dropped bool) sink.Catalog {
		return sink.Catalog{Version: sink.CatalogVersion, Group: "flowlog", FlowID: id, Catalog: "default", Name: name, Rev: rev, Dropped: dropped, Info: []byte(`{}`)}
	}
	for rev := uint64(1); rev <= 3; rev++ {
		sinktest.WriteCatalog(t, b, "pre", cat(3, "c", rev, false))
	}
	sinktest.WriteCatalog(t, b, "pre", cat(9, "c", 5, true))
	blue := cat(3, "c", 7, false)
	blue.Group = "blue"
	sinktest.WriteCatalog(t, b, "pre", blue)
	lone := cat(4, "lone", 1, false) // a flow of v1 alone, named by its catalog only
	sinktest.WriteCatalog(t, b, "pre", lone)

	cats, err := sink.NewestCatalogs(ctx, b, "pre", "flowlog", "default", "c")
	if err != nil {
		t.Fatal(err)
	}
	if len(cats) != 2 || cats[3].Catalog.Rev != 3 || cats[3].Catalog.Dropped || !cats[9].Catalog.Dropped {
		t.Fatalf("NewestCatalogs = %+v, want flow 3 at rev 3 and dropped flow 9", cats)
	}
	// A catalog whose content is not what its name says is refused.
	moved := cat(5, "c", 1, false)
	raw, _ := sink.EncodeCatalog(moved)
	put(sink.CatalogPath("pre", "default", "c", "flowlog", 3, 4), raw)
	if _, err := sink.NewestCatalogs(ctx, b, "pre", "flowlog", "default", "c"); err == nil {
		t.Error("a catalog of flow 5 at flow 3's newest name was accepted")
	}

	for id, want := range map[uint32]string{1: "default/a", 3: "default/c", 4: "default/lone"} {
		c, n, err := sink.FindFlowName(ctx, b, "pre", "flowlog", id, 4)
		if err != nil || c+"/"+n != want {
			t.Errorf("FindFlowName(%d) = %s/%s, %v; want %s", id, c, n, err, want)
		}
	}
	if _, _, err := sink.FindFlowName(ctx, b, "pre", "flowlog", 77, 4); !errors.Is(err, sink.ErrNotExist) {
		t.Errorf("FindFlowName of an unknown id: %v", err)
	}

	for id, want := range map[uint32][]string{1: {p2, p1}, 3: {v1, p1}, 2: {p2, p1}} {
		f := sink.Flow{Prefix: "pre", Catalog: "default", Name: map[uint32]string{1: "a", 2: "b", 3: "c"}[id], ID: id}
		got, err := sink.FlowMetas(ctx, b, f, "flowlog", 3)
		if err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, m := range got {
			paths = append(paths, m.Path)
		}
		if fmt.Sprint(paths) != fmt.Sprint(want) {
			t.Errorf("FlowMetas(%d) = %v, want %v", id, paths, want)
		}
	}

	put(sink.CheckpointPathV2("pre", "flowlog"), sink.EncodeCheckpoint(base+7))
	if ts, err := sink.ReadCheckpoint(ctx, b, sink.CheckpointPathV2("pre", "flowlog")); err != nil || ts != base+7 {
		t.Errorf("ReadCheckpoint = %d, %v", ts, err)
	}
	if _, err := sink.ReadCheckpoint(ctx, b, sink.CheckpointPathV2("pre", "blue")); !errors.Is(err, sink.ErrNotExist) {
		t.Errorf("ReadCheckpoint of a missing object: %v", err)
	}
}
