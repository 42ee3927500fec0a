package meta

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// The tables of a pending step live in two Redis strings,
// coverage:<id>:step:<seq>:add and :del, each the sorted table ids as
// big-endian uint32s: 4 bytes a table, written once by the DDL's MULTI and
// read in chunks of stepChunk tables, so that neither the DDL nor the
// finalizer holds more than a chunk of a 100,000-table step at once.

// Kinds of a step's table list.
const (
	stepAdd = "add"
	stepDel = "del"
)

// stepChunk is how many tables one read of a step's list returns.
const stepChunk = 4096

// packTables encodes sorted table ids as big-endian uint32s.
func packTables(ts []uint32) string {
	b := make([]byte, 0, 4*len(ts))
	for _, t := range ts {
		b = binary.BigEndian.AppendUint32(b, t)
	}
	return string(b)
}

// tableStream reads the sorted tables of one step's list.
type tableStream struct {
	rdb    redis.Cmdable
	key    string
	n      int      // tables in the list
	read   int      // tables read so far
	buf    []uint32 // the chunk being read
	inline []uint32 // a legacy entry's table, in place of a key
}

// stepStream is the list kind of step e of flow id.
func (s *Store) stepStream(id FlowID, e CoverageEntry, kind string) *tableStream {
	st := &tableStream{rdb: s.rdb, key: s.keys.CoverageStep(id, e.Seq, kind), n: e.Added}
	if kind == stepDel {
		st.n = e.Removed
	}
	if e.legacy != nil {
		st.key, st.n = "", 0
		if (kind == stepAdd) == (e.legacy.Kind == legacySince) {
			st.inline = []uint32{e.legacy.Table}
		}
	}
	return st
}

// next returns the next table, and false at the end.
func (st *tableStream) next(ctx context.Context) (uint32, bool, error) {
	if len(st.inline) > 0 {
		t := st.inline[0]
		st.inline = st.inline[1:]
		return t, true, nil
	}
	if len(st.buf) == 0 {
		if st.read >= st.n || st.key == "" {
			return 0, false, nil
		}
		k := min(stepChunk, st.n-st.read)
		b, err := st.rdb.GetRange(ctx, st.key, int64(4*st.read), int64(4*(st.read+k))-1).Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, false, fmt.Errorf("getrange %s: %w", st.key, err)
		}
		if len(b) != 4*k {
			return 0, false, fmt.Errorf("%s: %d bytes at table %d, want %d", st.key, len(b), st.read, 4*k)
		}
		st.buf = st.buf[:0]
		for i := 0; i < len(b); i += 4 {
			st.buf = append(st.buf, binary.BigEndian.Uint32(b[i:]))
		}
		st.read += k
	}
	t := st.buf[0]
	st.buf = st.buf[1:]
	return t, true, nil
}

// seek skips the tables up to and including after.
func (st *tableStream) seek(ctx context.Context, after uint32) error {
	if after == 0 {
		return nil
	}
	if st.key == "" {
		for len(st.inline) > 0 && st.inline[0] <= after {
			st.inline = st.inline[1:]
		}
		return nil
	}
	// Binary search over the packed list for the first table > after.
	lo, hi := 0, st.n
	for lo < hi {
		mid := (lo + hi) / 2
		b, err := st.rdb.GetRange(ctx, st.key, int64(4*mid), int64(4*mid+3)).Bytes()
		if err != nil || len(b) != 4 {
			return fmt.Errorf("getrange %s at table %d: %d bytes, %v", st.key, mid, len(b), err)
		}
		if binary.BigEndian.Uint32(b) <= after {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	st.read, st.buf = lo, nil
	return nil
}

// Net changes of a cell.
const (
	netAdded   = 1
	netRemoved = -1
)

// tableChange is one table's net change over a cell.
type tableChange struct {
	table uint32
	net   int // netAdded or netRemoved
}

// cellMerge yields, in table order, the net change of each table over a
// cell of steps: k-way merges their sorted add and del lists and, per
// table, compares the first and the last of its changes (they alternate):
// removed first and added last, or added first and removed last, is no
// change at all.
type cellMerge struct {
	h mergeHeap
}

type mergeItem struct {
	table uint32
	step  int // position in the cell, which orders a table's changes
	op    int // netAdded or netRemoved
	st    *tableStream
}

// mergeHeap is a min-heap of mergeItems by (table, step), kept by hand
// so that popping one (ten million of them for a storm's cell) allocates
// nothing.
type mergeHeap []mergeItem

func (h mergeHeap) less(i, j int) bool {
	return h[i].table < h[j].table || h[i].table == h[j].table && h[i].step < h[j].step
}

func (h *mergeHeap) push(it mergeItem) {
	*h = append(*h, it)
	for i := len(*h) - 1; i > 0; {
		up := (i - 1) / 2
		if !h.less(i, up) {
			break
		}
		(*h)[i], (*h)[up] = (*h)[up], (*h)[i]
		i = up
	}
}

func (h *mergeHeap) pop() mergeItem {
	old := *h
	top := old[0]
	n := len(old) - 1
	old[0] = old[n]
	*h = old[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(l, m) {
			m = l
		}
		if r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		(*h)[i], (*h)[m] = (*h)[m], (*h)[i]
		i = m
	}
	return top
}

// newCellMerge starts the merge of steps (in order) after table after.
func (s *Store) newCellMerge(ctx context.Context, id FlowID, steps []CoverageEntry, after uint32) (*cellMerge, error) {
	m := &cellMerge{}
	for i, e := range steps {
		for _, kind := range []string{stepAdd, stepDel} {
			st := s.stepStream(id, e, kind)
			if err := st.seek(ctx, after); err != nil {
				return nil, err
			}
			op := netAdded
			if kind == stepDel {
				op = netRemoved
			}
			if err := m.push(ctx, mergeItem{step: i, op: op, st: st}); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// push reads the next table of it.st into the heap, if there is one.
func (m *cellMerge) push(ctx context.Context, it mergeItem) error {
	t, ok, err := it.st.next(ctx)
	if err != nil || !ok {
		return err
	}
	it.table = t
	m.h.push(it)
	return nil
}

// next returns the next table with a net change, and false at the end.
func (m *cellMerge) next(ctx context.Context) (tableChange, bool, error) {
	for len(m.h) > 0 {
		first := m.h.pop()
		last := first
		if err := m.push(ctx, first); err != nil {
			return tableChange{}, false, err
		}
		for len(m.h) > 0 && m.h[0].table == first.table {
			last = m.h.pop()
			if err := m.push(ctx, last); err != nil {
				return tableChange{}, false, err
			}
		}
		if first.op == last.op {
			return tableChange{table: first.table, net: first.op}, true, nil
		}
	}
	return tableChange{}, false, nil
}
