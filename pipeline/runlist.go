package pipeline

import (
	"encoding/binary"

	"github.com/flowlog/flowlog/sink"
)

// runList is the region runs of a layout v2 temp file (its chunk's
// `regions`, docs/FORMAT.md, "Meta objects, version 2"), kept compact: a
// chunk of a table that every region writes to takes a run for nearly
// every entry, and at 16 bytes a run (sink.RegionRun) plus the slack of a
// growing slice the runs of a few cycles in flight were most of the
// consumer's heap. Every run but the last is two uvarints (region,
// entries), usually 3-4 bytes; the last run, which the next entry may
// extend, is kept apart.
type runList struct {
	enc  []byte         // the runs before last, as uvarint pairs
	last sink.RegionRun // the last run; Entries 0 while there is none
	n    int            // runs, last included
}

// add counts one more entry of region: in the last run if it is region's,
// else in a new run. It reports whether a run was started.
func (l *runList) add(region uint64) bool {
	if l.n > 0 && l.last.Region == region {
		l.last.Entries++
		return false
	}
	if l.n > 0 {
		l.enc = binary.AppendUvarint(l.enc, l.last.Region)
		l.enc = binary.AppendUvarint(l.enc, uint64(l.last.Entries))
	}
	l.last = sink.RegionRun{Region: region, Entries: 1}
	l.n++
	return true
}

// len is the number of runs.
func (l *runList) len() int { return l.n }

// mem is the memory the runs hold beyond the list itself.
func (l *runList) mem() int64 { return int64(cap(l.enc)) }

// each calls fn with every run in order.
func (l *runList) each(fn func(sink.RegionRun)) {
	for b := l.enc; len(b) > 0; {
		region, n := binary.Uvarint(b)
		entries, m := binary.Uvarint(b[n:])
		b = b[n+m:]
		fn(sink.RegionRun{Region: region, Entries: int64(entries)})
	}
	if l.n > 0 {
		fn(l.last)
	}
}

// Len and Each give the runs to the chunk's meta entry as it is encoded
// (sink.RegionRunSource).
func (l *runList) Len() int                     { return l.n }
func (l *runList) Each(fn func(sink.RegionRun)) { l.each(fn) }

// runs decodes the list.
func (l *runList) runs() sink.RegionRuns {
	out := make(sink.RegionRuns, 0, l.n)
	l.each(func(r sink.RegionRun) { out = append(out, r) })
	return out
}
