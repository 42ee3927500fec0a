package backup

import "github.com/flowlog/flowlog/meta"

// Event is something a restore or snapshot reports while it works, in the
// order it happens, through the request's Notify: the operator's view of a
// decision, never a change to it. The events are CheckpointUnreadable,
// AtWindowsEnd, TSChosen, LeftOut, Restoring and Snapshotting.
type Event interface{ event() }

// CheckpointUnreadable: f was dropped and its checkpoint object could not
// be read, but its coverage windows are final, so it is restorable up to
// their end.
type CheckpointUnreadable struct {
	Flow Flow
	Err  error
}

// AtWindowsEnd: f was dropped and no ts was asked for: the request reads as
// of End, the end of its last coverage window, not its checkpoint.
type AtWindowsEnd struct {
	Flow Flow
	End  uint64
}

// TSChosen: the request's ts passed every check that does not depend on a
// table; the tables' coverage windows are read next.
type TSChosen struct {
	Flow Flow
	TS   uint64
}

// LeftOut: a table of the flow (or one the request named) has no coverage
// window that holds TS, and is not restored. Windows are its windows, older
// ones first; Establishing is set when its first window is still being
// established. Removing is set for a table whose removal from the flow is
// not final yet: its open window holds TS, but is known complete only up to
// CompleteUpTo, below TS (see restorable).
type LeftOut struct {
	Table        uint32
	TS           uint64
	Windows      []meta.Window
	Establishing bool
	Removing     bool
	CompleteUpTo uint64
}

// Restoring: every check passed; the restore of Tables tables as of TS,
// read from Metas metas, starts.
type Restoring struct {
	Flow   Flow
	TS     uint64
	Tables int
	Metas  int
}

// Snapshotting: a snapshot of Tables tables as of TS, read from Metas
// metas, starts.
type Snapshotting struct {
	Flow   Flow
	TS     uint64
	Tables int
	Metas  int
}

func (CheckpointUnreadable) event() {}
func (AtWindowsEnd) event()         {}
func (TSChosen) event()             {}
func (LeftOut) event()              {}
func (Restoring) event()            {}
func (Snapshotting) event()         {}

// report passes e to notify, if set.
func report(notify func(Event), e Event) {
	if notify != nil {
		notify(e)
	}
}
