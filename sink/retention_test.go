package sink_test

import (
	"fmt"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

func TestPlanTruncate(t *testing.T) {
	file := func(cf string, minTS, maxTS, minBegin uint64) sink.FileMeta {
		return sink.FileMeta{CF: cf, Op: "put", MinTS: minTS, MaxTS: maxTS, MinBeginTSInDefaultCF: minBegin, NumberOfEntries: 1, Length: 10}
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
		})
	}
}
