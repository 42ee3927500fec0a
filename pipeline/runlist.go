package pipeline

import (
	"encoding/binary"
	"fmt"
	"os"

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
//
// When its generation is sealed the encoded runs go to the generation's
// segment, beside the chunks' bytes (spill), and only the last run stays
// in memory: a frozen cycle waits for its upload with its runs on disk,
// and they are read back once, while its meta is encoded (eachFrom). A
// wide cycle's runs were 3-4 MB of the heap for every cycle in flight,
// and with the heap near the Go memory limit each MB of it was more
// collections (docs/SIZING.md, "Width: many flows, tables and regions
// (layout v2)").
type runList struct {
	enc  []byte         // the runs before last, as uvarint pairs, not spilled
	last sink.RegionRun // the last run; Entries 0 while there is none
	n    int            // runs, last included
	// diskOff and diskLen locate the runs spilled to the segment, which
	// come before enc.
	diskOff, diskLen int64
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

// mem is what the runs cost beyond the list itself: the memory they hold,
// and the bytes spilled to the segment, which count in --flush-size and
// --max-temp-bytes as they did in memory.
func (l *runList) mem() int64 { return int64(cap(l.enc)) + l.diskLen }

// spill writes the encoded runs to seg and lets their memory go. It is
// called once, when the list's generation is sealed; a later spill writes
// nothing, and runs added after the first stay in memory, after the
// spilled ones.
func (l *runList) spill(seg *segment) error {
	if len(l.enc) == 0 || l.diskLen > 0 {
		return nil
	}
	off, err := seg.write(l.enc)
	if err != nil {
		return fmt.Errorf("write region runs: %w", err)
	}
	l.diskOff, l.diskLen, l.enc = off, int64(len(l.enc)), nil
	return nil
}

// each calls fn with every run in order. The list must hold all of them
// (not spilled: eachFrom reads those).
func (l *runList) each(fn func(sink.RegionRun)) {
	eachEncoded(l.enc, fn)
	if l.n > 0 {
		fn(l.last)
	}
}

// eachEncoded calls fn with every run of b, uvarint pairs.
func eachEncoded(b []byte, fn func(sink.RegionRun)) {
	for len(b) > 0 {
		region, n := binary.Uvarint(b)
		entries, m := binary.Uvarint(b[n:])
		b = b[n+m:]
		fn(sink.RegionRun{Region: region, Entries: int64(entries)})
	}
}

// eachFrom calls fn with every run in order, the spilled ones read from
// seg through files first. A failed read calls fn with none of them and is
// returned.
func (l *runList) eachFrom(files *segFiles, seg *segment, fn func(sink.RegionRun)) error {
	if l.diskLen > 0 {
		b, err := files.read(seg, l.diskOff, l.diskLen)
		if err != nil {
			return fmt.Errorf("read region runs: %w", err)
		}
		eachEncoded(b, fn)
	}
	l.each(fn)
	return nil
}

// segFiles reads sealed segments, each opened once, into one buffer that
// the next read reuses.
type segFiles struct {
	open map[*segment]*os.File
	buf  []byte
}

// read returns n bytes of seg at off, valid until the next read.
func (s *segFiles) read(seg *segment, off, n int64) ([]byte, error) {
	f := s.open[seg]
	if f == nil {
		var err error
		if f, err = os.Open(seg.path); err != nil {
			return nil, fmt.Errorf("open temp segment: %w", err)
		}
		if s.open == nil {
			s.open = map[*segment]*os.File{}
		}
		s.open[seg] = f
	}
	if int64(cap(s.buf)) < n {
		s.buf = make([]byte, n)
	}
	b := s.buf[:n]
	if _, err := f.ReadAt(b, off); err != nil {
		return nil, fmt.Errorf("temp segment %s at %d: %w", seg.path, off, err)
	}
	return b, nil
}

// close closes every segment opened.
func (s *segFiles) close() {
	for _, f := range s.open {
		_ = f.Close()
	}
	s.open = nil
}

// runSource gives a sealed file's runs to its chunk's meta entry as it is
// encoded (sink.RegionRunSource), the spilled ones read from its segment.
// A failed read leaves the entry without them and is kept in err, which
// fails the encoding (encodeMeta).
type runSource struct {
	l     *runList
	seg   *segment
	files *segFiles
	err   *error
}

func (s runSource) Len() int { return s.l.n }

func (s runSource) Each(fn func(sink.RegionRun)) {
	if err := s.l.eachFrom(s.files, s.seg, fn); err != nil && *s.err == nil {
		*s.err = err
	}
}

// runs decodes the list, the spilled runs read from seg.
func (l *runList) runs(seg *segment) (sink.RegionRuns, error) {
	out := make(sink.RegionRuns, 0, l.n)
	var files segFiles
	defer files.close()
	err := l.eachFrom(&files, seg, func(r sink.RegionRun) { out = append(out, r) })
	return out, err
}
