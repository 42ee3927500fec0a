package sink_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

func TestPlanTruncate(t *testing.T) {
	file := func(cf string, minTS, maxTS, minBegin uint64) sink.FileMeta {
		return sink.FileMeta{CF: cf, Op: "put", MinTS: minTS, MaxTS: maxTS, MinBeginTSInDefaultCF: minBegin, NumberOfEntries: 1, Length: 10,
			RawLength: 10, Compression: sink.CompressionNone, SHA256: strings.Repeat("0", 64)}
	}
	meta := func(files ...sink.FileMeta) sink.LoggedMeta { return sink.LoggedMeta{Meta: sink.Meta{Files: files}} }
	const s = 100
	for _, tc := range []struct {
		name  string
		metas []sink.LoggedMeta
		drop  string
		kept  int
	}{
		{"old metas go, later ones stay", []sink.LoggedMeta{
			meta(file("write", 10, 20, 5), file("default", 5, 15, 5)),
			meta(file("write", 90, 100, 80)),
			meta(file("write", 95, 101, 99)),
		}, "[0 1]", 0},
		{"a prewrite a later commit needs keeps its meta", []sink.LoggedMeta{
			meta(file("default", 30, 40, 30)),
			meta(file("default", 10, 20, 10)),
			meta(file("write", 150, 160, 35)),
		}, "[1]", 1},
		{"a value prewritten at the snapshot ts stays", []sink.LoggedMeta{
			meta(file("default", 90, 100, 90)),
			meta(file("write", 90, 99, 90)),
		}, "[1]", 1},
		{"one later chunk keeps the whole meta", []sink.LoggedMeta{
			meta(file("write", 10, 20, 5), file("write", 10, 101, 5)),
		}, "[]", 0},
		{"an empty meta goes", []sink.LoggedMeta{meta()}, "[0]", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drop, kept := sink.PlanTruncate(tc.metas, s)
			if fmt.Sprint(drop) != tc.drop && !(tc.drop == "[]" && len(drop) == 0) {
				t.Errorf("drop = %v, want %s", drop, tc.drop)
			}
			if kept[sink.TruncateKeepDefault] != tc.kept {
				t.Errorf("kept = %v, want %d for default-CF values", kept, tc.kept)
			}
			// The same files as flow 1's share of v2 cycles that also hold a
			// newer chunk of flow 2: the plan is flow 1's alone.
			b := sink.NewMemBucket()
			paths := v2Metas(t, b, tc.metas)
			sums, err := sink.ReadMetaSummaries(context.Background(), b, sink.Flow{Catalog: "default", Name: "a", ID: 1}, paths, s, 2)
			if err != nil {
				t.Fatal(err)
			}
			drop, kept = sink.PlanTruncateSummaries(sums, s)
			if fmt.Sprint(drop) != tc.drop && !(tc.drop == "[]" && len(drop) == 0) {
				t.Errorf("from summaries of v2 metas: drop = %v, want %s", drop, tc.drop)
			}
			if kept[sink.TruncateKeepDefault] != tc.kept {
				t.Errorf("from summaries of v2 metas: kept = %v, want %d for default-CF values", kept, tc.kept)
			}
		})
	}
}

// v2Metas stores each of metas as a version 2 meta whose files are flow
// 1's, each followed by a chunk of flow 2 newer than any of them, and
// returns the meta paths.
func v2Metas(t *testing.T, b sink.Bucket, metas []sink.LoggedMeta) []string {
	t.Helper()
	var paths []string
	for i, lm := range metas {
		m := sink.Meta{Version: sink.MetaVersion2, StoreID: "s", CycleID: fmt.Sprint(i), Group: "g",
			Flows: []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "a"}, {FlowID: 2, Catalog: "default", Name: "b"}}}
		var off int64
		for _, f := range lm.Meta.Files {
			f.Offset, f.FlowIDs = off, []uint32{1}
			other := f
			other.Offset, other.FlowIDs, other.MaxTS, other.MinBeginTSInDefaultCF = off+f.Length, []uint32{2}, 1000, 0
			m.Files = append(m.Files, f, other)
			off += 2 * f.Length
		}
		m.DataPath = sink.DataPathV2("", "s", 1, m.CycleID)
		m.MinTS, m.MaxTS = 1, 1000
		raw, err := sink.EncodeMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		p := sink.MetaPathV2("", "s", 1, m.CycleID)
		if err := b.Upload(context.Background(), sink.Object{Name: p, Body: bytes.NewReader(raw), Size: int64(len(raw)), CRC32C: sink.CRC32C(raw)}); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}
