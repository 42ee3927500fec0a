package sink

import (
	"context"
	"fmt"
	"os"

	"github.com/flowlog/flowlog/event"
)

// RestoreOptions says what Restore reads and where it writes.
type RestoreOptions struct {
	// Bucket holds the backup.
	Bucket Bucket
	// Flow is the flow restored: a meta of another flow, or one whose
	// data_path lies outside the flow's directory, fails the restore.
	Flow Flow
	// MetaPaths are the flow's committed meta objects (metas:<flow_id>),
	// listed after the checkpoint that TS was checked against was read.
	MetaPaths []string
	// TS is the timestamp to restore as of; the caller checks it does not
	// exceed the flow's checkpoint.
	TS uint64
	// Tables restricts the restore to these table ids; nil means all.
	Tables map[int64]bool
	// Keys restricts the restore to the raw keys of this range (the zero
	// KeyRange: all); an empty range fails with an error wrapping
	// ErrEmptyKeyRange. A table none of whose keys lies in it is not
	// restored, and gets no file even if listed in Tables; only the log
	// chunks and snapshot chunks whose key range overlaps it are read, and
	// only the keys in it are written.
	Keys KeyRange
	// Windows, when not nil, restricts the restore to these tables and
	// each table to the events of its coverage window (docs/FORMAT.md,
	// "Coverage rule"): only
	// events with Since < ts <= Until are read. A put whose default-CF
	// value was prewritten at or before Since has no value in the backup:
	// its key is left out and counted in RestoreStats.NoValue.
	Windows map[int64]TableWindow
	// OutDir receives <table_id>.jsonl per table, each created afresh
	// (never through a symbolic link) with mode 0600; OutDir is created with
	// mode 0700 if missing. A non-empty OutDir fails with ErrOutDirNotEmpty
	// unless Force is set. The tables appear only when the restore
	// succeeds: one that fails or whose ctx ends leaves OutDir as it was
	// (see outDir).
	OutDir string
	// Force allows a non-empty OutDir: its <table_id>.jsonl entries (files
	// or links, never what a link points to) are replaced or removed once
	// the restore succeeded, so that it holds only this restore's tables;
	// other entries are left alone.
	Force bool
	// TempDir holds sorted runs while restoring (default os.TempDir()).
	TempDir string
	// MaxMemory bounds what the restore buffers (default 256 MiB): the
	// chunk readers' batches come out of it and the rest holds the sorted
	// runs of write records and default-CF values before they are spilled
	// to TempDir. The Go runtime and zstd decoders (at most an 8 MiB window
	// each) come on top, and so does one entry larger than a batch at a
	// time. An entry may not exceed a quarter of MaxMemory (at least 32 MiB,
	// at most 256 MiB): see EntryTooLargeError.
	MaxMemory int64
	// Parallel is the number of chunks read at once (default 4).
	Parallel int
	// Snapshots are the flow's listed snapshots (snapshots:<flow_id>).
	// With Windows set, each table is read from the newest one at or below
	// TS that was cut from the table's window (same since), plus the log
	// after it (docs/FORMAT.md, "Restore rule"); the result is the same as
	// from the log alone.
	Snapshots []SnapshotRef
	// TruncatedBefore is the flow's truncation point (truncated_before),
	// 0 if none: a TS below it, or a table that needs the log before it,
	// fails with a *TruncatedError.
	TruncatedBefore uint64

	// Progress, if set, is called after every chunk read and every 65,536
	// keys written, on the restore's goroutine.
	Progress func(RestoreProgress)

	// progress, if set, is called after every chunk read.
	progress func(RestoreStats)
	// keys is Keys encoded, set by defaults.
	keys encRange
}

// RestoreStats summarises a restore.
type RestoreStats struct {
	Tables   int   // jsonl files written
	Keys     int64 // live keys written
	LogBytes int64 // uncompressed chunk bytes read and checked
	Chunks   int   // chunks read
	// NoValue counts keys left out because their value was prewritten
	// before the table's coverage window (see RestoreOptions.Windows).
	NoValue int64
	// FromSnapshot counts the tables read from a snapshot plus the log
	// after it; SnapshotTS is the ts of the newest snapshot used.
	FromSnapshot int
	SnapshotTS   uint64
}

// TableWindow is the part of a table's coverage window a restore reads:
// events with Since < ts <= Until (Until already capped at the restore ts).
type TableWindow struct {
	Since, Until uint64
}

// Restore rebuilds tables as of o.TS from a flow's backup, as TiKV reads
// MVCC data: for each key the newest write-CF record with commit ts <= TS,
// skipping lock and rollback records; a delete means the key is absent; a
// put's value is its short value, else the default-CF entry at (key,
// start_ts). It writes OutDir/<table_id>.jsonl, one line per live key in raw
// key order: {"key": hex, "value": base64, "commit_ts": N}. There is a file
// (possibly empty) for every table in o.Tables and every table with a
// write-CF record at or below TS; a table with none has no file.
//
// Every meta must belong to o.Flow and pass Meta.Validate (which refuses a
// raw_length its stored bytes cannot hold) before any chunk is read. If no
// write-CF chunk of the restored tables starts at or below TS, Restore
// fails with a *NoDataError and writes nothing.
//
// Only the chunks that can matter are read, each with one range read and its
// sha256 checked: not meta-key chunks, not chunks of other tables, not chunks
// whose start_key..end_key lies outside o.Keys, not chunks whose min_ts is
// past TS, and not delete-op chunks (a CF delete carries no write record;
// TiKV emits them only for garbage-collected versions). Of a snapshot, only
// the chunks of the restored tables whose min_key..max_key overlaps o.Keys
// are read. So what a selective restore reads follows the data selected,
// not the flow (docs/RESTORE.md, "Selective restore").
// Memory stays bounded: write records and default-CF values go through
// external sorts keyed by the stored data key (memcomparable raw key, then
// ts descending) and are merge-joined, so no table is held in memory.
//
// With o.Windows and o.Snapshots set, a table with a snapshot at S <= TS
// cut from its window is read from that snapshot (streamed, already in key
// order, every chunk's sha256 checked) merged with the log's write records
// after S; the output is the same as from the log alone (see
// restore_plan.go for which default-CF values that still needs).
func Restore(ctx context.Context, o RestoreOptions) (RestoreStats, error) {
	var st RestoreStats
	o.defaults()
	if err := o.Flow.validate(); err != nil {
		return st, fmt.Errorf("restore: %w", err)
	}
	if err := o.Keys.Validate(); err != nil {
		return st, fmt.Errorf("restore: %w", err)
	}
	if err := checkOutDir(o.OutDir, o.Force); err != nil {
		return st, err // before reading the metas, which may take a while
	}
	plan, err := planRestore(ctx, &o)
	if err != nil {
		return st, err
	}
	if o.Progress != nil {
		o.progress = func(rs RestoreStats) {
			o.Progress(RestoreProgress{Chunks: rs.Chunks, ChunksTotal: plan.chunks, LogBytes: rs.LogBytes, Keys: rs.Keys})
		}
	}
	dir, err := openOutDir(o.OutDir, o.Force)
	if err != nil {
		return st, err
	}
	out := &jsonlOut{w: newTableWriter(dir.staging)}
	err = mvccRead(ctx, o, plan, out, &st)
	if ferr := out.w.finish(); err == nil {
		err = ferr
	}
	if err == nil {
		err = dir.commit(out.w.written)
	}
	if err != nil {
		dir.discard()
		return st, err
	}
	st.Tables = len(out.w.written)
	return st, nil
}

// RestoreProgress is how far a restore is.
type RestoreProgress struct {
	Chunks, ChunksTotal int   // log chunks read, of those planned
	LogBytes            int64 // uncompressed log bytes read
	Keys                int64 // keys written
}

func (o *RestoreOptions) defaults() {
	if o.MaxMemory <= 0 {
		o.MaxMemory = 256 << 20
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	o.keys = o.Keys.encoded()
}

// selected reports whether table id is restored as far as Tables and Keys
// say (Windows may still leave it out).
func (o *RestoreOptions) selected(id int64) bool {
	return (o.Tables == nil || o.Tables[id]) && o.Keys.HoldsTable(id)
}

// mvccRead reads the plan's chunks and snapshots and hands the MVCC state
// at o.TS to out, key by key in data key order, then every restored table
// (out.table), then finishes out.
func mvccRead(ctx context.Context, o RestoreOptions, plan *restorePlan, out mvccOut, st *RestoreStats) error {
	tmp, err := os.MkdirTemp(o.TempDir, "flowlog-restore-")
	if err != nil {
		return fmt.Errorf("restore: temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	// The readers' batches and buffers come out of the budget, and so do
	// the snapshot readers'; the sorters share the rest.
	sortMem := max(o.MaxMemory-readerMemory(o.Parallel), 0)
	if len(plan.bases) > 0 {
		// The snapshot readers: Parallel chunks of values and one of
		// no-value keys, each a batch being filled and two queued, plus the
		// batch being merged.
		sortMem = max(sortMem-readerMemory(o.Parallel+1)-int64(o.Parallel+2)*batchCap, 0)
	}
	writes := newExtSorter(tmp, "write", int(sortMem/2))
	defer writes.close()
	defaults := newExtSorter(tmp, "default", int(sortMem/2))
	defer defaults.close()
	tables := map[int64]bool{}
	for id, ok := range o.Tables {
		if ok && o.Keys.HoldsTable(id) {
			tables[id] = true
		}
	}
	for id := range o.Windows {
		if o.selected(id) {
			tables[id] = true // restorable: a file even if empty
		}
	}
	err = readChunks(ctx, o, plan.each, func(j *chunkJob, key, value []byte) error {
		enc, ts, err := event.SplitDataKey(key)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", j.index, j.path, err)
		}
		if !j.keep(ts) || !o.keys.holds(enc) {
			return nil
		}
		if j.f.CF == CFDefault {
			return defaults.add(key, value)
		}
		w, err := event.DecodeWrite(value)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", j.index, j.path, err)
		}
		tables[j.f.TableID] = true
		if w.Type == event.WriteLock || w.Type == event.WriteRollback {
			return nil
		}
		return writes.add(key, value)
	}, st)
	if err != nil {
		return err
	}
	st.FromSnapshot = len(plan.bases)
	for _, b := range plan.bases {
		st.SnapshotTS = max(st.SnapshotTS, b.ts)
	}
	snaps := newSnapIter(ctx, o, plan.bases)
	defer snaps.Close()
	return writeTables(o, writes, defaults, snaps, tables, out, st)
}

// NoDataError is a restore as of a ts before the first backed-up write
// record of the restored tables: it would restore nothing.
type NoDataError struct {
	TS    uint64
	First uint64 // commit ts of the first write record; 0 if there is none
}

func (e *NoDataError) Error() string {
	if e.First == 0 {
		return fmt.Sprintf("nothing to restore as of %d: the backup holds no write record of the tables", e.TS)
	}
	return fmt.Sprintf("nothing to restore as of %d: the first backed-up write record is at %d", e.TS, e.First)
}

// maxMetaSize bounds a meta object; a legitimate one lists a cycle's chunks
// in a few hundred bytes each.
const maxMetaSize = 64 << 20

// badMetaError is a meta object that exists but does not decode, or does
// not belong to the flow read.
type badMetaError struct {
	path string
	err  error
}

func (e *badMetaError) Error() string { return fmt.Sprintf("meta %s: %v", e.path, e.err) }
func (e *badMetaError) Unwrap() error { return e.err }

func tsBytes(ts uint64) []byte {
	var b [8]byte
	x := ^ts
	for i := 7; i >= 0; i-- {
		b[i] = byte(x)
		x >>= 8
	}
	return b[:]
}
