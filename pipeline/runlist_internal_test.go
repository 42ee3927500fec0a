package pipeline

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// A run list gives back the runs it counted, in order, whatever the size
// of the region ids and entry counts, and starts a run only when the
// region changes.
func TestRunListKeepsTheRuns(t *testing.T) {
	want := sink.RegionRuns{{Region: 0, Entries: 1}, {Region: math.MaxUint64, Entries: 300}, {Region: 7, Entries: 2},
		{Region: 0, Entries: 1}, {Region: 1 << 40, Entries: 1}}
	var l runList
	started := 0
	for _, r := range want {
		for range r.Entries {
			if l.add(r.Region) {
				started++
			}
		}
	}
	if got, err := l.runs(nil); err != nil || !reflect.DeepEqual(got, want) || l.len() != len(want) || started != len(want) {
		t.Fatalf("runs %v (%d, %d started), want %v", got, l.len(), started, want)
	}
	if l.last != want[len(want)-1] {
		t.Fatalf("last run %v, want %v", l.last, want[len(want)-1])
	}
	var empty runList
	if got, err := empty.runs(nil); err != nil || len(got) != 0 || empty.len() != 0 {
		t.Fatalf("an empty list has %d runs (%v)", len(got), err)
	}
}

// A list spilled to a segment holds only its last run in memory, costs
// the bytes on disk (at most what it held), and gives back every run in order, the spilled ones
// read from the segment, however the segment's other bytes lie around
// them; runs counted after the spill come after those.
func TestSpilledRunListReadsBack(t *testing.T) {
	seg := newSegment(filepath.Join(t.TempDir(), "g1.seg"), nil)
	seg.acquire()
	defer seg.release()
	if _, err := seg.write([]byte("chunk bytes before")); err != nil {
		t.Fatal(err)
	}
	var l runList
	var want sink.RegionRuns
	for i := range 500 {
		region := uint64(i%7) << (i % 40)
		l.add(region)
		want = append(want, sink.RegionRun{Region: region, Entries: 1})
	}
	before := l.mem()
	if err := l.spill(seg); err != nil {
		t.Fatal(err)
	}
	if l.enc != nil || l.mem() != l.diskLen || l.diskLen == 0 || l.diskLen > before {
		t.Fatalf("after the spill: %d bytes in memory, cost %d (was %d), %d on disk; want none, and a cost of the bytes on disk",
			len(l.enc), l.mem(), before, l.diskLen)
	}
	if _, err := seg.write([]byte("chunk bytes after")); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		l.add(9)
	}
	want = append(want, sink.RegionRun{Region: 9, Entries: 3})
	if err := seg.seal(); err != nil {
		t.Fatal(err)
	}
	got, err := l.runs(seg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("runs read back differ: %d runs, want %d", len(got), len(want))
	}
	if err := os.Remove(seg.path); err != nil {
		t.Fatal(err)
	}
	if _, err := l.runs(seg); err == nil {
		t.Fatal("runs of a segment gone read without an error")
	}
}
