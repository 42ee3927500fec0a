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

// extSorter sorts (key, value) entries by key bytes in bounded memory: it
// buffers entries in one arena and, when the arena passes its budget, sorts
// it and spills it as a run file; iterating merges the runs (k-way) with
// what is still in memory. Entries with equal keys come out in an
// unspecified order. It is not safe for concurrent use.
type extSorter struct {
	dir    string
	name   string
	budget int
	arena  []byte
	idx    []span
	runs   []string
	bytes  int64 // framed bytes added, for stats
}

// span indexes one entry of the arena. p0 and p1 cache 16 key bytes from
// the arena's common key prefix on (zero padded), so that most comparisons
// of a sort stay in the index instead of missing the cache on two random
// arena offsets; they are filled by sortMem.
type span struct {
	p0, p1 uint64
	off    uint32 // of the key in arena
	klen   uint32
	vlen   uint32
}

// spanSize is the memory of one index element (with padding).
const spanSize = int(unsafe.Sizeof(span{}))

func newExtSorter(dir, name string, budget int) *extSorter {
	budget = max(budget, 1<<20)
	return &extSorter{dir: dir, name: name, budget: budget}
}

func (s *extSorter) add(key, value []byte) error {
	need := len(key) + len(value)
	if len(s.arena) > 0 && (len(s.arena)+need+spanSize*(len(s.idx)+1) > s.budget || len(s.arena)+need > 1<<32-1) {
		if err := s.spill(); err != nil {
			return err
		}
	}
	if len(s.arena)+need > cap(s.arena) {
		// Grow by hand, never past the budget (append would double).
		c := min(max(2*cap(s.arena), 4<<20, len(s.arena)+need), max(s.budget, len(s.arena)+need))
		a := make([]byte, len(s.arena), c)
		copy(a, s.arena)
		s.arena = a
	}
	s.idx = append(s.idx, span{off: uint32(len(s.arena)), klen: uint32(len(key)), vlen: uint32(len(value))})
	s.arena = append(s.arena, key...)
	s.arena = append(s.arena, value...)
	s.bytes += int64(event.EntrySize(key, value))
	return nil
}

func (s *extSorter) key(sp span) []byte {
	return s.arena[sp.off : sp.off+sp.klen : sp.off+sp.klen]
}

func (s *extSorter) value(sp span) []byte {
	o := sp.off + sp.klen
	return s.arena[o : o+sp.vlen : o+sp.vlen]
}

// sortMem sorts the index by key. It first finds the length of the prefix
// all keys share and caches the next 16 bytes of each key in its span, so
// that the comparisons read the index sequentially; only keys whose cached
// bytes tie are compared in the arena.
func (s *extSorter) sortMem() {
	if len(s.idx) < 2 {
		return
	}
	first := s.key(s.idx[0])
	common := len(first)
	for _, sp := range s.idx[1:] {
		k := s.key(sp)
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
	for i := range s.idx {
		sp := &s.idx[i]
		sp.p0, sp.p1 = keyPrefix(s.key(*sp)[common:])
	}
	slices.SortFunc(s.idx, func(a, b span) int {
		switch {
		case a.p0 != b.p0:
			return cmpUint(a.p0, b.p0)
		case a.p1 != b.p1:
			return cmpUint(a.p1, b.p1)
		}
		return bytes.Compare(s.key(a), s.key(b))
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

// spill writes the sorted arena as a run file and empties it.
func (s *extSorter) spill() error {
	s.sortMem()
	name := filepath.Join(s.dir, fmt.Sprintf("%s-%06d.run", s.name, len(s.runs)))
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("spill sorted run: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var hdr [4]byte
	for _, sp := range s.idx {
		binary.LittleEndian.PutUint32(hdr[:], sp.klen)
		w.Write(hdr[:])
		w.Write(s.key(sp))
		binary.LittleEndian.PutUint32(hdr[:], sp.vlen)
		w.Write(hdr[:])
		w.Write(s.value(sp))
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("spill sorted run %s: %w", name, err)
	}
	s.runs = append(s.runs, name)
	s.arena = s.arena[:0]
	s.idx = s.idx[:0]
	return nil
}

// iter returns an iterator over all entries in key order. The sorter must
// not be added to afterwards.
func (s *extSorter) iter() (sortedIter, error) {
	s.sortMem()
	mem := &memIter{s: s}
	if len(s.runs) == 0 {
		return mem, nil
	}
	m := &mergeIter{}
	for _, name := range s.runs {
		f, err := os.Open(name)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("open sorted run: %w", err)
		}
		r := &runIter{f: f, r: event.NewEntryReader(bufio.NewReaderSize(f, 256<<10))}
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
	s *extSorter
	i int
}

func (m *memIter) next() ([]byte, []byte, bool, error) {
	if m.i >= len(m.s.idx) {
		return nil, nil, false, nil
	}
	sp := m.s.idx[m.i]
	m.i++
	return m.s.key(sp), m.s.value(sp), true, nil
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
