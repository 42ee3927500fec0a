package sink

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/flowlog/flowlog/event"
)

// SnapshotOptions says what Snapshot reads and writes.
type SnapshotOptions struct {
	// Bucket holds the backup; the snapshot's objects are written to it.
	Bucket Bucket
	// Flow is the flow snapshotted (see RestoreOptions.Flow).
	Flow Flow
	// MetaPaths are the flow's committed meta objects, listed after the
	// checkpoint that TS was checked against was read.
	MetaPaths []string
	// Snapshots are the flow's listed snapshots: the state is computed from
	// the newest one below TS of each table's window plus the log after it,
	// as Restore does.
	Snapshots []SnapshotRef
	// TruncatedBefore is the flow's truncation point, 0 if none.
	TruncatedBefore uint64
	// TS is the snapshot's ts; the caller checks it does not exceed the
	// checkpoint.
	TS uint64
	// Windows are the coverage windows that hold TS, by table: the tables
	// snapshotted. Each must hold TS.
	Windows map[int64]SnapshotWindow
	// TempDir holds sorted runs and the objects being built (default
	// os.TempDir()).
	TempDir string
	// MaxMemory and Parallel are as for Restore. The chunks being built
	// (two of ChunkSize) come on top.
	MaxMemory int64
	Parallel  int
	// ChunkSize is the uncompressed size a chunk is cut at (default 4 MiB).
	ChunkSize int
	// Progress, if set, is called from time to time while the state is
	// computed.
	Progress func(SnapshotProgress)
}

// SnapshotWindow is a table's coverage window: events with Since < ts <=
// Until, Until nil while the window is open.
type SnapshotWindow struct {
	Since uint64
	Until *uint64
}

// SnapshotProgress is how far a snapshot is.
type SnapshotProgress struct {
	Chunks, ChunksTotal int   // log chunks read, of those planned
	LogBytes            int64 // uncompressed log bytes read
	Keys                int64 // keys written
	Objects             int   // objects uploaded
}

// SnapshotStats summarises a snapshot.
type SnapshotStats struct {
	// RestoreStats is what was read and computed: Keys are the live keys
	// written, NoValue the keys recorded without a value.
	RestoreStats
	// MetaPath is the snapshot.meta object: list it with
	// meta.Store.AddSnapshot.
	MetaPath string
	Objects  int   // objects uploaded, snapshot.meta included
	Bytes    int64 // bytes uploaded
}

// Snapshot computes the MVCC state of o.Windows' tables at o.TS exactly as
// Restore does (same plan, same external sorts, same memory bound) and
// writes it as a snapshot (docs/FORMAT.md, "Snapshot objects"): per table
// one .snap object of zstd
// chunks of framed entries sorted by key (the data key at its commit ts
// and the resolved value; keys without a value in the backup go to
// no-value chunks), each uploaded with the DoesNotExist precondition and
// CRC32C, then snapshot.meta. The snapshot counts only once the caller
// lists MetaPath in Redis. A snapshot whose objects exist already (a
// crashed earlier attempt at the same ts) fails with an error wrapping
// ErrExists: such leftovers are garbage for gc.
func Snapshot(ctx context.Context, o SnapshotOptions) (SnapshotStats, error) {
	var st SnapshotStats
	if err := o.Flow.validate(); err != nil {
		return st, fmt.Errorf("snapshot: %w", err)
	}
	if len(o.Windows) == 0 {
		return st, errors.New("snapshot: no table to snapshot")
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = 4 << 20
	}
	ro := RestoreOptions{Bucket: o.Bucket, Flow: o.Flow, MetaPaths: o.MetaPaths, TS: o.TS, Windows: map[int64]TableWindow{},
		TempDir: o.TempDir, MaxMemory: o.MaxMemory, Parallel: o.Parallel, Snapshots: o.Snapshots, TruncatedBefore: o.TruncatedBefore}
	ro.defaults()
	for id, w := range o.Windows {
		if w.Since > o.TS || w.Until != nil && *w.Until < o.TS {
			return st, fmt.Errorf("snapshot: table %d: window does not hold %d", id, o.TS)
		}
		ro.Windows[id] = TableWindow{Since: w.Since, Until: o.TS}
	}
	plan, err := planRestore(ctx, &ro)
	if err != nil {
		return st, err
	}
	dir, err := os.MkdirTemp(o.TempDir, "flowlog-snapshot-")
	if err != nil {
		return st, fmt.Errorf("snapshot: temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if o.Progress != nil {
		ro.progress = func(rs RestoreStats) {
			o.Progress(SnapshotProgress{Chunks: rs.Chunks, ChunksTotal: plan.chunks, LogBytes: rs.LogBytes, Keys: rs.Keys, Objects: st.Objects})
		}
	}
	w := &snapWriter{ctx: ctx, o: &o, dir: dir, done: map[int64]SnapshotTable{}, st: &st, total: plan.chunks}
	defer w.abort()
	if err := mvccRead(ctx, ro, plan, w, &st.RestoreStats); err != nil {
		return st, err
	}
	st.Tables = len(w.done)
	m := SnapshotMeta{Version: 1, Flow: o.Flow.Catalog + "/" + o.Flow.Name, FlowID: o.Flow.ID, TS: o.TS}
	for _, id := range slices.Sorted(mapKeys(w.done)) {
		t := w.done[id]
		t.Since, t.Until = o.Windows[id].Since, o.Windows[id].Until
		m.Tables = append(m.Tables, t)
	}
	// A snapshot that took longer than gc's grace period may have lost
	// its first objects to gc before it is listed: check before listing.
	for _, t := range m.Tables {
		if _, err := o.Bucket.Size(ctx, t.DataPath); err != nil {
			return st, fmt.Errorf("snapshot: %s, uploaded by this snapshot, is gone (was the snapshot slower than gc's --grace?): %w", t.DataPath, err)
		}
	}
	raw, err := EncodeSnapshotMeta(m)
	if err != nil {
		return st, fmt.Errorf("snapshot: %w", err)
	}
	path := SnapshotMetaPath(o.Flow.Prefix, o.Flow.Catalog, o.Flow.Name, o.Flow.ID, o.TS)
	if err := uploadRetry(ctx, o.Bucket, path, func() (Object, func(), error) {
		return Object{Name: path, Body: bytes.NewReader(raw), Size: int64(len(raw)), CRC32C: CRC32C(raw)}, func() {}, nil
	}); err != nil {
		return st, err
	}
	st.Objects++
	st.Bytes += int64(len(raw))
	st.MetaPath = path
	return st, nil
}

func mapKeys[V any](m map[int64]V) func(func(int64) bool) {
	return func(yield func(int64) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// snapWriter writes the .snap objects as the MVCC read hands it the keys:
// one table at a time, each into a temp file, uploaded when the table ends.
type snapWriter struct {
	ctx  context.Context
	o    *SnapshotOptions
	dir  string
	cur  *snapObject
	done map[int64]SnapshotTable
	st   *SnapshotStats
	// total is the number of log chunks planned, for progress.
	total int
}

// snapObject is the .snap object of one table being built.
type snapObject struct {
	id     int64
	name   string // temp file
	f      *os.File
	bw     *bufio.Writer
	w      *ObjectWriter
	vals   []byte // framed entries of the value chunk being filled
	novals []byte // and of the no-value chunk
	nv, nn int64  // their entries
	t      SnapshotTable
}

func (s *snapWriter) object(tid int64) (*snapObject, error) {
	if s.cur != nil && s.cur.id == tid {
		return s.cur, nil
	}
	if err := s.finishTable(); err != nil {
		return nil, err
	}
	if _, ok := s.done[tid]; ok {
		return nil, fmt.Errorf("snapshot: table %d: keys out of order", tid)
	}
	name := filepath.Join(s.dir, strconv.FormatInt(tid, 10)+".snap")
	f, err := os.Create(name)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	bw := bufio.NewWriterSize(f, 256<<10)
	w, err := NewObjectWriter(bw, CompressionZstd)
	if err != nil {
		f.Close()
		return nil, err
	}
	s.cur = &snapObject{id: tid, name: name, f: f, bw: bw, w: w,
		t: SnapshotTable{TableID: tid, DataPath: SnapshotTablePath(s.o.Flow.Prefix, s.o.Flow.Catalog, s.o.Flow.Name, s.o.Flow.ID, s.o.TS, tid)}}
	return s.cur, nil
}

func (s *snapWriter) live(tid int64, _, dataKey []byte, _ uint64, val []byte) error {
	o, err := s.object(tid)
	if err != nil {
		return err
	}
	o.vals = event.AppendEntry(o.vals, dataKey, val)
	o.nv++
	if len(o.vals) >= s.o.ChunkSize {
		return o.flush(false)
	}
	return nil
}

func (s *snapWriter) noValue(tid int64, dataKey []byte) error {
	o, err := s.object(tid)
	if err != nil {
		return err
	}
	o.novals = event.AppendEntry(o.novals, dataKey, nil)
	o.nn++
	if len(o.novals) >= s.o.ChunkSize {
		return o.flush(true)
	}
	return nil
}

// table makes sure a table without keys gets its (empty) object.
func (s *snapWriter) table(tid int64) error {
	if _, ok := s.done[tid]; ok {
		return nil
	}
	if _, err := s.object(tid); err != nil {
		return err
	}
	return s.finishTable()
}

func (s *snapWriter) finish() error { return s.finishTable() }

// flush writes the value (or no-value) chunk being filled.
func (o *snapObject) flush(noValue bool) error {
	buf, n := o.vals, o.nv
	if noValue {
		buf, n = o.novals, o.nn
	}
	if n == 0 {
		return nil
	}
	off, length, rawLen, err := o.w.AddChunk(bytes.NewReader(buf))
	if err != nil {
		return fmt.Errorf("snapshot: table %d: %w", o.id, err)
	}
	sum := sha256.Sum256(buf)
	first, _, _, _ := event.NextEntry(buf)
	o.t.Chunks = append(o.t.Chunks, SnapshotChunk{NoValue: noValue, Offset: off, Length: length, RawLength: rawLen,
		SHA256: hex.EncodeToString(sum[:]), NumberOfEntries: n, MinKey: hex.EncodeToString(first), MaxKey: hex.EncodeToString(lastKey(buf))})
	if noValue {
		o.novals, o.nn = o.novals[:0], 0
	} else {
		o.vals, o.nv = o.vals[:0], 0
	}
	return nil
}

// lastKey returns the key of the last entry of framed entries.
func lastKey(b []byte) []byte {
	var last []byte
	for len(b) > 0 {
		k, _, rest, err := event.NextEntry(b)
		if err != nil {
			return last
		}
		last, b = k, rest
	}
	return last
}

// finishTable writes the rest of the current table's chunks and uploads
// its object.
func (s *snapWriter) finishTable() error {
	o := s.cur
	if o == nil {
		return nil
	}
	s.cur = nil
	defer os.Remove(o.name)
	err := o.flush(false)
	if err == nil {
		err = o.flush(true)
	}
	if err == nil {
		err = o.bw.Flush()
	}
	if cerr := o.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("snapshot: %w", cerr)
	}
	if err != nil {
		return err
	}
	size, crc := o.w.Size(), o.w.CRC32C()
	err = uploadRetry(s.ctx, s.o.Bucket, o.t.DataPath, func() (Object, func(), error) {
		f, err := os.Open(o.name)
		if err != nil {
			return Object{}, nil, fmt.Errorf("snapshot: %w", err)
		}
		return Object{Name: o.t.DataPath, Body: f, Size: size, CRC32C: crc}, func() { f.Close() }, nil
	})
	if err != nil {
		return err
	}
	s.st.Objects++
	s.st.Bytes += size
	s.done[o.id] = o.t
	if s.o.Progress != nil {
		s.o.Progress(SnapshotProgress{Chunks: s.st.Chunks, ChunksTotal: s.total, LogBytes: s.st.LogBytes, Keys: s.st.Keys, Objects: s.st.Objects})
	}
	return nil
}

// abort closes the object being built after a failure.
func (s *snapWriter) abort() {
	if s.cur != nil {
		s.cur.f.Close()
		os.Remove(s.cur.name)
		s.cur = nil
	}
}

// uploadRetry uploads the object obj returns, retrying a failed upload
// with backoff (a fresh body each time), but not one that found the object
// existing.
func uploadRetry(ctx context.Context, b Bucket, name string, obj func() (Object, func(), error)) error {
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		o, done, err := obj()
		if err != nil {
			return err
		}
		err = b.Upload(ctx, o)
		done()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrExists):
			return fmt.Errorf("snapshot: upload %s: %w (a leftover of an earlier attempt at the same ts: pick another --ts, or let gc remove it)", name, err)
		case attempt == 5 || ctx.Err() != nil:
			return fmt.Errorf("snapshot: upload %s (attempt %d): %w", name, attempt, err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff *= 2
	}
}
