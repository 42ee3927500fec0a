package sink_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

func TestPlanTruncate(t *testing.T) {
	file := func(cf string, minTS, maxTS, minBegin uint64) sink.FileMeta {
		return sink.FileMeta{CF: cf, Op: "put", MinTS: minTS, MaxTS: maxTS, MinBeginTSInDefaultCF: minBegin, NumberOfEntries: 1, Length: 10,
			RawLength: 10, Compression: sink.CompressionNone, SHA256: strings.Repeat("0", 64)}
	}
	meta := func(files ...sink.FileMeta) []sink.FileMeta { return files }
	const s = 100
	for _, tc := range []struct {
		name  string
		metas [][]sink.FileMeta
		drop  string
		kept  int
	}{
		{"old metas go, later ones stay", [][]sink.FileMeta{
			meta(file("write", 10, 20, 5), file("default", 5, 15, 5)),
			meta(file("write", 90, 100, 80)),
			meta(file("write", 95, 101, 99)),
		}, "[0 1]", 0},
		{"a prewrite a later commit needs keeps its meta", [][]sink.FileMeta{
			meta(file("default", 30, 40, 30)),
			meta(file("default", 10, 20, 10)),
			meta(file("write", 150, 160, 35)),
		}, "[1]", 1},
		{"a value prewritten at the snapshot ts stays", [][]sink.FileMeta{
			meta(file("default", 90, 100, 90)),
			meta(file("write", 90, 99, 90)),
		}, "[1]", 1},
		{"one later chunk keeps the whole meta", [][]sink.FileMeta{
			meta(file("write", 10, 20, 5), file("write", 10, 101, 5)),
		}, "[]", 0},
		{"an empty meta goes", [][]sink.FileMeta{meta()}, "[0]", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// As v1 metas of flow 1, and as flow 1's share of v2 cycles that
			// also hold a newer chunk of flow 2: the plan is flow 1's alone.
			for layout, store := range map[string]func(*testing.T, sink.Bucket, [][]sink.FileMeta) []string{"v1": v1Metas, "v2": v2Metas} {
				b := sink.NewMemBucket()
				paths := store(t, b, tc.metas)
				sums, err := sink.ReadMetaSummaries(context.Background(), b, sink.Flow{Catalog: "default", Name: "a", ID: 1}, paths, s, 2)
				if err != nil {
					t.Fatal(err)
				}
				drop, kept := sink.PlanTruncate(sums, s)
				if fmt.Sprint(drop) != tc.drop && !(tc.drop == "[]" && len(drop) == 0) {
					t.Errorf("%s: drop = %v, want %s", layout, drop, tc.drop)
				}
				if kept[sink.TruncateKeepDefault] != tc.kept {
					t.Errorf("%s: kept = %v, want %d for default-CF values", layout, kept, tc.kept)
				}
			}
		})
	}
}

// putMeta stores m at path.
func putMeta(t *testing.T, b sink.Bucket, path string, m sink.Meta) {
	t.Helper()
	raw, err := sink.EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(context.Background(), sink.Object{Name: path, Body: bytes.NewReader(raw), Size: int64(len(raw)), CRC32C: sink.CRC32C(raw)}); err != nil {
		t.Fatal(err)
	}
}

// v1Metas stores each list of files as a v1 meta of flow 1 and returns the
// meta paths.
func v1Metas(t *testing.T, b sink.Bucket, metas [][]sink.FileMeta) []string {
	t.Helper()
	var paths []string
	for i, files := range metas {
		m := sink.Meta{Version: sink.MetaVersion, Flow: "a", FlowID: 1, StoreID: "s", CycleID: fmt.Sprint(i), MinTS: 1, MaxTS: 1000}
		var off int64
		for _, f := range files {
			f.Offset = off
			m.Files = append(m.Files, f)
			off += f.Length
		}
		m.DataPath = sink.DataPath("", "default", "a", 1, 1, m.CycleID)
		p := sink.MetaPath("", "default", "a", 1, 1, m.CycleID)
		putMeta(t, b, p, m)
		paths = append(paths, p)
	}
	return paths
}

// v2Metas stores each list of files as a version 2 meta whose files are
// flow 1's, each followed by a chunk of flow 2 newer than any of them, and
// returns the meta paths.
func v2Metas(t *testing.T, b sink.Bucket, metas [][]sink.FileMeta) []string {
	t.Helper()
	var paths []string
	for i, files := range metas {
		m := sink.Meta{Version: sink.MetaVersion2, StoreID: "s", CycleID: fmt.Sprint(i), Group: "g",
			Flows: []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "a"}, {FlowID: 2, Catalog: "default", Name: "b"}}}
		var off int64
		for _, f := range files {
			f.Offset, f.FlowIDs = off, []uint32{1}
			other := f
			other.Offset, other.FlowIDs, other.MaxTS, other.MinBeginTSInDefaultCF = off+f.Length, []uint32{2}, 1000, 0
			m.Files = append(m.Files, f, other)
			off += 2 * f.Length
		}
		m.DataPath = sink.DataPathV2("", "s", 1, m.CycleID)
		m.MinTS, m.MaxTS = 1, 1000
		p := sink.MetaPathV2("", "s", 1, m.CycleID)
		putMeta(t, b, p, m)
		paths = append(paths, p)
	}
	return paths
}

// TestReadSharedMetaSummaries: the flows of a layout v2 backup share their
// metas, and summarising them together reads each meta once, with the
// same summaries as reading each flow alone; a request refused for a meta
// that is not its flow's fails alone.
func TestReadSharedMetaSummaries(t *testing.T) {
	ctx := context.Background()
	file := func(cf string, minTS, maxTS uint64) sink.FileMeta {
		return sink.FileMeta{CF: cf, Op: "put", MinTS: minTS, MaxTS: maxTS, MinBeginTSInDefaultCF: minTS, NumberOfEntries: 1, Length: 10,
			RawLength: 10, Compression: sink.CompressionNone, SHA256: strings.Repeat("0", 64)}
	}
	mem := sink.NewMemBucket()
	shared := v2Metas(t, mem, [][]sink.FileMeta{{file("write", 10, 20)}, {file("default", 30, 40), file("write", 50, 60)}, {file("write", 90, 150)}})
	own := v1Metas(t, mem, [][]sink.FileMeta{{file("write", 1, 5)}})
	flow := func(id uint32, name string) sink.Flow { return sink.Flow{Catalog: "default", Name: name, ID: id} }
	reqs := []sink.SummaryRequest{
		{Flow: flow(1, "a"), Paths: append(slices.Clone(own), shared...), TS: 30},
		{Flow: flow(2, "b"), Paths: shared, TS: 100},
		{Flow: flow(3, "c"), Paths: shared[:1], TS: 0},
	}
	b := newCountingBucket(mem)
	res := sink.ReadSharedMetaSummaries(ctx, b, reqs, 4)
	for _, p := range append(slices.Clone(own), shared...) {
		if b.gets[p] != 1 {
			t.Errorf("%s read %d times, want once", p, b.gets[p])
		}
	}
	for i, q := range reqs[:2] {
		want, err := sink.ReadMetaSummaries(ctx, mem, q.Flow, q.Paths, q.TS, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res[i].Err != nil || fmt.Sprint(res[i].Summaries) != fmt.Sprint(want) {
			t.Errorf("flow %d: %v, %v; read alone: %v", q.Flow.ID, res[i].Summaries, res[i].Err, want)
		}
	}
	if len(res[0].Summaries) != 4 || res[0].Summaries[3].LogBytesAfter != 10 || res[1].Summaries[1].LogBytesAfter != 20 {
		t.Errorf("log bytes after: flow 1 %v, flow 2 %v", res[0].Summaries, res[1].Summaries)
	}
	if res[2].Err == nil || !strings.Contains(res[2].Err.Error(), "does not serve") || res[2].Summaries != nil {
		t.Errorf("flow 3, which no meta serves: %v, %v; want a refusal", res[2].Summaries, res[2].Err)
	}
}
