package backup

import (
	"context"

	"github.com/flowlog/flowlog/sink"
)

// ReadPlan is what a read of a flow as of a ts may read, decided by the
// same rules, in the same order, as Restore decides them (the package
// comment says why the result is complete): the flow, the ts, the metas
// listed after the checkpoint was read, each restorable table's coverage
// window capped at the ts, the listed snapshots and the truncation point.
// A reader other than restore (replay) builds on it, so that it reads
// exactly what a restore at the same ts would.
type ReadPlan struct {
	Flow            Flow
	TS              uint64
	Metas           []string
	Windows         map[int64]sink.TableWindow
	Snapshots       []sink.SnapshotRef
	TruncatedBefore uint64
}

// PlanRead decides what a read of req as of its ts, of the selection sel,
// may read (sel's tables; a table outside it is neither read nor reported). Tables left out are reported as LeftOut events;
// none left fails with an *UncoveredError, a ts below the truncation point
// with a *TruncatedError. Without snapshots (logOnly) Snapshots is nil.
// Whatever it found before a failure is returned with it.
func PlanRead(ctx context.Context, src Source, req Request, sel Selection, logOnly bool) (ReadPlan, error) {
	var p ReadPlan
	at, err := locate(ctx, src, req)
	p.Flow, p.TS, p.Metas = at.flow, at.ts, at.metas
	if err != nil {
		return p, err
	}
	report(req.Notify, TSChosen{Flow: p.Flow, TS: p.TS})
	if p.Windows, err = restorable(ctx, src.Store, p.Flow, sel, p.TS, at.bound, req.Notify); err != nil {
		return p, err
	}
	if !logOnly {
		if p.Snapshots, err = SnapshotRefs(ctx, src.Store, p.Flow.ID); err != nil {
			return p, err
		}
	}
	p.TruncatedBefore, err = checkTruncated(ctx, src.Store, p.Flow, p.TS)
	return p, err
}

// CheckTruncated refuses a read that needs f's log at ts or below when
// the log before it was truncated (a *TruncatedError), with the
// truncation point truncatedBefore (0: never truncated).
func CheckTruncated(f Flow, ts, truncatedBefore uint64) error {
	if ts < truncatedBefore {
		return &TruncatedError{Flow: f, TS: ts, TruncatedBefore: truncatedBefore, Table: -1}
	}
	return nil
}

// ReadErr gives the sink's refusals of a read of f as of ts the flow they
// concern, as Restore does.
func ReadErr(err error, f Flow, ts uint64, logOnly bool) error { return readErr(err, f, ts, logOnly) }
