package replay

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// shortValueMax is the longest value a write record carries itself (its
// length is one byte); a longer one goes in a default-CF entry.
const shortValueMax = 255

// runState is a --mode state replay: the MVCC state at To as restore
// reads it (sink.ReadState), key by key in key order. A key's state does
// not remember the region that wrote it, so a table's keys go under region
// id = the table id. Each key is a write-CF put at its commit ts with start
// ts commit ts - 1, carrying a value of up to 255 bytes itself and a longer
// one in a default-CF put at the start ts, sent just before it. The
// records carry resolved ts 0 (no key not yet sent is known to be newer
// than any ts) and, after the last key, every region used gets a
// heartbeat at To.
func runState(ctx context.Context, b sink.Bucket, f sink.Flow, plan backup.ReadPlan, req *Request, w *writer) error {
	var (
		batch event.Batch
		bytes int
		used  = map[uint64]uint64{}
	)
	flush := func() error {
		if len(batch.Events) == 0 {
			return nil
		}
		err := w.send(ctx, &batch)
		batch.Events, bytes = batch.Events[:0], 0
		return err
	}
	tmp := req.TempDir
	if tmp == "" {
		tmp = os.TempDir()
	}
	var prog Progress
	_, err := sink.ReadState(ctx, sink.RestoreOptions{
		Bucket: b, Flow: f, MetaPaths: plan.Metas, TS: plan.TS, Tables: req.Selection.Tables, Keys: req.Selection.Keys(), Windows: plan.Windows,
		TempDir: tmp, MaxMemory: req.MaxMemory - producerMemory(req.MaxMemory), Parallel: req.Parallel,
		Snapshots: plan.Snapshots, TruncatedBefore: plan.TruncatedBefore,
	}, func(tid int64, dataKey []byte, commitTS uint64, value []byte) error {
		region := uint64(tid)
		if region != batch.RegionID || bytes+len(dataKey)*2+len(value) > w.cut && bytes > 0 {
			if err := flush(); err != nil {
				return err
			}
			batch.RegionID = region
		}
		used[region] = plan.TS
		enc, _, err := event.SplitDataKey(dataKey)
		if err != nil {
			return err
		}
		start := commitTS - 1
		wr := event.Write{Type: event.WritePut, StartTS: start}
		if len(value) > shortValueMax {
			dk := append(slices.Clone(enc), tsSuffix(start)...)
			batch.Events = append(batch.Events, event.Event{Key: dk, Value: slices.Clone(value), CF: event.CFDefault})
		} else {
			wr.ShortValue, wr.HasShortValue = value, true
		}
		wv, err := event.AppendWrite(nil, wr)
		if err != nil {
			return fmt.Errorf("table %d: %w", tid, err)
		}
		batch.Events = append(batch.Events, event.Event{Key: slices.Clone(dataKey), Value: wv, CF: event.CFWrite})
		bytes += len(dataKey)*2 + len(value)
		return nil
	}, func(p sink.RestoreProgress) {
		if req.Progress != nil {
			prog.Chunks, prog.ChunksTotal = p.Chunks, p.ChunksTotal
			prog.Records, prog.Bytes, prog.Skipped = w.res.Records+w.res.Skipped, w.res.Bytes, w.res.Skipped
			req.Progress(prog)
		}
		w.res.Chunks, w.res.LogBytes = p.Chunks, p.LogBytes
	})
	if err != nil {
		return backup.ReadErr(err, plan.Flow, plan.TS, false)
	}
	if err := flush(); err != nil {
		return err
	}
	for _, r := range sortedRegions(used) {
		if err := w.send(ctx, &event.Batch{RegionID: r, ResolvedTS: plan.TS}); err != nil {
			return err
		}
	}
	return nil
}
