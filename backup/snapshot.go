package backup

import (
	"context"
	"errors"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// SnapshotRequest is one snapshot: what to read, and the resources to
// compute it with.
type SnapshotRequest struct {
	Request
	// TempDir, MaxMemory, Parallel, ChunkSize and Progress are as in
	// sink.SnapshotOptions.
	TempDir   string
	MaxMemory int64
	Parallel  int
	ChunkSize int
	Progress  func(sink.SnapshotProgress)
}

// SnapshotResult is what a snapshot read and wrote.
type SnapshotResult struct {
	Flow  Flow
	TS    uint64 // the snapshot's ts
	Metas int    // metas listed
	// Existing is the path of the listed snapshot that already was at TS,
	// if any: then nothing was done.
	Existing string
	Stats    sink.SnapshotStats
}

// SnapshotLister lists a snapshot whose objects are all written:
// *meta.Store's AddSnapshot.
type SnapshotLister interface {
	AddSnapshot(ctx context.Context, id meta.FlowID, path string) error
}

// Snapshot writes the state of the flow req names as of its ts, for every
// table whose coverage window holds the ts, as a snapshot, and lists it with
// l once every object is written: a restore counts only listed snapshots.
// The ts is chosen, and the metas are read, exactly as for a restore, from
// the same listed snapshots and log. A snapshot listed at the ts already is
// reported in Existing, and nothing is written. The result's Stats are what
// was written even when it fails.
func Snapshot(ctx context.Context, src Source, l SnapshotLister, req SnapshotRequest) (SnapshotResult, error) {
	var res SnapshotResult
	at, err := locate(ctx, src, req.Request)
	f, ts, metas := at.flow, at.ts, at.metas
	res.Flow, res.TS, res.Metas = f, ts, len(metas)
	if err != nil {
		return res, err
	}
	snaps, err := SnapshotRefs(ctx, src.Store, f.ID)
	if err != nil {
		return res, err
	}
	truncated, err := checkTruncated(ctx, src.Store, f, ts)
	if err != nil {
		return res, err
	}
	for _, s := range snaps {
		if s.TS == ts {
			res.Existing = s.Path
			return res, nil
		}
	}
	report(req.Notify, TSChosen{Flow: f, TS: ts})
	capped, err := restorable(ctx, src.Store, f, Selection{}, ts, at.bound, req.Notify)
	if err != nil {
		return res, err
	}
	cur, hist, err := src.Store.Windows(ctx, f.ID)
	if err != nil {
		return res, err
	}
	windows := map[int64]sink.SnapshotWindow{}
	for id := range capped {
		if w, ok := meta.WindowAt(cur, hist, uint32(id), ts); ok {
			windows[id] = sink.SnapshotWindow{Since: w.Since, Until: w.Until}
		}
	}
	report(req.Notify, Snapshotting{Flow: f, TS: ts, Tables: len(windows), Metas: len(metas)})
	res.Stats, err = sink.Snapshot(ctx, sink.SnapshotOptions{
		Bucket: src.Bucket, Flow: f.Sink(src.Prefix), MetaPaths: metas, Snapshots: snaps, TruncatedBefore: truncated,
		TS: ts, Windows: windows, TempDir: req.TempDir, MaxMemory: req.MaxMemory, Parallel: req.Parallel,
		ChunkSize: req.ChunkSize, Progress: req.Progress,
	})
	if err == nil {
		err = l.AddSnapshot(ctx, f.ID, res.Stats.MetaPath)
	}
	var nd *sink.NoDataError
	if errors.As(err, &nd) {
		return res, &NoDataError{Flow: f, TS: nd.TS, First: nd.First}
	}
	return res, err
}
