package sink

import (
	"context"
	"fmt"
)

// StreamFlowMeta streams meta object path of flow f, as restore reads it:
// the meta must be the flow's (a meta of another flow, or one whose
// data_path lies outside the flow's objects, is refused) and valid. header,
// if not nil, sees the meta without its files (but with its offsets) before
// the first file; file sees each file that holds the flow's entries, with
// its index in the meta's files, in order. Memory stays that of one file
// entry, however many the meta lists. With keys false the files come
// without start_key and end_key; with keys true with a prefix of each,
// enough for KeyRange.OverlapsChunk.
func StreamFlowMeta(ctx context.Context, b Bucket, f Flow, path string, keys bool, header func(m *Meta) error, file func(m *Meta, i int, fm *FileMeta) error) error {
	if err := f.validate(); err != nil {
		return err
	}
	_, err := streamFlowMeta(ctx, b, f, path, keys, header, file)
	return err
}

// ReadState computes the MVCC state at o.TS exactly as Restore does (the
// same plan, snapshots, windows and checks; o.OutDir, o.Force and
// o.Progress are not used) and hands each live key to live, in data key
// order (by table, then key): its table, the data key of the version read
// (at commitTS) and its value. The slices are valid only during the call.
// progress, if set, is called after every chunk read.
func ReadState(ctx context.Context, o RestoreOptions, live func(tid int64, dataKey []byte, commitTS uint64, value []byte) error, progress func(RestoreProgress)) (RestoreStats, error) {
	var st RestoreStats
	o.defaults()
	if err := o.Flow.validate(); err != nil {
		return st, fmt.Errorf("read state: %w", err)
	}
	if err := o.Keys.Validate(); err != nil {
		return st, fmt.Errorf("read state: %w", err)
	}
	plan, err := planRestore(ctx, &o)
	if err != nil {
		return st, err
	}
	if progress != nil {
		o.progress = func(rs RestoreStats) {
			progress(RestoreProgress{Chunks: rs.Chunks, ChunksTotal: plan.chunks, LogBytes: rs.LogBytes, Keys: rs.Keys})
		}
	}
	out := &funcOut{fn: live, tables: map[int64]bool{}}
	err = mvccRead(ctx, o, plan, out, &st)
	st.Tables = len(out.tables)
	return st, err
}

// funcOut hands the MVCC state to a function.
type funcOut struct {
	fn     func(tid int64, dataKey []byte, commitTS uint64, value []byte) error
	tables map[int64]bool
}

func (f *funcOut) live(tid int64, _, dataKey []byte, commitTS uint64, val []byte) error {
	f.tables[tid] = true
	return f.fn(tid, dataKey, commitTS, val)
}

func (f *funcOut) noValue(int64, []byte) error { return nil }
func (f *funcOut) table(int64) error           { return nil }
func (f *funcOut) finish() error               { return nil }
