package pipeline

import (
	"math"
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
	if got := l.runs(); !reflect.DeepEqual(got, want) || l.len() != len(want) || started != len(want) {
		t.Fatalf("runs %v (%d, %d started), want %v", got, l.len(), started, want)
	}
	if l.last != want[len(want)-1] {
		t.Fatalf("last run %v, want %v", l.last, want[len(want)-1])
	}
	var empty runList
	if n := len(empty.runs()); n != 0 || empty.len() != 0 {
		t.Fatalf("an empty list has %d runs", n)
	}
}
