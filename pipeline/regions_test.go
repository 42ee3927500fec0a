package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// In layout v2 the events of a table's regions go into one chunk that
// lists the regions' runs in arrival order, and its restore is that of the
// same events backed up a chunk per region.
func TestV2TwoRegionsOneChunk(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), func(c *pipeline.Config) { c.Layout = pipeline.LayoutV2 })
	r.start()
	id := r.createFlow("two", 1)
	batches := []*event.Batch{putBatch(1, 1, 0, 4, 10), putBatch(2, 1, 100, 3, 20), putBatch(1, 1, 200, 2, 30)}
	var oracle []sinktest.Entry
	want := map[string]int{}
	for _, b := range batches {
		r.produceBatch(b)
		for _, e := range b.Events {
			oracle = append(oracle, sinktest.Entry{Key: e.Key, Value: e.Value, TableID: 1, CF: sink.CFWrite, Op: sink.OpPut, RegionID: b.RegionID})
			want[string(e.Key)+"\x00"+string(e.Value)] = 1
		}
	}
	r.waitHandled(int64(len(batches)))
	r.flush()

	metas, got := r.entries(id)
	checkOnce(t, got, want)
	var files []sink.FileMeta
	var paths []string
	refs, err := r.store.Metas(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range metas {
		files = append(files, m.Files...)
		paths = append(paths, refs[i].Path)
	}
	wantRuns := sink.RegionRuns{{Region: 1, Entries: 4}, {Region: 2, Entries: 3}, {Region: 1, Entries: 2}}
	if len(files) != 1 || files[0].RegionID != 0 || !reflect.DeepEqual(files[0].Regions, wantRuns) {
		t.Fatalf("chunks %+v, want one of regions %v", files, wantRuns)
	}
	if files[0].ResolvedTS != ts(22) { // region 2's last resolved ts, below region 1's
		t.Errorf("chunk resolved at %d, want region 2's %d", files[0].ResolvedTS, ts(22))
	}

	flow := sink.Flow{Prefix: "backup", Catalog: "default", Name: "two", ID: uint32(id)}
	mem := sink.NewMemBucket()
	_, oraclePath := sinktest.WriteCycle(t, mem, sinktest.Cycle{Prefix: "backup", Catalog: "default", Flow: "two", FlowID: uint32(id), CycleID: "oracle",
		ResolvedTS: ts(40), Entries: oracle})
	for _, at := range []uint64{ts(12), ts(21), ts(40)} {
		if g, w := restoreFiles(t, r.bucket, flow, paths, at), restoreFiles(t, mem, flow, []string{oraclePath}, at); g != w || w == "" {
			t.Errorf("restore as of %d:\n%s\nwant\n%s", at, g, w)
		}
	}
}

// restoreFiles restores flow from metas as of ts and returns what it wrote.
func restoreFiles(t *testing.T, b sink.Bucket, flow sink.Flow, metas []string, ts uint64) string {
	t.Helper()
	out := t.TempDir()
	if _, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: b, Flow: flow, MetaPaths: metas, TS: ts, OutDir: out, TempDir: t.TempDir()}); err != nil {
		t.Fatalf("restore as of %d: %v", ts, err)
	}
	ents, _ := os.ReadDir(out)
	s := ""
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(out, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		s += fmt.Sprintf("%s:\n%s", e.Name(), raw)
	}
	return s
}

// A cycle whose layout v2 files hold as many region runs as a meta should
// list is frozen like one of --max-cycle-files files: events that
// alternate between regions go into cycles of at most that many runs, with
// no flush requested and nothing lost.
func TestV2RegionRunsFreezeCycles(t *testing.T) {
	const limit, records = 10, 45
	defer pipeline.SetMaxCycleRuns(limit)()
	r := newRig(t, 1, sink.NewMemBucket(), func(c *pipeline.Config) { c.Layout = pipeline.LayoutV2 })
	r.start()
	id := r.createFlow("alt", 1)
	want := map[string]int{}
	for i := range records {
		b := putBatch(uint64(i%2+1), 1, int64(i)*10, 2, int64(i)*10)
		r.produceBatch(b)
		for _, kv := range keysOf(b) {
			want[string(kv)] = 1
		}
	}
	r.waitHandled(records)
	r.eventually(30*time.Second, func() bool {
		refs, err := r.store.Metas(context.Background(), id)
		return err == nil && len(refs) >= records/limit
	}, "cycles frozen by their region runs")
	r.flush()
	metas, got := r.entries(id)
	checkOnce(t, got, want)
	for _, m := range metas {
		runs := 0
		for _, f := range m.Files {
			f.EachRegion(func(uint64, int64) { runs++ })
		}
		if runs > limit {
			t.Errorf("cycle %s lists %d region runs, over the %d a cycle takes", m.CycleID, runs, limit)
		}
	}
	if n := testutil.ToFloat64(r.cons.MetricCycles("files", "ok")); n < records/limit {
		t.Errorf("%v cycles frozen by their files or runs, want at least %d", n, records/limit)
	}
}
