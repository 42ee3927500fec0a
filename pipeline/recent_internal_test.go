package pipeline

import (
	"slices"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Keys that share a slot of the generation's lookup cache still get a
// file each, and a file removed from the generation (its partition lost)
// is never handed out again: its key gets a new file.
func TestGenerationFileLookupCache(t *testing.T) {
	g := newGeneration(t.TempDir(), 1, 4, sink.CompressionZstd, nil)
	a := fileKey{table: 1, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT, partition: 3, region: 7, flow: 1}
	b := a
	for b.table = 2; b.slot()&(recentSlots-1) != a.slot()&(recentSlots-1); b.table++ {
	}
	other := fileKey{table: -1}
	for i := range 10 {
		for _, k := range []fileKey{a, b, other} {
			f, err := g.file(k, nil)
			if err != nil {
				t.Fatal(err)
			}
			if f.key != k {
				t.Fatalf("round %d: file of key %+v holds key %+v", i, k, f.key)
			}
			if err := f.append([]byte("k"), nil, uint64(i+1), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	fa, _ := g.file(a, nil)
	fb, _ := g.file(b, nil)
	if fa == fb || fa.entries != 10 || fb.entries != 10 || len(g.files) != 3 {
		t.Fatalf("files %p %p with %d and %d entries, %d files; want two files of 10 entries and 3 files", fa, fb, fa.entries, fb.entries, len(g.files))
	}
	if f, _ := g.file(a, nil); f != fa { // a's file in the shared slot
		t.Fatalf("lookup of a gave another file")
	}
	fa.remove()
	delete(g.files, a)
	if _, err := g.file(other, nil); err != nil { // a is no longer the last file looked up
		t.Fatal(err)
	}
	na, err := g.file(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if na == fa || na.entries != 0 || len(g.files) != 3 {
		t.Fatalf("key of a removed file: got %p with %d entries (removed %p), %d files; want a new empty file", na, na.entries, fa, len(g.files))
	}
	files, _ := g.seal()
	for _, f := range files {
		f.remove()
	}
}

// A file lists each apply partition of its entries once, in the order of
// their first entries, below 64 and above alike.
func TestTempFilePartitions(t *testing.T) {
	g := newGeneration(t.TempDir(), 1, 4, sink.CompressionZstd, nil)
	set := &meta.FlowSet{IDs: []meta.FlowID{1}, Flows: []*meta.Flow{{ID: 1}}}
	f, err := g.file(fileKey{set: set, table: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int32{3, 70, 3, 5, 70, 64, 63, 0, 5, 255} {
		f.countPartition(p)
	}
	want := []int32{3, 70, 5, 64, 63, 0, 255}
	if !slices.Equal(f.parts, want) {
		t.Errorf("parts %v, want %v", f.parts, want)
	}
	for _, p := range []int32{1, 4, 62, 65, 254} {
		if f.holdsPartition(p) {
			t.Errorf("holds partition %d, which no entry came from", p)
		}
	}
	for _, p := range want {
		if !f.holdsPartition(p) {
			t.Errorf("does not hold partition %d", p)
		}
	}
	files, _ := g.seal()
	for _, f := range files {
		f.remove()
	}
}
