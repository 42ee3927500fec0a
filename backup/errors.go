package backup

import (
	"fmt"
	"strings"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// The errors below are the read side's refusals. Each carries what it
// concerns (the flow, the ts, the table) so that a command line can say it
// in its own words; their Error methods are plain defaults.

// NotFoundError: no flow is named Lookup's catalog/name, or (by id) there
// is no such flow and no committed backup of a dropped one.
type NotFoundError struct {
	Lookup Lookup
}

func (e *NotFoundError) Error() string {
	if e.Lookup.Name != "" {
		return fmt.Sprintf("no flow %s/%s", e.Lookup.Catalog, e.Lookup.Name)
	}
	return fmt.Sprintf("flow %d: no such flow and no committed backup", e.Lookup.ID)
}

// OutsidePrefixError: the newest meta of dropped flow ID, which names its
// catalog and name, is not under the bucket prefix.
type OutsidePrefixError struct {
	ID     uint32
	Path   string
	Prefix string
}

func (e *OutsidePrefixError) Error() string {
	return fmt.Sprintf("flow %d: meta path %s is not under prefix %q", e.ID, e.Path, e.Prefix)
}

// FutureError: a ts lies further ahead of this machine's clock than the
// allowed skew, so a restore or snapshot at it would claim data that cannot
// exist yet. Checkpoint is set when the ts is the flow's checkpoint (or a
// dropped flow's windows' end), not the one asked for: only a ts no clock
// could honestly give moves it there, so what it claims is unproven at any
// ts.
type FutureError struct {
	Flow       Flow
	Checkpoint bool
	TS         uint64
	Ahead      time.Duration // how far TS lies ahead of the clock
	Skew       time.Duration // the allowed skew
}

func (e *FutureError) Error() string {
	what := "ts"
	if e.Checkpoint {
		what = "checkpoint of flow " + e.Flow.String()
	}
	return fmt.Sprintf("%s %d is %v ahead of this machine's clock, more than the allowed skew %v", what, e.TS, e.Ahead.Round(time.Second), e.Skew)
}

// NoCheckpointError: the flow has no checkpoint yet, so nothing of it is
// known to be complete.
type NoCheckpointError struct {
	Flow Flow
}

func (e *NoCheckpointError) Error() string {
	return fmt.Sprintf("flow %s (id %d) has no checkpoint yet", e.Flow, e.Flow.ID)
}

// PastCheckpointError: the ts asked for lies past the flow's checkpoint,
// where later data may still be incomplete.
type PastCheckpointError struct {
	Flow       Flow
	TS         uint64
	Checkpoint uint64
}

func (e *PastCheckpointError) Error() string {
	return fmt.Sprintf("ts %d is past the checkpoint %d of flow %s", e.TS, e.Checkpoint, e.Flow)
}

// TruncatedError: the log a read as of TS needs was truncated. Table is -1
// when TS lies below the truncation point; otherwise it is the table whose
// window began below the truncation point and for which no listed snapshot
// at or after it holds that window (LogOnly: none was looked at).
type TruncatedError struct {
	Flow            Flow
	TS              uint64
	TruncatedBefore uint64 // the oldest restorable ts
	Table           int64
	LogOnly         bool
}

func (e *TruncatedError) Error() string {
	if e.Table < 0 {
		return fmt.Sprintf("ts %d is before the truncation point %d of flow %s", e.TS, e.TruncatedBefore, e.Flow)
	}
	return fmt.Sprintf("table %d of flow %s cannot be read as of %d: the log before the truncation point %d was removed", e.Table, e.Flow, e.TS, e.TruncatedBefore)
}

// UncoveredError: no table of the flow (or none the request named) has a
// coverage window that holds TS; NoWindow is set when the flow has no
// window at all yet.
type UncoveredError struct {
	Flow     Flow
	TS       uint64
	NoWindow bool
}

func (e *UncoveredError) Error() string {
	if e.NoWindow {
		return fmt.Sprintf("flow %s has no coverage window yet", e.Flow)
	}
	return fmt.Sprintf("no table of flow %s has a coverage window holding %d", e.Flow, e.TS)
}

// NoDataError: the backup of the flow holds no write record (First 0) of
// the tables read, or none at or below TS (the first is at First).
type NoDataError struct {
	Flow  Flow
	TS    uint64
	First uint64
}

func (e *NoDataError) Error() string {
	if e.First == 0 {
		return fmt.Sprintf("flow %s has no backed-up write record", e.Flow)
	}
	return fmt.Sprintf("ts %d is before the first backed-up write record of flow %s at %d", e.TS, e.Flow, e.First)
}

// NoSnapshotError: a truncate of the flow found no listed snapshot at or
// below Until; Oldest is the oldest listed one, 0 if there is none.
type NoSnapshotError struct {
	Flow   Flow
	Until  uint64
	Oldest uint64
}

func (e *NoSnapshotError) Error() string {
	return fmt.Sprintf("flow %s (id %d) has no listed snapshot at or below %d", e.Flow, e.Flow.ID, e.Until)
}

// TruncatedPastError: the flow's log is truncated before TruncatedBefore
// already, past the snapshot a truncate chose: the truncation point never
// moves back.
type TruncatedPastError struct {
	Flow            Flow
	TruncatedBefore uint64
	Snapshot        uint64
}

func (e *TruncatedPastError) Error() string {
	return fmt.Sprintf("flow %s (id %d) is already truncated before %d, past the snapshot at %d", e.Flow, e.Flow.ID, e.TruncatedBefore, e.Snapshot)
}

// IncompleteSnapshotError: the snapshot at Snapshot does not hold the
// tables of Missing, whose coverage windows hold its ts: a truncate there
// would lose them.
type IncompleteSnapshotError struct {
	Snapshot uint64
	Missing  []meta.Window
}

func (e *IncompleteSnapshotError) Error() string {
	missing := make([]string, len(e.Missing))
	for i, w := range e.Missing {
		missing[i] = fmt.Sprintf("%d (window since %d)", w.TableID, w.Since)
	}
	return fmt.Sprintf("snapshot at %d does not hold table(s) %s whose coverage window holds its ts: truncating would lose them; take a new snapshot",
		e.Snapshot, strings.Join(missing, ", "))
}
