package sink

import (
	"bufio"
	"bytes"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"github.com/flowlog/flowlog/event"
)

// extSorter sorts (key, value) entries by key bytes in bounded memory. It
// fills one run buffer (entries copied into fixed-size slabs, plus an index)
// while the previous, full buffer is sorted and spilled as a run file by a
// background goroutine; iterating merges the runs (k-way) with the last
// buffer, sorted in memory. The two buffers together stay within the
// budget. Entries with equal keys come out in an unspecified order. It is
// not safe for concurrent use.
type extSorter struct {
	dir    string
	name   string
	budget int // of one run buffer: half the sorter's budget
	cur    *runBuf
	spare  *runBuf        // the other buffer, once its spill finished
	spillc chan spillDone // the in-flight spill, if any
	runs   []string
	bytes  int64 // framed bytes added, for stats
}

type spillDone struct {
	buf  *runBuf
	name string
	err  error
}

// slabSize is the arena allocation unit: entries are copied into slabs of
// this size (an entry that does not fit gets a slab of its own), so the
// arena grows without copying and slabs are reused run after run.
const slabSize = 1 << 20

// runBuf holds the entries of one run: their bytes in slabs and an index.
type runBuf struct {
	slabs [][]byte
	used  int // slabs in use; slabs[used:] are empty and reusable
	mem   int // bytes of the slabs in use plus the index capacity
	idx   []span
}

// span indexes one entry of a runBuf. p0 and p1 cache 16 key bytes from the
// run's common key prefix on (zero padded), so that most comparisons of a
// sort stay in the index instead of missing the cache on two random slab
// offsets; they are filled by sort.
type span struct {
	p0, p1 uint64
	slab   uint32
	off    uint32 // of the key in the slab
	klen   uint32
	vlen   uint32
}

// spanSize is the memory of one index element.
const spanSize = int(unsafe.Sizeof(span{}))

func newExtSorter(dir, name string, budget int) *extSorter {
	budget = max(budget/2, 2*slabSize)
	return &extSorter{dir: dir, name: name, budget: budget, cur: &runBuf{}}
}

// runBytes caps a run buffer below the budget: a large budget would
// otherwise hold a restore's whole data and sort it in one piece at the end,
// where nothing overlaps the sort, and fault in fresh memory all the way.
// Bounded runs are sorted and spilled in the background while the chunks
// are still being read. The cap doubles every 64 runs so that the merge's
// fan-in (open run files) stays moderate for very large restores.
const runBytes = 16 << 20

func (s *extSorter) runLimit() int {
	return min(s.budget, runBytes<<min(len(s.runs)/64, 20))
}

func (s *extSorter) add(key, value []byte) error {
	need := len(key) + len(value)
	if need > 1<<31 {
		return fmt.Errorf("sort %s: entry of %d bytes is too large", s.name, need)
	}
	if len(s.cur.idx) > 0 && s.cur.mem+s.cur.growth(need) > s.runLimit() {
		if err := s.spill(); err != nil {
			return err
		}
	}
	s.cur.add(key, value)
	s.bytes += int64(event.EntrySize(key, value))
	return nil
}

// growth is how much adding an entry of need bytes may add to b.mem.
func (b *runBuf) growth(need int) int {
	g := 0
	if len(b.idx) == cap(b.idx) {
		g += max(cap(b.idx), 1024) * spanSize
	}
	if b.used == 0 || len(b.slabs[b.used-1])+need > cap(b.slabs[b.used-1]) {
		g += max(need, slabSize)
	}
	return g
}

func (b *runBuf) add(key, value []byte) {
	need := len(key) + len(value)
	if b.used == 0 || len(b.slabs[b.used-1])+need > cap(b.slabs[b.used-1]) {
		b.nextSlab(need)
	}
	if len(b.idx) == cap(b.idx) {
		b.mem -= cap(b.idx) * spanSize
		b.idx = slices.Grow(b.idx, max(cap(b.idx), 1024))
		b.mem += cap(b.idx) * spanSize
	}
	i := b.used - 1
	sl := b.slabs[i]
	b.idx = append(b.idx, span{slab: uint32(i), off: uint32(len(sl)), klen: uint32(len(key)), vlen: uint32(len(value))})
	sl = append(sl, key...)
	b.slabs[i] = append(sl, value...)
}

// nextSlab makes an empty slab with room for need bytes current.
func (b *runBuf) nextSlab(need int) {
	if b.used < len(b.slabs) && cap(b.slabs[b.used]) >= need {
		b.mem += cap(b.slabs[b.used])
		b.used++
		return
	}
	sl := make([]byte, 0, max(need, slabSize))
	if b.used < len(b.slabs) {
		b.slabs[b.used] = sl // replaces a reusable slab too small for need
	} else {
		b.slabs = append(b.slabs, sl)
	}
	b.mem += cap(sl)
	b.used++
}

// reset empties b, keeping its index and its ordinary slabs for reuse.
func (b *runBuf) reset() {
	keep := b.slabs[:0]
	for _, sl := range b.slabs {
		if cap(sl) == slabSize {
			keep = append(keep, sl[:0])
		}
	}
	clear(b.slabs[len(keep):])
	b.slabs = keep
	b.used = 0
	b.idx = b.idx[:0]
	b.mem = cap(b.idx) * spanSize
}

func (b *runBuf) key(sp span) []byte {
	sl := b.slabs[sp.slab]
	return sl[sp.off : sp.off+sp.klen : sp.off+sp.klen]
}

func (b *runBuf) value(sp span) []byte {
	o := sp.off + sp.klen
	sl := b.slabs[sp.slab]
	return sl[o : o+sp.vlen : o+sp.vlen]
}

// sort sorts the index by key. It first finds the length of the prefix all
// keys share and caches the next 16 bytes of each key in its span, so that
// the comparisons read the index sequentially; only keys whose cached bytes
// tie are compared in the slabs.
func (b *runBuf) sort() {
	if len(b.idx) < 2 {
		return
	}
	first := b.key(b.idx[0])
	common := len(first)
	for _, sp := range b.idx[1:] {
		k := b.key(sp)
		n := min(common, len(k))
		c := 0
		for c < n && k[c] == first[c] {
			c++
		}
		common = c
		if common == 0 {
			break
		}
	}
	for i := range b.idx {
		sp := &b.idx[i]
		sp.p0, sp.p1 = keyPrefix(b.key(*sp)[common:])
	}
	slices.SortFunc(b.idx, func(x, y span) int {
		switch {
		case x.p0 != y.p0:
			return cmpUint(x.p0, y.p0)
		case x.p1 != y.p1:
			return cmpUint(x.p1, y.p1)
		}
		return bytes.Compare(b.key(x), b.key(y))
	})
}

// keyPrefix returns the first 16 bytes of k as two big-endian words, zero
// padded: ordering by them never contradicts the order of the keys.
func keyPrefix(k []byte) (uint64, uint64) {
	if len(k) >= 16 {
		return binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(k[8:])
	}
	var b [16]byte
	copy(b[:], k)
	return binary.BigEndian.Uint64(b[:]), binary.BigEndian.Uint64(b[8:])
}

func cmpUint(a, b uint64) int {
	if a < b {
		return -1
	}
	return 1
}

// spill hands the current buffer to a goroutine that sorts it and writes it
// as a run file, after the previous spill finished, and continues with the
// other buffer.
func (s *extSorter) spill() error {
	if err := s.wait(); err != nil {
		return err
	}
	buf := s.cur
	name := filepath.Join(s.dir, fmt.Sprintf("%s-%06d.run", s.name, len(s.runs)))
	s.runs = append(s.runs, name)
	s.spillc = make(chan spillDone, 1)
	go func(c chan<- spillDone) {
		buf.sort()
		c <- spillDone{buf: buf, name: name, err: writeRun(name, buf)}
	}(s.spillc)
	if s.spare == nil {
		s.spare = &runBuf{}
	}
	s.cur, s.spare = s.spare, nil
	return nil
}

// wait waits for the in-flight spill, if any, and makes its buffer the
// spare.
func (s *extSorter) wait() error {
	if s.spillc == nil {
		return nil
	}
	d := <-s.spillc
	s.spillc = nil
	d.buf.reset()
	s.spare = d.buf
	return d.err
}

// writeRun writes the sorted entries of b as framed entries to a new file.
func writeRun(name string, b *runBuf) error {
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("spill sorted run: %w", err)
	}
	w := bufio.NewWriterSize(f, 256<<10)
	var hdr [4]byte
	for _, sp := range b.idx {
		binary.LittleEndian.PutUint32(hdr[:], sp.klen)
		w.Write(hdr[:])
		w.Write(b.key(sp))
		binary.LittleEndian.PutUint32(hdr[:], sp.vlen)
		w.Write(hdr[:])
		w.Write(b.value(sp))
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("spill sorted run %s: %w", name, err)
	}
	return nil
}

// close waits for an in-flight spill; the sorter's run files are removed
// with the restore's temp dir.
func (s *extSorter) close() error { return s.wait() }

// iter returns an iterator over all entries in key order. The sorter must
// not be added to afterwards.
func (s *extSorter) iter() (sortedIter, error) {
	if err := s.wait(); err != nil {
		return nil, err
	}
	s.spare = nil // not needed any more: let it go
	s.cur.sort()
	mem := &memIter{b: s.cur}
	if len(s.runs) == 0 {
		return mem, nil
	}
	// The run readers' buffers share a quarter of the budget.
	bufSize := min(max(s.budget/2/len(s.runs), 16<<10), 256<<10)
	m := &mergeIter{}
	for _, name := range s.runs {
		f, err := os.Open(name)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("open sorted run: %w", err)
		}
		r := &runIter{f: f, r: event.NewEntryReader(bufio.NewReaderSize(f, bufSize))}
		r.r.SetMaxEntrySize(1 << 31)
		m.srcs = append(m.srcs, r)
	}
	m.srcs = append(m.srcs, mem)
	if err := m.init(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// sortedIter yields entries in key order; key and value are valid until the
// next call to next.
type sortedIter interface {
	next() (key, value []byte, ok bool, err error)
	Close() error
}

type memIter struct {
	b *runBuf
	i int
}

func (m *memIter) next() ([]byte, []byte, bool, error) {
	if m.i >= len(m.b.idx) {
		return nil, nil, false, nil
	}
	sp := m.b.idx[m.i]
	m.i++
	return m.b.key(sp), m.b.value(sp), true, nil
}

func (m *memIter) Close() error { return nil }

type runIter struct {
	f *os.File
	r *event.EntryReader
}

func (r *runIter) next() ([]byte, []byte, bool, error) {
	k, v, err := r.r.Next()
	if errors.Is(err, io.EOF) {
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("read sorted run %s: %w", r.f.Name(), err)
	}
	return k, v, true, nil
}

func (r *runIter) Close() error { return r.f.Close() }

// mergeIter merges sorted sources with a heap of their current heads.
type mergeIter struct {
	srcs []sortedIter
	h    headHeap
	last int // source whose head was returned last, to advance lazily
}

type head struct {
	key, value []byte
	src        int
}

type headHeap []head

func (h headHeap) Len() int { return len(h) }
func (h headHeap) Less(i, j int) bool {
	if c := bytes.Compare(h[i].key, h[j].key); c != 0 {
		return c < 0
	}
	return h[i].src < h[j].src
}
func (h headHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *headHeap) Push(x any)   { *h = append(*h, x.(head)) }
func (h *headHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (m *mergeIter) init() error {
	m.last = -1
	for i, s := range m.srcs {
		k, v, ok, err := s.next()
		if err != nil {
			return err
		}
		if ok {
			m.h = append(m.h, head{k, v, i})
		}
	}
	heap.Init(&m.h)
	return nil
}

func (m *mergeIter) next() ([]byte, []byte, bool, error) {
	if m.last >= 0 {
		// The previous head's slices stay valid until now; advance its source.
		k, v, ok, err := m.srcs[m.last].next()
		if err != nil {
			return nil, nil, false, err
		}
		if ok {
			m.h[0] = head{k, v, m.last}
			heap.Fix(&m.h, 0)
		} else {
			heap.Pop(&m.h)
		}
		m.last = -1
	}
	if len(m.h) == 0 {
		return nil, nil, false, nil
	}
	top := m.h[0]
	m.last = top.src
	return top.key, top.value, true, nil
}

func (m *mergeIter) Close() error {
	var errs []error
	for _, s := range m.srcs {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
