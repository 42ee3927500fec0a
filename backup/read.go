package backup

import (
	"context"
	"time"
)

// Request is what a restore and a snapshot share: the flow, the ts, the
// clock rule and the events.
type Request struct {
	Flow Lookup
	// TS is the ts to read as of; 0 means the flow's checkpoint. It may not
	// exceed the checkpoint.
	TS uint64
	// MaxClockSkew bounds how far ahead of this machine's clock the ts and
	// the checkpoint may lie.
	MaxClockSkew time.Duration
	// Notify, if set, receives the request's events as they happen.
	Notify func(Event)
}

// locate finds where a restore or snapshot reads: the flow req names, the
// ts (checked against the flow's checkpoint and the clock), and the flow's
// metas, listed after the checkpoint was read: that order is what makes the
// list complete (the package comment's "The read order" says why). Whatever
// it found before a failure is returned with it.
func locate(ctx context.Context, src Source, req Request) (Flow, uint64, []string, error) {
	f, err := Resolve(ctx, src.Store, src.Prefix, req.Flow)
	if err != nil {
		return f, 0, nil, err
	}
	ts, err := chooseTS(ctx, src, f, req.TS, req.MaxClockSkew, req.Notify)
	if err != nil {
		return f, 0, nil, err
	}
	metas, err := MetaPaths(ctx, src.Store, f.ID)
	return f, ts, metas, err
}
