package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// advanceCheckpoint computes the global checkpoint (DESIGN section 7): the
// min of ckpt:<topic>:<p> over every partition of the apply topic that ever
// held a record; a partition with records but no ckpt yet holds it back. It
// moves each flow's checkpoint forward in Redis (never backwards) and writes
// the flow's global_checkpoint object.
func (f *flusher) advanceCheckpoint(ctx context.Context) error {
	c := f.c
	topic := c.d.ApplyTopic
	ends, err := f.s.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	var parts []int32
	var lerr error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			lerr = o.Err
			return
		}
		if o.Offset > 0 {
			parts = append(parts, o.Partition)
		}
	})
	if lerr != nil {
		return fmt.Errorf("list end offsets: %w", lerr)
	}
	if len(parts) == 0 {
		return nil
	}
	cks, err := c.d.Store.PartitionCheckpoints(ctx, topic, parts)
	if err != nil {
		return err
	}
	var global uint64
	for i, p := range parts {
		ck, ok := cks[p]
		if !ok {
			return nil // a partition with records but no checkpoint yet
		}
		if i == 0 || ck < global {
			global = ck
		}
	}
	if global == 0 {
		return nil
	}
	for _, fl := range c.d.Registry.Flows() {
		if err := f.advanceFlow(ctx, fl, global); err != nil {
			return err
		}
	}
	return nil
}

func (f *flusher) advanceFlow(ctx context.Context, fl *meta.Flow, global uint64) error {
	c := f.c
	label := flowLabel(fl.Info.CatalogName, fl.Info.FlowName)
	advanced, err := c.d.Store.AdvanceCheckpoint(ctx, fl.ID, global)
	if err != nil {
		return fmt.Errorf("advance checkpoint of %s: %w", label, err)
	}
	st, err := c.d.Store.FlowState(ctx, fl.ID)
	if err != nil {
		return fmt.Errorf("read checkpoint of %s: %w", label, err)
	}
	ck := max(st.CheckpointTS, global)
	c.m.checkpointTS.WithLabelValues(label).Set(float64(ck))
	c.m.checkpointLag.WithLabelValues(label).Set(max(time.Since(event.PhysicalTime(ck)).Seconds(), 0))
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
		if err != nil || st.CheckpointTS <= want {
			return err
		}
		want = st.CheckpointTS
	}
	return nil
}

// putCheckpoint replaces the 8-byte checkpoint object. It is the one object
// flowlog rewrites (DESIGN 6 asks for DoesNotExist on everything else).
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
