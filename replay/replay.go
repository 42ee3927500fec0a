package replay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// producerMemory is the share of MaxMemory the target's queue of records
// may hold, at most 32 MiB.
func producerMemory(maxMemory int64) int64 { return min(maxMemory/4, 32<<20) }

// chunkMemory is the share of MaxMemory the chunks read ahead may hold:
// what the producer's queue leaves, less as much again for the rest of the
// process (its code, the batches being encoded, the garbage collector's
// slack), so that the replay's peak RSS stays near MaxMemory. With all of
// the rest for chunks a 128 MiB replay peaked at 189-200 MiB.
func chunkMemory(maxMemory int64) int64 {
	return maxMemory - 2*producerMemory(maxMemory)
}

// ProducerMemory is the bytes of queued records a target for a replay with
// memory budget maxMemory should hold at most (NewKafkaTarget's
// maxBuffered); chunks read ahead hold what chunkMemory leaves them.
func ProducerMemory(maxMemory int64) int64 {
	if maxMemory <= 0 {
		maxMemory = 128 << 20
	}
	return producerMemory(maxMemory)
}

// Run replays the flow req names into t (see the package comment for what
// it writes and why a re-run resumes). It reads exactly what a restore at
// req.To reads, by the same rules (backup.PlanRead): tables not restorable
// at To are left out and reported as backup.LeftOut events, and none left
// fails with a *backup.UncoveredError.
func Run(ctx context.Context, src backup.Source, t Target, req Request) (Result, error) {
	req.defaults()
	res := Result{Mode: req.Mode, From: req.From}
	if err := req.Validate(); err != nil {
		return res, err
	}
	plan, err := backup.PlanRead(ctx, src, backup.Request{Flow: req.Flow, TS: req.To, MaxClockSkew: req.MaxClockSkew, Notify: req.Notify},
		req.Selection, req.Mode == ModeLog)
	res.Flow, res.To = plan.Flow, plan.TS
	if err != nil {
		return res, err
	}
	if res.From >= res.To {
		return res, &RangeError{From: res.From, To: res.To}
	}
	res.Tables = slices.Sorted(maps.Keys(plan.Windows))
	parts, err := t.Partitions(ctx)
	if err != nil {
		return res, err
	}
	maxBatch := t.MaxBatchBytes()
	res.RunID = RunID(uint32(plan.Flow.ID), req.Mode, res.From, res.To, res.Tables, req.Selection.StartKey, req.Selection.EndKey, req.Format, RecordEvents(maxBatch))
	header := runHeader(uint32(plan.Flow.ID), res.RunID)
	written, err := t.Written(ctx, header)
	if err != nil {
		return res, err
	}
	w := &writer{t: t, topic: req.Topic, parts: parts, maxBatch: maxBatch, cut: RecordEvents(maxBatch), written: written, header: []byte(header), json: req.Format == FormatJSON,
		lim: newLimiter(req.Rate, req.Clock), res: &res, regions: map[uint64]bool{}}
	flow := plan.Flow.Sink(src.Prefix)
	switch req.Mode {
	case ModeState:
		err = runState(ctx, src.Bucket, flow, plan, &req, w)
	default:
		if err = backup.CheckTruncated(plan.Flow, res.From, plan.TruncatedBefore); err == nil {
			err = runLog(ctx, src.Bucket, flow, plan, &req, w)
		}
	}
	res.Regions = len(w.regions)
	var tooLarge *RecordTooLargeError
	switch {
	case err == nil:
		err = t.Flush(ctx)
	case errors.As(err, &tooLarge):
		// The records before it are written whole, so that the same
		// command resumes after them once the topic takes the record.
		if ferr := t.Flush(ctx); ferr != nil {
			err = fmt.Errorf("%w (and writing the records before it: %v)", err, ferr)
		}
	}
	return res, err
}

// runLog is a --mode log replay.
func runLog(ctx context.Context, b sink.Bucket, f sink.Flow, plan backup.ReadPlan, req *Request, w *writer) error {
	l := &logRun{req: req, b: b, w: w, windows: plan.Windows, needed: map[string]bool{}, minNeeded: map[int64]uint64{}, resolved: map[uint64]uint64{}}
	req.To = plan.TS
	cycles, err := readCycles(ctx, b, f, plan.Metas, !req.Selection.Keys().All(), l.pick)
	if err != nil {
		return err
	}
	order, err := orderCycles(cycles)
	if err != nil {
		return err
	}
	var jobs, early []job
	for _, i := range order {
		jobs = append(jobs, cycles[i].jobs...)
		early = append(early, cycles[i].early...)
	}
	if len(early) > 0 {
		if err := l.collectNeeded(ctx, jobs); err != nil {
			return err
		}
		kept := early[:0]
		for _, j := range early {
			if m, ok := l.minNeeded[j.f.TableID]; ok && j.f.MaxTS >= m {
				kept = append(kept, j)
			}
		}
		jobs = append(kept, jobs...)
	}
	linkRegions(jobs)
	l.progress.ChunksTotal = len(jobs)
	err = readAhead(ctx, b, jobs, req.Parallel, chunkMemory(req.MaxMemory), func(i int, data []byte) error {
		if err := l.replayJob(ctx, &jobs[i], data); err != nil {
			return err
		}
		w.res.Chunks++
		w.res.LogBytes += jobs[i].f.RawLength
		if req.Progress != nil {
			l.progress.Chunks, l.progress.Records, l.progress.Bytes, l.progress.Skipped = i+1, w.res.Records+w.res.Skipped, w.res.Bytes, w.res.Skipped
			req.Progress(l.progress)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// A state replay at From keys its records by table id and leaves
	// those regions at From; a log replay after it must end them at To
	// too, or a consumer of the topic never passes From.
	for _, tid := range slices.Sorted(maps.Keys(plan.Windows)) {
		if _, ok := l.resolved[uint64(tid)]; !ok {
			if err := w.send(ctx, &event.Batch{RegionID: uint64(tid), ResolvedTS: plan.TS}); err != nil {
				return err
			}
			l.resolved[uint64(tid)] = plan.TS
		}
	}
	return nil
}
