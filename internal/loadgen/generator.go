package loadgen

import (
	"encoding/binary"
	"fmt"

	"github.com/flowlog/flowlog/event"
)

// Generator turns the planned load into ApplyBatches, in the order a
// producer must publish them. It is not safe for concurrent use.
type Generator struct {
	p      *planner
	events int
	txns   int
	maxTS  uint64
}

// New returns a generator of the load cfg describes. cfg should have passed
// Validate; zero fields take their defaults.
func New(cfg Config) *Generator {
	return &Generator{p: newPlanner(cfg)}
}

// Config returns the generator's configuration with defaults filled in.
func (g *Generator) Config() Config { return g.p.cfg }

// Next returns the next batch, or ok=false when the load is complete. The
// batch's RegionID is the region to key its record by (in decimal), so that
// a region's batches stay in one partition and in order. The batch and its
// bytes belong to the caller.
func (g *Generator) Next() (b *event.Batch, ok bool) {
	pb, ok := g.p.next()
	if !ok {
		return nil, false
	}
	b = &event.Batch{RegionID: pb.region, ResolvedTS: pb.resolved}
	g.maxTS = max(g.maxTS, pb.resolved)
	for _, t := range pb.txns {
		g.maxTS = max(g.maxTS, t.commitTS)
		b.Events = g.appendTxn(b.Events, t)
		g.txns++
	}
	g.events += len(b.Events)
	return b, true
}

// appendTxn appends the events TiKV writes for t.
func (g *Generator) appendTxn(evs []event.Event, t txn) []event.Event {
	raw := rowKey(t.table, t.handle)
	if t.lock {
		lock := []byte{'P'}
		lock = binary.AppendUvarint(lock, uint64(len(raw)))
		lock = append(lock, raw...)
		lock = binary.AppendUvarint(lock, t.startTS)
		lock = binary.AppendUvarint(lock, 3000) // ttl
		evs = append(evs, event.Event{Key: event.EncodeBytes(nil, raw), Value: lock, CF: event.CFLock, Op: event.OpPut})
	}
	w := event.Write{Type: event.WritePut, StartTS: t.startTS}
	switch t.kind {
	case kindPut:
		v := value(g.p.cfg.Seed, t.table, t.handle, t.commitTS, g.p.cfg.ValueSize)
		if len(v) <= maxShortValue {
			w.ShortValue, w.HasShortValue = v, true
		} else {
			evs = append(evs, event.Event{Key: event.AppendDataKey(nil, raw, t.startTS), Value: v, CF: event.CFDefault, Op: event.OpPut})
		}
	case kindDelete:
		w.Type = event.WriteDelete
	case kindRollback:
		w.Type = event.WriteRollback
	}
	rec, err := event.AppendWrite(nil, w)
	if err != nil {
		panic(fmt.Sprintf("loadgen: encode write record: %v", err)) // a bug: types and sizes are ours
	}
	evs = append(evs, event.Event{Key: event.AppendDataKey(nil, raw, t.commitTS), Value: rec, CF: event.CFWrite, Op: event.OpPut})
	if t.lock {
		evs = append(evs, event.Event{Key: event.EncodeBytes(nil, raw), CF: event.CFLock, Op: event.OpDelete})
	}
	return evs
}

// Events is the number of apply events returned so far.
func (g *Generator) Events() int { return g.events }

// Transactions is the number of transactions returned so far.
func (g *Generator) Transactions() int { return g.txns }

// MaxTS is the largest ts (commit or resolved) of the batches returned so
// far.
func (g *Generator) MaxTS() uint64 { return g.maxTS }

// MaxResolvedTS is the largest resolved ts of the batches returned so far;
// once Next has returned ok=false it is the resolved ts every region ends
// at, which a consumer's checkpoint reaches when it has everything.
func (g *Generator) MaxResolvedTS() uint64 { return g.p.maxRes }
