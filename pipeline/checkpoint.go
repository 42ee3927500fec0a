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
func (f *flusher) advanceCheckpoint(ctx context.Context) error {
	c := f.c
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
	// One flow's failing checkpoint object must not hold the others back.
	var errs []error
	for _, fl := range c.d.Registry.Flows() {
		if err := f.advanceFlow(ctx, fl, global, bound); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// advanceFlow moves flow fl's checkpoint to global in Redis and in its
// global_checkpoint object; a stored checkpoint past bound (the clock plus
// --max-clock-skew) is replaced, never kept or written again.
func (f *flusher) advanceFlow(ctx context.Context, fl *meta.Flow, global, bound uint64) error {
	c := f.c
	label := flowLabel(fl.Info.CatalogName, fl.Info.FlowName)
	advanced, err := c.d.Store.AdvanceCheckpointBelow(ctx, fl.ID, global, bound)
	if err != nil {
		return fmt.Errorf("advance checkpoint of %s: %w", label, err)
	}
	st, err := c.d.Store.FlowState(ctx, fl.ID)
	if err != nil {
		return fmt.Errorf("read checkpoint of %s: %w", label, err)
	}
	ck := max(min(st.CheckpointTS, bound), global)
	now := time.Now()
	c.m.checkpointTS.WithLabelValues(label).Set(float64(ck))
	c.m.checkpointLag.WithLabelValues(label).Set(max(now.Sub(event.PhysicalTime(ck)).Seconds(), 0))
	c.m.checkpointAhead.WithLabelValues(label).Set(event.Ahead(ck, now).Seconds())
	if !advanced {
		return nil
	}
	name := sink.CheckpointPath(c.d.GCSPrefix, fl.Info.CatalogName, fl.Info.FlowName, c.d.Group, fl.ID)
	// Instances of a group race here; Redis decides who advanced. Writing
	// the newest Redis value (re-read after our write) makes the last write
	// carry the largest checkpoint whichever instance wrote first.
	want := ck // the newest value known, ours or another instance's
	for range 3 {
		if err := putCheckpoint(ctx, c.d.Bucket, name, want); err != nil {
			return err
		}
		st, err := c.d.Store.FlowState(ctx, fl.ID)
		if err != nil || min(st.CheckpointTS, bound) <= want {
			return err
		}
		want = min(st.CheckpointTS, bound)
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
