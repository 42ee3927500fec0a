package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/catalog"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// advanceCheckpoint moves the global checkpoint (docs/FORMAT.md,
// "Checkpoint rule"): the min of ckpt:<topic>:<p> over every partition of
// the apply topic that ever held a record. A partition with records but no
// ckpt yet holds it back, unless it has no readable record left (retention
// moved its start offset to its end: nothing there can ever be routed). A
// partition whose regions have all dropped out (ckpt CkptIdle) is left out.
//
// The order of its steps is what makes a checkpoint it writes true:
//
//  1. Read the partition checkpoints and compute the global G.
//  2. Finalise coverage windows. Only now: every report a window bound at
//     or below G needs rode in a commit that came before the checkpoints
//     just read (a partition's report and its checkpoint past the bound
//     are committed together), so finalisation sees it. Finalising first
//     could leave a window open that a partition had already closed below
//     G, and a restore at G would claim the table's events after it. If
//     finalisation fails, nothing advances.
//  3. Advance the global checkpoint in Redis to G (never backwards, never
//     past the clock plus --max-clock-skew): layout v1 with every flow's
//     checkpoint_ts in one transaction; layout v2 alone, in a transaction of
//     one key, since every live flow's effective checkpoint is at least the
//     global one (meta/checkpoint.go; docs/FORMAT.md, "Effective
//     checkpoint").
//     The first layout v2 advance of a session moves every flow's
//     checkpoint_ts too, once: that replaces a stored one past the clock
//     bound, which an effective checkpoint would otherwise keep.
//  4. Layout v2: upload the catalogs of the flows whose catalog content
//     changed (the windows of step 2, say). If one fails, step 5 waits for
//     the next advance: the checkpoint object never claims more than the
//     catalogs in the bucket say.
//  5. Write the checkpoint object(s): layout v1 one per flow, layout v2 the
//     one global object.
//
// Only the replica holding the advance turn (meta.Store.TakeAdvanceTurn,
// held for advanceTurnTTL) runs these steps; the others take the global
// checkpoint Redis holds for their gauges. Their cost is a read of every
// partition's checkpoint, the finalisation and the transaction of step 3
// (over every flow in layout v1), so run after each commit of each of N
// replicas they grew with N times the flows, and the replicas' advances
// made one another retry (docs/SIZING.md, "Replicas and Redis"). In layout
// v2 an advance costs the same whatever the number of idle flows
// (docs/SIZING.md, "Cost curves").
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
	live, err := f.livePartitions(ctx)
	if err != nil || len(live) == 0 {
		return err
	}
	cks, idle, err := c.d.Store.PartitionCheckpoints(ctx, topic, live)
	if err != nil {
		return err
	}
	var global uint64
	found, held := false, false
	for _, p := range live {
		if idle[p] {
			continue
		}
		ck, ok := cks[p]
		if !ok {
			held = true // a partition with records but no checkpoint yet
			break
		}
		if !found || ck < global {
			global, found = ck, true
		}
	}
	if n, err := c.d.Store.FinalizeCoverage(ctx, topic, live); err != nil {
		return fmt.Errorf("finalize coverage windows (checkpoint not advanced): %w", err)
	} else if n > 0 {
		c.log.Info("coverage windows final", "entries", n)
	}
	if held || !found || global == 0 {
		return nil
	}
	// Every resolved ts was within the bound when it arrived, so this only
	// caps what a version that took any ts left in ckpt:<topic>:<p>.
	bound := event.MaxTS(time.Now(), c.cfg.MaxClockSkew)
	flows := c.d.Registry.Flows()
	var advanced []meta.FlowID
	var ck uint64
	if c.cfg.v2() && f.flowCkptsDone {
		ck, err = c.d.Store.AdvanceGlobalCheckpoint(ctx, global, bound)
	} else {
		ids := make([]meta.FlowID, len(flows))
		for i, fl := range flows {
			ids[i] = fl.ID
		}
		advanced, ck, err = c.d.Store.AdvanceCheckpoints(ctx, ids, global, bound)
		f.flowCkptsDone = err == nil
	}
	if err != nil {
		return err
	}
	ck = max(min(ck, bound), global)
	f.setCheckpointGauges(flows, ck)
	if !c.cfg.v2() {
		return f.writeFlowCheckpoints(ctx, advanced, ck, bound)
	}
	if err := f.writeCatalogs(ctx); err != nil {
		return fmt.Errorf("%w (global checkpoint object kept at %d until they are written)", err, f.ckptWritten)
	}
	if ck <= f.ckptWritten {
		return nil
	}
	name := sink.CheckpointPathV2(c.d.GCSPrefix, c.d.Group)
	written, err := f.putNewest(ctx, name, ck, bound)
	if err != nil {
		return err
	}
	f.ckptWritten = written
	return nil
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

// livePartitions are the partitions of the apply topic with readable
// records: retention may have taken every record of one before anyone read
// it, and nothing there can be routed.
func (f *flusher) livePartitions(ctx context.Context) ([]int32, error) {
	topic := f.c.d.ApplyTopic
	ends, err := f.adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	var parts []int32
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			parts = append(parts, o.Partition)
		}
	})
	if len(parts) == 0 {
		return nil, nil
	}
	starts, err := f.adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list start offsets: %w", err)
	}
	live := parts[:0:0]
	for _, p := range parts {
		start, _ := starts.Lookup(topic, p)
		end, _ := ends.Lookup(topic, p)
		if start.Offset < end.Offset {
			live = append(live, p)
		}
	}
	return live, nil
}

// catalogParallel is how many catalogs an advance uploads at once at
// least: the first advance at width (a v1 deployment's first v2 start, or
// many creates) has one per flow to upload, each a small object, and
// --upload-parallelism alone made it take minutes at 300 flows. More than
// this many only with a larger --upload-parallelism: each catalog write
// holds a page of its state (and a flow's current windows, to sort them)
// and a connection, and streams the JSON through a file in --temp-dir.
const catalogParallel = 16

// writeCatalogs uploads the catalogs of the flows whose catalog content
// changed (layout v2). The first call of a flusher first makes every flow
// the prefix knew before catalogs existed dirty, once per prefix.
func (f *flusher) writeCatalogs(ctx context.Context) error {
	c := f.c
	if !f.catalogsInit {
		if err := c.d.Store.InitCatalogs(ctx); err != nil {
			return err
		}
		f.catalogsInit = true
	}
	w := catalog.Writer{Store: c.d.Store, Bucket: c.d.Bucket, Prefix: c.d.GCSPrefix, Group: c.d.Group,
		Log: c.log, Parallel: max(c.cfg.UploadParallel, catalogParallel), TempDir: c.cfg.TempDir}
	n, err := w.WriteDirty(ctx)
	if n > 0 {
		c.m.catalogsWritten.Add(float64(n))
	}
	if err != nil {
		return fmt.Errorf("write flow catalogs: %w", err)
	}
	return nil
}

// writeFlowCheckpoints writes the global_checkpoint object of every flow
// of ids (layout v1: the flows whose checkpoint moved), holding ck or the
// newest global checkpoint in Redis. One flow's failing object must not
// hold the others back.
func (f *flusher) writeFlowCheckpoints(ctx context.Context, ids []meta.FlowID, ck, bound uint64) error {
	c := f.c
	var errs []error
	for _, id := range ids {
		fl, ok := c.d.Registry.Flow(id)
		if !ok {
			continue
		}
		name := sink.CheckpointPath(c.d.GCSPrefix, fl.Info.CatalogName, fl.Info.FlowName, c.d.Group, fl.ID)
		if _, err := f.putNewest(ctx, name, ck, bound); err != nil {
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
// largest checkpoint whichever instance wrote first. It returns the value
// written last.
func (f *flusher) putNewest(ctx context.Context, name string, want, bound uint64) (uint64, error) {
	c := f.c
	for range 3 {
		if err := putCheckpoint(ctx, c.d.Bucket, name, want); err != nil {
			return 0, err
		}
		cur, ok, err := c.d.Store.GlobalCheckpointTS(ctx)
		if err != nil || !ok || min(cur, bound) <= want {
			return want, err
		}
		want = min(cur, bound)
	}
	return want, nil
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
	f.c.fatal.resumed(id)
	f.kick()
}
