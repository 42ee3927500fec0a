package backup

import (
	"context"
	"time"

	"github.com/flowlog/flowlog/event"
)

// chooseTS is the ts a restore or snapshot of f reads as of: want, checked
// against the checkpoint and the clock, or (want 0) the checkpoint; for a
// dropped flow whose windows are all closed, at most the end of its last
// window. It also returns the bound the ts was checked against.
func chooseTS(ctx context.Context, src Source, f Flow, want uint64, skew time.Duration, notify func(Event)) (ts, bound uint64, err error) {
	ckpt, cerr := flowCheckpoint(ctx, src, f)
	// A dropped flow whose windows are all final and closed is restorable
	// up to their ends whatever its checkpoint says: a window is final only
	// once every apply partition reported its bound, and each report is
	// committed with the data before it. The checkpoint object may have
	// stopped before the windows began (dropped before an advance passed
	// their since), lie past them (a replica that had not seen the drop),
	// or be missing (never written).
	var end uint64
	closed := false
	if f.Dropped {
		if end, closed, err = lastWindowEnd(ctx, src.Store, f.ID); err != nil {
			return 0, 0, err
		}
	}
	switch {
	case closed && cerr != nil:
		report(notify, CheckpointUnreadable{Flow: f, Err: cerr})
		ckpt = 0
	case cerr != nil:
		return 0, 0, cerr
	}
	bound = ckpt
	if closed {
		bound = max(ckpt, end)
	}
	now := time.Now()
	future := event.MaxTS(now, skew)
	ts = want
	switch {
	case ts > future:
		return 0, 0, &FutureError{Flow: f, TS: ts, Ahead: event.Ahead(ts, now), Skew: skew}
	case bound > future:
		// Only a ts no clock could honestly give moves a checkpoint there
		// (stored by a version that took any ts, until a consumer of this
		// one advances it again): what it claims is unproven at any ts,
		// since the regions that held it back may have been ignored.
		return 0, 0, &FutureError{Flow: f, Checkpoint: true, TS: bound, Ahead: event.Ahead(bound, now), Skew: skew}
	case bound == 0:
		return 0, 0, &NoCheckpointError{Flow: f}
	case ts == 0 && closed:
		// A dropped flow's windows all ended: as of the last end, not its
		// checkpoint, which may lie before or past them.
		ts = end
		if end != ckpt {
			report(notify, AtWindowsEnd{Flow: f, End: end})
		}
	case ts == 0:
		ts = ckpt
	case ts > bound:
		return 0, 0, &PastCheckpointError{Flow: f, TS: ts, Checkpoint: bound}
	}
	return ts, bound, nil
}

// checkTruncated returns f's truncation point (0 if none) and refuses a ts
// below it. Callers read it after they list the metas and snapshots: a
// truncate removes metas and records the point in one transaction, so this
// read knows of every truncation the lists reflect.
func checkTruncated(ctx context.Context, st Store, f Flow, ts uint64) (uint64, error) {
	tb, ok, err := st.TruncatedBefore(ctx, f.ID)
	if err != nil || !ok {
		return 0, err
	}
	if ts < tb {
		return 0, &TruncatedError{Flow: f, TS: ts, TruncatedBefore: tb, Table: -1}
	}
	return tb, nil
}
