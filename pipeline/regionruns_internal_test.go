package pipeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// A layout v2 file takes the entries of every region of its key and
// records their runs; one that holds maxChunkRuns runs takes no new
// region, and the key goes on in a new file that sorts after it. The
// chunks, in order, hold every entry in the order appended, each lists at
// most maxChunkRuns runs (region_id alone for a chunk of one region), and
// their meta entries pass the readers' checks.
func TestRegionRunsSplitAtTheLimit(t *testing.T) {
	defer func(n int) { maxChunkRuns = n }(maxChunkRuns)
	maxChunkRuns = 3
	flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
	set := &meta.FlowSet{IDs: []meta.FlowID{1}, Flows: []*meta.Flow{flow}}
	g := newGeneration(t.TempDir(), 1, 2, sink.CompressionZstd, nil)
	key := fileKey{set: set, table: 1, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}
	other := fileKey{set: set, table: 2, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}

	// Regions of table 1's entries, in order, and where the files split:
	// a fourth region would start a fourth run.
	regions := []uint64{1, 1, 2, 3, 3 /**/, 4, 4, 5, 1, 1 /**/, 2, 0, 0, 7, 7, 7}
	wantRuns := []sink.RegionRuns{runsOf(1, 2, 2, 1, 3, 2), runsOf(4, 2, 5, 1, 1, 2), runsOf(2, 1, 0, 2, 7, 3)}
	var want []byte
	for i, region := range regions {
		k := event.AppendDataKey(nil, event.RowKey(1, int64(i)), uint64(i+1))
		v := []byte(fmt.Sprintf("v%d", i))
		put := func(key fileKey) {
			t.Helper()
			f, err := g.regionFile(key, region)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.append(k, v, uint64(i+1), 0); err != nil {
				t.Fatal(err)
			}
			f.countRegion(region)
		}
		put(key)
		want = event.AppendEntry(want, k, v)
		if i%4 == 0 {
			put(other) // another key between, so that the last file is not the one asked for
		}
	}
	files, _ := g.seal()
	if err := packFiles(files); err != nil {
		t.Fatal(err)
	}
	sortFiles(files)
	var got []byte
	var runs []sink.RegionRuns
	var metas []sink.FileMeta
	var off int64
	for _, f := range files {
		fm := fileMeta(t, f, off)
		off += f.stored
		metas = append(metas, fm)
		if f.key.table != 1 {
			continue
		}
		if f.key.split != uint32(len(runs)) {
			t.Errorf("file %s is split %d, want %d: splits sort in order", f.name(), f.key.split, len(runs))
		}
		fr := fileRuns(t, f)
		runs = append(runs, fr)
		got = append(got, readChunkFile(t, f)...)
		if fm.RegionID != 0 || !reflect.DeepEqual(fm.Regions, fr) {
			t.Errorf("file entry of %s: region_id %d, regions %v; want 0 and %v", f.name(), fm.RegionID, fm.Regions, fr)
		}
		if f.runs.enc != nil {
			t.Errorf("file %s holds %d bytes of runs in memory after the seal, want them in its segment", f.name(), len(f.runs.enc))
		}
	}
	if !reflect.DeepEqual(runs, wantRuns) {
		t.Errorf("runs of table 1's files %v, want %v", runs, wantRuns)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("table 1's chunks hold %d bytes, want the %d appended, in order", len(got), len(want))
	}
	// Table 2's file took regions 1, 3, 1 and 0 (entries 0, 4, 8, 12):
	// four runs, split after the third.
	if n := len(files) - len(wantRuns); n != 2 {
		t.Errorf("table 2 has %d files, want 2", n)
	}
	m := sink.Meta{Version: sink.MetaVersion2, StoreID: "s", CycleID: "c", Group: "g", DataPath: "d", MinTS: 1, MaxTS: uint64(len(regions)),
		Flows: []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "f"}}, Files: metas}
	if _, err := sink.EncodeMeta(m); err != nil {
		t.Errorf("the chunks' meta: %v", err)
	}
}

// A file of one region says it in region_id and lists no runs: a narrow
// backup's metas are what they were before chunks held several regions.
func TestOneRegionChunkHasNoRuns(t *testing.T) {
	flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
	set := &meta.FlowSet{IDs: []meta.FlowID{1}, Flows: []*meta.Flow{flow}}
	g := newGeneration(t.TempDir(), 1, 2, sink.CompressionNone, nil)
	key := fileKey{set: set, table: 1, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}
	for i := range 3 {
		f, err := g.regionFile(key, 42)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.append(event.AppendDataKey(nil, event.RowKey(1, int64(i)), 5), []byte("v"), 5, 0); err != nil {
			t.Fatal(err)
		}
		f.countRegion(42)
	}
	files, _ := g.seal()
	fm := fileMeta(t, files[0], 0)
	if len(files) != 1 || fm.RegionID != 42 || fm.Regions != nil || fm.NumberOfEntries != 3 {
		t.Fatalf("%d files, region_id %d, regions %v, %d entries; want 1 file of region 42 without runs", len(files), fm.RegionID, fm.Regions, fm.NumberOfEntries)
	}
	if name := files[0].name(); strings.Contains(name, "-r") {
		t.Errorf("layout v2 file named %s: its key has no region", name)
	}
}

// A chunk's resolved ts is the lowest last resolved ts of its regions; a
// region no partition tracks any longer counts as 0. A layout v2 chunk
// holds every partition's regions, and a region that two partitions track
// counts with the lower.
func TestResolvedOfIsTheLowestOfItsRegions(t *testing.T) {
	set := &meta.FlowSet{IDs: []meta.FlowID{1}}
	s := &session{parts: map[int32]*partState{
		0: {regions: map[uint64]*regionState{1: {resolved: 30}, 2: {resolved: 10}, 3: {resolved: 20}, 8: {resolved: 50}}},
		1: {regions: map[uint64]*regionState{7: {resolved: 40}, 8: {resolved: 45}}},
	}}
	for _, tc := range []struct {
		name string
		f    *tempFile
		want uint64
	}{
		{"v1", &tempFile{key: fileKey{region: 3}}, 20},
		{"v2 one region", &tempFile{key: fileKey{set: set}, runs: runListOf(1, 4)}, 30},
		{"v2 several", &tempFile{key: fileKey{set: set}, runs: runListOf(1, 4, 3, 1, 1, 2)}, 20},
		{"v2 lowest in the middle", &tempFile{key: fileKey{set: set}, runs: runListOf(1, 4, 2, 1, 3, 2)}, 10},
		{"v2 untracked region", &tempFile{key: fileKey{set: set}, runs: runListOf(1, 4, 9, 1)}, 0},
		{"v1 other partition", &tempFile{key: fileKey{partition: 1, region: 3}}, 0},
		{"v2 another partition's region", &tempFile{key: fileKey{set: set}, runs: runListOf(1, 4, 7, 1)}, 30},
		{"v2 region of two partitions", &tempFile{key: fileKey{set: set}, runs: runListOf(8, 2)}, 45},
	} {
		if got := s.resolvedOf(tc.f, &resolvedView{}); got != tc.want {
			t.Errorf("%s: resolved ts %d, want %d", tc.name, got, tc.want)
		}
	}
}

// fileRuns are the region runs of a sealed file, read back from its
// segment.
func fileRuns(t *testing.T, tf *tempFile) sink.RegionRuns {
	t.Helper()
	runs, err := tf.runs.runs(tf.seg)
	if err != nil {
		t.Fatalf("region runs of %s: %v", tf.name(), err)
	}
	return runs
}

// runListOf is the run list of region, entries pairs.
func runListOf(pairs ...int64) runList {
	var l runList
	for i := 0; i+1 < len(pairs); i += 2 {
		for range pairs[i+1] {
			l.add(uint64(pairs[i]))
		}
	}
	return l
}

// runsOf are the runs of region, entries pairs.
func runsOf(pairs ...int64) sink.RegionRuns {
	var rs sink.RegionRuns
	for i := 0; i+1 < len(pairs); i += 2 {
		rs = append(rs, sink.RegionRun{Region: uint64(pairs[i]), Entries: pairs[i+1]})
	}
	return rs
}

// fileMeta is the meta entry of tf's chunk stored at off, as a reader
// decodes it: encoded with the region runs taken from the file (addRuns),
// then decoded.
func fileMeta(t *testing.T, tf *tempFile, off int64) sink.FileMeta {
	t.Helper()
	fm := fileEntry(tf, off)
	var files segFiles
	defer files.close()
	var readErr error
	addRuns(&fm, tf, &files, &readErr)
	b, err := json.Marshal(fm)
	if readErr != nil {
		t.Fatalf("region runs of %s: %v", tf.name(), readErr)
	}
	if err != nil {
		t.Fatalf("encode the file entry of %s: %v", tf.name(), err)
	}
	var out sink.FileMeta
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decode the file entry of %s: %v", tf.name(), err)
	}
	return out
}
