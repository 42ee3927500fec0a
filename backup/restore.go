package backup

import (
	"context"
	"errors"

	"github.com/flowlog/flowlog/sink"
)

// RestoreRequest is one restore: what to read and where to write it.
type RestoreRequest struct {
	Request
	// Selection is what is restored: the tables (nil Tables: all) and the
	// raw key range. Only the log chunks and snapshot chunks that overlap it
	// are read, and only its keys are written; a table outside it is not
	// restored and not reported as left out. It must pass Validate.
	Selection Selection
	// LogOnly ignores the snapshots and reads the log alone (a
	// cross-check, or a way around a damaged snapshot while the log is
	// still whole).
	LogOnly bool
	// OutDir, Force, TempDir, MaxMemory, Parallel and Progress are as in
	// sink.RestoreOptions.
	OutDir    string
	Force     bool
	TempDir   string
	MaxMemory int64
	Parallel  int
	Progress  func(sink.RestoreProgress)
}

// RestoreResult is what a restore read and wrote.
type RestoreResult struct {
	Flow  Flow
	TS    uint64 // the ts restored as of
	Metas int    // metas listed
	Stats sink.RestoreStats
}

// Restore writes the tables of the flow req names as of its ts into
// req.OutDir, each from the coverage window that holds the ts (see the
// package comment for why the result is complete). The reads go in this
// order: the flow, its checkpoint (and the ts), the metas, the tables'
// windows, the snapshots, the truncation point. It fails with the package's
// typed errors when a rule refuses the request, and passes the sink's
// errors on otherwise (sink.ErrOutDirNotEmpty, *sink.ChecksumError, ...).
func Restore(ctx context.Context, src Source, req RestoreRequest) (RestoreResult, error) {
	var res RestoreResult
	if err := req.Selection.Validate(); err != nil {
		return res, err
	}
	at, err := locate(ctx, src, req.Request)
	f, ts, metas := at.flow, at.ts, at.metas
	res.Flow, res.TS, res.Metas = f, ts, len(metas)
	if err != nil {
		return res, err
	}
	report(req.Notify, TSChosen{Flow: f, TS: ts})
	windows, err := restorable(ctx, src.Store, f, req.Selection, ts, at.bound, req.Notify)
	if err != nil {
		return res, err
	}
	var snaps []sink.SnapshotRef
	if !req.LogOnly {
		if snaps, err = SnapshotRefs(ctx, src.Store, f.ID); err != nil {
			return res, err
		}
	}
	truncated, err := checkTruncated(ctx, src.Store, f, ts)
	if err != nil {
		return res, err
	}
	report(req.Notify, Restoring{Flow: f, TS: ts, Tables: len(windows), Metas: len(metas)})
	res.Stats, err = sink.Restore(ctx, sink.RestoreOptions{
		Bucket: src.Bucket, Flow: f.Sink(src.Prefix), MetaPaths: metas, TS: ts, Tables: req.Selection.Tables, Keys: req.Selection.Keys(), Windows: windows,
		OutDir: req.OutDir, Force: req.Force, TempDir: req.TempDir, MaxMemory: req.MaxMemory, Parallel: req.Parallel,
		Progress: req.Progress, Snapshots: snaps, TruncatedBefore: truncated,
	})
	return res, readErr(err, f, ts, req.LogOnly)
}

// readErr gives the sink's refusals of a read of f as of ts the flow they
// concern.
func readErr(err error, f Flow, ts uint64, logOnly bool) error {
	var (
		nd *sink.NoDataError
		te *sink.TruncatedError
	)
	switch {
	case errors.As(err, &te):
		return &TruncatedError{Flow: f, TS: ts, TruncatedBefore: te.TruncatedBefore, Table: te.Table, LogOnly: logOnly}
	case errors.As(err, &nd):
		return &NoDataError{Flow: f, TS: nd.TS, First: nd.First}
	}
	return err
}
