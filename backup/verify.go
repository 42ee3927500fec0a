package backup

import (
	"time"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// The bounds a verify checks against the clock (FutureBound.Kind).
const (
	BoundRedisCheckpoint  = "redis checkpoint"
	BoundCheckpointObject = "checkpoint object"
	BoundWindowSince      = "coverage window since"
	BoundWindowUntil      = "coverage window until"
)

// FutureBound is a checkpoint or a coverage window bound that lies further
// ahead of the clock than the allowed skew. Only a ts no clock could
// honestly give moves one there, so what it claims is unproven: verify
// reports each as a fault (docs/OPERATING.md, "Time is bounded").
type FutureBound struct {
	Kind  string // one of the Bound constants
	Table uint32 // the window's table, for a window bound
	TS    uint64
	Ahead time.Duration // how far TS lies ahead of the clock
	Skew  time.Duration // the allowed skew
}

// VerifyClock is the verify rule of the clock: it returns the bounds of a
// flow that lie further ahead of now than skew, in this order: the Redis
// checkpoint (redisCkpt nil when the checkpoint came from the bucket
// alone), the checkpoint object, then each window's since and until.
func VerifyClock(redisCkpt *uint64, ckptObject uint64, windows []meta.Window, now time.Time, skew time.Duration) []FutureBound {
	bound := event.MaxTS(now, skew)
	var out []FutureBound
	future := func(kind string, table uint32, ts uint64) {
		if ts > bound {
			out = append(out, FutureBound{Kind: kind, Table: table, TS: ts, Ahead: event.Ahead(ts, now), Skew: skew})
		}
	}
	if redisCkpt != nil {
		future(BoundRedisCheckpoint, 0, *redisCkpt)
	}
	future(BoundCheckpointObject, 0, ckptObject)
	for _, w := range windows {
		future(BoundWindowSince, w.TableID, w.Since)
		if w.Until != nil {
			future(BoundWindowUntil, w.TableID, *w.Until)
		}
	}
	return out
}
