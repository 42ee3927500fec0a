package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// advanceCheckpoint computes the global checkpoint (docs/FORMAT.md,
// "Checkpoint rule"): the
// min of ckpt:<topic>:<p> over every partition of the apply topic that ever
// held a record. A partition with records but no ckpt yet holds it back,
// unless it has no readable record left (retention moved its start offset
// to its end: nothing there can ever be routed). A partition whose regions
// have all dropped out (ckpt CkptIdle) is left out. It moves each flow's
// checkpoint forward in Redis (never backwards) and writes the flow's
// global_checkpoint object.
//
// Only the replica holding the advance turn (meta.Store.TakeAdvanceTurn,
// held for advanceTurnTTL) does that work; the others take the global
// checkpoint Redis holds for their gauges. Its cost is a read of every
// partition's checkpoint and a transaction over every flow, so done after
// each commit of each of N replicas it grew with N times the flows, and
// the replicas' advances made one another retry.
func (f *flusher) advanceCheckpoint(ctx context.Context) error {
	c := f.c
	turn, err := c.d.Store.TakeAdvanceTurn(ctx, c.cfg.StoreID, advanceTurnTTL)
	if err != nil {
		return err
	}
	if !turn {
		return f.showCheckpoint(ctx)
	}
	topic := c.d.ApplyTopic
	ends, err := f.s.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	var parts []int32
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			parts = append(parts, o.Partition)
		}
	})
	if len(parts) == 0 {
		return nil
	}
	starts, err := f.s.adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("list start offsets: %w", err)
	}
	// Partitions with readable records: retention may have taken every
	// record of one before anyone read it, and nothing there can be routed.
	live := parts[:0:0]
	for _, p := range parts {
		start, _ := starts.Lookup(topic, p)
		end, _ := ends.Lookup(topic, p)
		if start.Offset < end.Offset {
			live = append(live, p)
		}
	}
	if n, err := c.d.Store.FinalizeCoverage(ctx, topic, live); err != nil {
		c.log.Warn("finalizing coverage windows failed; retried next cycle", "err", err)
	} else if n > 0 {
		c.log.Info("coverage windows final", "entries", n)
	}
	cks, idle, err := c.d.Store.PartitionCheckpoints(ctx, topic, live)
	if err != nil {
		return err
	}
	var global uint64
	found := false
	for _, p := range live {
		if idle[p] {
			continue
		}
		ck, ok := cks[p]
		if !ok {
			return nil // a partition with records but no checkpoint yet
		}
		if !found || ck < global {
			global, found = ck, true
		}
	}
	if !found || global == 0 {
		return nil
	}
	// Every resolved ts was within the bound when it arrived, so this only
	// caps what a version that took any ts left in ckpt:<topic>:<p>.
	bound := event.MaxTS(time.Now(), c.cfg.MaxClockSkew)
	global = min(global, bound)
	flows := c.d.Registry.Flows()
	ids := make([]meta.FlowID, len(flows))
	for i, fl := range flows {
		ids[i] = fl.ID
	}
	advanced, ck, err := c.d.Store.AdvanceCheckpoints(ctx, ids, global, bound)
	if err != nil {
		return err
	}
	ck = max(min(ck, bound), global)
	f.setCheckpointGauges(flows, ck)
	return f.writeFlowCheckpoints(ctx, advanced, ck, bound)
}

// advanceTurnTTL is how long a replica holds the advance turn: the global
// checkpoint is computed about once per this whatever the number of
// replicas (after every commit with fewer replicas than commits in it).
// Each advance may rewrite every flow's checkpoint object, and GCS takes
// about one write per second to one object.
const advanceTurnTTL = time.Second

// showCheckpoint sets the checkpoint gauges of every flow to the global
// checkpoint Redis holds, on a replica whose turn it is not.
func (f *flusher) showCheckpoint(ctx context.Context) error {
	ck, ok, err := f.c.d.Store.GlobalCheckpointTS(ctx)
	if err != nil || !ok {
		return err
	}
	f.setCheckpointGauges(f.c.d.Registry.Flows(), min(ck, event.MaxTS(time.Now(), f.c.cfg.MaxClockSkew)))
	return nil
}

// setCheckpointGauges shows ck as the checkpoint of each of flows.
func (f *flusher) setCheckpointGauges(flows []*meta.Flow, ck uint64) {
	m := f.c.m
	now := time.Now()
	for _, fl := range flows {
		label := flowLabel(fl.Info.CatalogName, fl.Info.FlowName)
		m.checkpointTS.WithLabelValues(label).Set(float64(ck))
		m.checkpointLag.WithLabelValues(label).Set(max(now.Sub(event.PhysicalTime(ck)).Seconds(), 0))
		m.checkpointAhead.WithLabelValues(label).Set(event.Ahead(ck, now).Seconds())
	}
}

// writeFlowCheckpoints writes the global_checkpoint object of every flow
// of ids (the flows whose checkpoint moved), holding ck or the newest
// global checkpoint in Redis. One flow's failing object must not hold the
// others back.
func (f *flusher) writeFlowCheckpoints(ctx context.Context, ids []meta.FlowID, ck, bound uint64) error {
	c := f.c
	var errs []error
	for _, id := range ids {
		fl, ok := c.d.Registry.Flow(id)
		if !ok {
			continue
		}
		name := sink.CheckpointPath(c.d.GCSPrefix, fl.Info.CatalogName, fl.Info.FlowName, c.d.Group, fl.ID)
		if err := f.putNewest(ctx, name, ck, bound); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint of %s: %w", flowLabel(fl.Info.CatalogName, fl.Info.FlowName), err))
		}
	}
	return errors.Join(errs...)
}

// putNewest writes want to the checkpoint object name, then re-reads the
// global checkpoint in Redis and writes again while it is newer (up to 3
// times; a value past bound, the clock plus --max-clock-skew, is never
// written). Instances of a group race here and Redis decides who advanced:
// writing the newest value after our write makes the last write carry the
// largest checkpoint whichever instance wrote first.
func (f *flusher) putNewest(ctx context.Context, name string, want, bound uint64) error {
	c := f.c
	for range 3 {
		if err := putCheckpoint(ctx, c.d.Bucket, name, want); err != nil {
			return err
		}
		cur, ok, err := c.d.Store.GlobalCheckpointTS(ctx)
		if err != nil || !ok || min(cur, bound) <= want {
			return err
		}
		want = min(cur, bound)
	}
	return nil
}

// putCheckpoint replaces the 8-byte checkpoint object. It is the one object
// flowlog rewrites; everything else is written once, with DoesNotExist
// (docs/FORMAT.md, "Object writes").
func putCheckpoint(ctx context.Context, b sink.Bucket, name string, ts uint64) error {
	body := sink.EncodeCheckpoint(ts)
	obj := sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}
	if ow, ok := b.(sink.Overwriter); ok {
		if err := ow.Overwrite(ctx, obj); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		return nil
	}
	if err := b.Delete(ctx, name); err != nil {
		return fmt.Errorf("replace %s: %w", name, err)
	}
	if err := b.Upload(ctx, obj); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// resume clears a flow's fatal state after a resume DDL, so fetching
// restarts and the failed cycle is retried at once.
func (f *flusher) resume(id meta.FlowID) {
	c := f.c
	f.mu.Lock()
	delete(f.failures, id)
	f.mu.Unlock()
	c.mu.Lock()
	wasFatal := c.fatal[id]
	delete(c.fatal, id)
	c.mu.Unlock()
	if fl, ok := c.d.Registry.Flow(id); ok && wasFatal {
		c.m.flowFatal.WithLabelValues(flowLabel(fl.Info.CatalogName, fl.Info.FlowName)).Set(0)
		c.log.Info("flow resumed by DDL; retrying its flush", "flow", flowLabel(fl.Info.CatalogName, fl.Info.FlowName))
	}
	f.kick()
}
