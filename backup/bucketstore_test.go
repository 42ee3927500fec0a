package backup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// BucketStore answers what Redis would, from catalogs, the checkpoint
// object and the metas in the bucket.
func TestBucketStore(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	const base = 1 << 40
	put := func(name string, body []byte) {
		if err := b.Upload(ctx, sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
			t.Fatal(err)
		}
	}
	flows := []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "a"}, {FlowID: 2, Catalog: "default", Name: "a"}}
	entry := sinktest.WritePut(10, 1, base, base+1, []byte("v"), true)
	entry.FlowIDs = []uint32{1}
	_, old := sinktest.WriteCycleV2(t, b, sinktest.CycleV2{Prefix: "p", CycleID: "1-0-aa", ResolvedTS: base, Flows: flows[:1], Entries: []sinktest.Entry{entry}})
	entry.FlowIDs = []uint32{2}
	_, cur := sinktest.WriteCycleV2(t, b, sinktest.CycleV2{Prefix: "p", CycleID: "2-0-bb", ResolvedTS: base + 5, Flows: flows[1:], Entries: []sinktest.Entry{entry}})
	until := uint64(base + 3)
	info := []byte(`{"catalog_name":"default","flow_name":"a","source_table_ids":[10]}`)
	sinktest.WriteCatalog(t, b, "p", sink.Catalog{Version: 1, Group: "flowlog", FlowID: 1, Catalog: "default", Name: "a", Rev: 4, Dropped: true, Info: info,
		Windows: []sink.CatalogWindow{{TableID: 10, Since: base - 1, Until: &until}}})
	sinktest.WriteCatalog(t, b, "p", sink.Catalog{Version: 1, Group: "flowlog", FlowID: 2, Catalog: "default", Name: "a", Rev: 1, Info: info})
	sinktest.WriteCatalog(t, b, "p", sink.Catalog{Version: 1, Group: "flowlog", FlowID: 2, Catalog: "default", Name: "a", Rev: 2, Info: info,
		Windows: []sink.CatalogWindow{{TableID: 10, Since: base + 2}},
		History: []sink.CatalogWindow{{TableID: 10, Since: base - 9, Until: &until}},
		Pending: []sink.CatalogPending{{Seq: 2, Removed: []uint32{10, 11}, Ckpt: base + 4},
			{Seq: 3, Added: []uint32{12}, Removed: []uint32{11}, Ckpt: base + 5}},
		CoverageSeq: 3, TruncatedBefore: base + 1,
		Snapshots: []sink.CatalogSnapshot{{TS: base + 1, Path: sink.SnapshotMetaPath("p", "default", "a", 2, base+1)}}})
	put(sink.CheckpointPathV2("p", "flowlog"), sink.EncodeCheckpoint(base+6))

	s := &backup.BucketStore{Bucket: b, Prefix: "p", Group: "flowlog"}
	id, ok, err := s.FlowIDByName(ctx, "default", "a")
	if err != nil || !ok || id != 2 {
		t.Fatalf("FlowIDByName = %d, %v, %v; want 2, the one not dropped", id, ok, err)
	}
	if fi, ok, err := s.FlowInfo(ctx, 2); err != nil || !ok || fi.FlowName != "a" || fmt.Sprint(fi.SourceTableIDs) != "[10]" {
		t.Errorf("FlowInfo(2) = %+v, %v, %v", fi, ok, err)
	}
	if _, ok, err := s.FlowInfo(ctx, 1); err != nil || ok {
		t.Errorf("FlowInfo of the dropped flow: %v, %v; want not found", ok, err)
	}
	if st, err := s.FlowState(ctx, 2); err != nil || st.CheckpointTS != base+6 {
		t.Errorf("FlowState = %+v, %v", st, err)
	}
	for id, want := range map[meta.FlowID]string{1: old, 2: cur} {
		refs, err := s.Metas(ctx, id)
		if err != nil || len(refs) != 1 || refs[0].Path != want {
			t.Errorf("Metas(%d) = %+v, %v; want %s", id, refs, err, want)
		}
	}
	w, hist, err := s.Windows(ctx, 2)
	if err != nil || w[10].Since != base+2 || w[10].Until != nil || len(hist) != 1 || *hist[0].Until != until {
		t.Errorf("Windows = %+v, %+v, %v", w, hist, err)
	}
	if p, err := s.PendingRemoved(ctx, 2); err != nil || len(p) != 2 || p[10] != base+4 || p[11] != base+4 {
		t.Errorf("PendingRemoved = %+v, %v; want tables 10 and 11 at the first step's checkpoint", p, err)
	}
	if p, err := s.PendingAdded(ctx, 2); err != nil || len(p) != 1 || !p[12] {
		t.Errorf("PendingAdded = %+v, %v; want table 12", p, err)
	}
	if sn, err := s.Snapshots(ctx, 2); err != nil || len(sn) != 1 || sn[0].TS != base+1 {
		t.Errorf("Snapshots = %+v, %v", sn, err)
	}
	if tb, ok, err := s.TruncatedBefore(ctx, 2); err != nil || !ok || tb != base+1 {
		t.Errorf("TruncatedBefore = %d, %v, %v", tb, ok, err)
	}
	// A flow the bucket holds no catalog of cannot be read.
	other := &backup.BucketStore{Bucket: b, Prefix: "p", Group: "blue"}
	if _, _, err := other.Windows(ctx, 2); !errors.Is(err, backup.ErrNoCatalog) {
		t.Errorf("Windows without a catalog: %v, want ErrNoCatalog", err)
	}
}
