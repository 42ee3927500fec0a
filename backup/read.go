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

// located is where a restore or snapshot reads: the flow, the ts, the
// checkpoint bound the ts was checked against, and the flow's metas.
type located struct {
	flow      Flow
	ts, bound uint64
	metas     []string
}

// locate finds where a restore or snapshot reads: the flow req names, the
// ts (checked against the flow's checkpoint and the clock), and the flow's
// metas, listed after the checkpoint was read: that order is what makes the
// list complete (the package comment's "The read order" says why). Whatever
// it found before a failure is returned with it.
func locate(ctx context.Context, src Source, req Request) (located, error) {
	var l located
	var err error
	if l.flow, err = Resolve(ctx, src, req.Flow); err != nil {
		return l, err
	}
	if l.ts, l.bound, err = chooseTS(ctx, src, l.flow, req.TS, req.MaxClockSkew, req.Notify); err != nil {
		return l, err
	}
	l.metas, err = MetaPaths(ctx, src.Store, l.flow.ID)
	return l, err
}
