package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/flowlog/flowlog/event"
)

// SnapshotRef is a listed snapshot (meta.Store.Snapshots): its ts and the
// full name of its snapshot.meta.
type SnapshotRef struct {
	TS   uint64
	Path string
}

// snapshotBase is the snapshot a table is restored from.
type snapshotBase struct {
	ts    uint64
	path  string // of the snapshot.meta
	table SnapshotTable
}

// maxSnapshotMetaSize bounds a snapshot.meta: a few hundred bytes per chunk.
const maxSnapshotMetaSize = 64 << 20

// ReadSnapshotMeta reads the snapshot.meta of ref and checks that it
// belongs to flow f: its flow, flow id and ts match, it lies where f's
// snapshot at ref.TS lies, and so does every table's data object. Any
// problem is an error wrapping ErrBadSnapshotMeta, or ErrNotExist for a
// missing object.
func ReadSnapshotMeta(ctx context.Context, b Bucket, f Flow, ref SnapshotRef) (SnapshotMeta, error) {
	want := SnapshotMetaPath(f.Prefix, f.Catalog, f.Name, f.ID, ref.TS)
	if ref.Path != want {
		return SnapshotMeta{}, fmt.Errorf("snapshot %s: %w: not the path of %s's snapshot at %d (%s)", ref.Path, ErrBadSnapshotMeta, f, ref.TS, want)
	}
	rc, err := b.Get(ctx, ref.Path)
	if err != nil {
		return SnapshotMeta{}, fmt.Errorf("read snapshot meta: %w", err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, maxSnapshotMetaSize+1))
	if err != nil {
		return SnapshotMeta{}, fmt.Errorf("read snapshot meta %s: %w", ref.Path, err)
	}
	if len(raw) > maxSnapshotMetaSize {
		return SnapshotMeta{}, fmt.Errorf("snapshot %s: %w: larger than %d MiB", ref.Path, ErrBadSnapshotMeta, maxSnapshotMetaSize>>20)
	}
	m, err := DecodeSnapshotMeta(raw)
	if err != nil {
		return SnapshotMeta{}, fmt.Errorf("snapshot %s: %w", ref.Path, err)
	}
	var errs []error
	if m.Flow != f.Catalog+"/"+f.Name || m.FlowID != f.ID || m.TS != ref.TS {
		errs = append(errs, fmt.Errorf("it is of flow %q (id %d) at %d, not %s at %d", m.Flow, m.FlowID, m.TS, f, ref.TS))
	}
	for _, t := range m.Tables {
		if want := SnapshotTablePath(f.Prefix, f.Catalog, f.Name, f.ID, m.TS, t.TableID); t.DataPath != want {
			errs = append(errs, fmt.Errorf("table %d: data_path %q, want %q", t.TableID, t.DataPath, want))
		}
	}
	if len(errs) > 0 {
		return SnapshotMeta{}, fmt.Errorf("snapshot %s: %w: %w", ref.Path, ErrBadSnapshotMeta, errors.Join(errs...))
	}
	return m, nil
}

// pickBases picks, for every table of o.Windows, the newest snapshot at or
// below o.TS that was cut from the table's window (same since). Snapshot
// metas are read newest first, and only as long as a table still lacks one
// that an older snapshot could hold.
func pickBases(ctx context.Context, o RestoreOptions) (map[int64]snapshotBase, error) {
	bases := map[int64]snapshotBase{}
	if o.Windows == nil {
		return bases, nil
	}
	refs := slices.Clone(o.Snapshots)
	slices.SortStableFunc(refs, func(a, b SnapshotRef) int {
		switch {
		case a.TS > b.TS:
			return -1
		case a.TS < b.TS:
			return 1
		}
		return 0
	})
	for _, ref := range refs {
		if ref.TS > o.TS {
			continue
		}
		need := false
		for id, w := range o.Windows {
			if _, ok := bases[id]; !ok && w.Since <= ref.TS && o.selected(id) {
				need = true
				break
			}
		}
		if !need {
			break // older snapshots lie further below every window left
		}
		m, err := ReadSnapshotMeta(ctx, o.Bucket, o.Flow, ref)
		if err != nil {
			return nil, err
		}
		for _, t := range m.Tables {
			w, ok := o.Windows[t.TableID]
			if _, done := bases[t.TableID]; !ok || done || t.Since != w.Since || !o.selected(t.TableID) {
				continue
			}
			bases[t.TableID] = snapshotBase{ts: ref.TS, path: ref.Path, table: t}
		}
	}
	return bases, nil
}

// snapIter yields the entries of the tables' snapshots in data key order
// (only the chunks that overlap the restore's key range are read):
// tables in table id order (the order of their keys), each table's value
// chunks merged with its no-value chunks. Each kind is read ahead by a
// goroutine of its own, chunk after chunk, in batches of entries; every
// chunk's sha256 and entry count are checked, and keys must increase.
type snapIter struct {
	vals, novals *snapSeq
}

func newSnapIter(ctx context.Context, o RestoreOptions, bases map[int64]snapshotBase) *snapIter {
	ids := make([]int64, 0, len(bases))
	for id := range bases {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var vals, novals []chunkJob
	for _, id := range ids {
		t := bases[id].table
		for i, c := range t.Chunks {
			if !o.keys.overlaps(c.MinKey, c.MaxKey) {
				continue // none of its keys is restored
			}
			j := chunkJob{path: t.DataPath, index: i, f: c.fileMeta(id)}
			if c.NoValue {
				novals = append(novals, j)
			} else {
				vals = append(vals, j)
			}
		}
	}
	limit := maxEntrySize(o.MaxMemory)
	return &snapIter{vals: newSnapSeq(ctx, o.Bucket, vals, limit, o.Parallel), novals: newSnapSeq(ctx, o.Bucket, novals, limit, 1)}
}

// fileMeta is c as the chunk readers take it.
func (c SnapshotChunk) fileMeta(table int64) FileMeta {
	return FileMeta{Offset: c.Offset, Length: c.Length, RawLength: c.RawLength, Compression: CompressionZstd,
		SHA256: c.SHA256, NumberOfEntries: c.NumberOfEntries, TableID: table}
}

// next returns the next entry, whether it is a no-value entry, and its
// table.
func (s *snapIter) next() (key, value []byte, noValue bool, table int64, ok bool, err error) {
	if err := s.vals.peek(); err != nil {
		return nil, nil, false, 0, false, err
	}
	if err := s.novals.peek(); err != nil {
		return nil, nil, false, 0, false, err
	}
	seq := s.vals
	switch {
	case !s.vals.ok && !s.novals.ok:
		return nil, nil, false, 0, false, nil
	case !s.vals.ok || s.novals.ok && bytes.Compare(s.novals.key, s.vals.key) < 0:
		seq = s.novals
	}
	seq.taken = true
	return seq.key, seq.value, seq == s.novals, seq.table, true, nil
}

// Close stops the readers.
func (s *snapIter) Close() error {
	s.vals.close()
	s.novals.close()
	return nil
}

// snapSeq reads a sequence of snapshot chunks in order, up to parallel of
// them at once: each chunk has its own channel of batches, and the chunks'
// channels come in order. An oversized batch (an entry larger than a batch)
// may only be built by the chunk being consumed: each chunk's big token
// starts taken and is handed over when the chunk becomes the head, so at
// most one oversized batch exists at a time and a later chunk waiting for
// the token never blocks the head.
type snapSeq struct {
	cancel context.CancelFunc
	chunks chan *snapChunk
	errc   chan error
	cur    *snapChunk
	batch  entryBatch
	bbig   chan struct{} // big token of the chunk batch came from
	have   bool          // batch is held
	rest   []byte
	// head
	key, value []byte
	table      int64
	ok         bool
	taken      bool // the head was returned: advance on the next peek
	started    bool
	prev       []byte
}

// snapChunk is one chunk being read.
type snapChunk struct {
	out chan entryBatch
	big chan struct{}
}

func newSnapSeq(parent context.Context, b Bucket, jobs []chunkJob, limit, parallel int) *snapSeq {
	ctx, cancel := context.WithCancel(parent)
	s := &snapSeq{cancel: cancel, chunks: make(chan *snapChunk, parallel), errc: make(chan error, 1)}
	go func() {
		var wg sync.WaitGroup
		defer func() { wg.Wait(); close(s.chunks) }()
		sem := make(chan struct{}, parallel)
		for _, j := range jobs {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			c := &snapChunk{out: make(chan entryBatch, 2), big: make(chan struct{}, 1)}
			c.big <- struct{}{} // taken until the chunk is the head
			select {
			case s.chunks <- c:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				defer close(c.out)
				cs := chunkStream{ctx: ctx, job: j, out: c.out, big: c.big, limit: limit}
				if err := cs.run(b); err != nil {
					select {
					case s.errc <- err:
					default:
					}
					cancel()
				}
			}()
		}
	}()
	return s
}

// peek makes sure the head is the next entry not yet returned.
func (s *snapSeq) peek() error {
	if s.started && !s.taken {
		return nil
	}
	s.started, s.taken = true, false
	for len(s.rest) == 0 {
		s.release()
		if s.cur == nil {
			c, ok := <-s.chunks
			if !ok {
				return s.end()
			}
			<-c.big // the head may build an oversized batch
			s.cur = c
		}
		b, ok := <-s.cur.out
		if !ok {
			s.cur = nil
			if err := s.failed(); err != nil {
				return err
			}
			continue
		}
		s.batch, s.bbig, s.have, s.rest = b, s.cur.big, true, b.data
	}
	k, v, r, err := event.NextEntry(s.rest)
	if err != nil {
		return fmt.Errorf("chunk %d of %s: %w", s.batch.job.index, s.batch.job.path, err)
	}
	if s.prev != nil && bytes.Compare(k, s.prev) <= 0 {
		return &ChecksumError{Object: s.batch.job.path, Chunk: s.batch.job.index, Offset: s.batch.job.f.Offset,
			Err: errors.New("snapshot keys do not increase")}
	}
	s.prev = append(s.prev[:0], k...)
	s.rest = r
	s.key, s.value, s.table, s.ok = k, v, s.batch.job.f.TableID, true
	return nil
}

// failed returns a reader's error, if one failed.
func (s *snapSeq) failed() error {
	select {
	case err := <-s.errc:
		return err
	default:
		return nil
	}
}

// end is the end of the chunks: an error if a reader failed.
func (s *snapSeq) end() error {
	if err := s.failed(); err != nil {
		return err
	}
	s.ok = false
	return nil
}

// release gives the current batch back.
func (s *snapSeq) release() {
	if !s.have {
		return
	}
	putBatchBuf(s.batch.data)
	if s.batch.big {
		<-s.bbig
	}
	s.have = false
}

// close stops the readers and waits for them.
func (s *snapSeq) close() {
	s.cancel()
	s.release()
	drain := func(c *snapChunk) {
		for b := range c.out {
			putBatchBuf(b.data)
		}
	}
	if s.cur != nil {
		drain(s.cur)
	}
	for c := range s.chunks {
		drain(c)
	}
}
