package replay

import (
	"context"
	"fmt"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// logRun is one --mode log replay being written.
type logRun struct {
	req     *Request
	b       sink.Bucket
	w       *writer
	windows map[int64]sink.TableWindow
	// needed are the default-CF keys (encoded key and start ts) of the
	// values puts in range need that were prewritten at or before From.
	needed     map[string]bool
	neededMem  int64
	minNeeded  map[int64]uint64
	resolved   map[uint64]uint64 // per region, the resolved ts last sent
	batch      event.Batch
	batchBytes int
	progress   Progress
}

// pick chooses what chunk i of dataPath is to a log replay: a job (its
// entries in range), an early job (a default-CF chunk with entries at or
// before From, inside the window, which a put in range may need), both
// (a default-CF chunk that straddles From), or nothing.
func (l *logRun) pick(dataPath string, i int, f *sink.FileMeta) (j job, ok bool, e job, early bool) {
	if f.IsMeta || f.NumberOfEntries == 0 {
		return j, false, e, false
	}
	w, in := l.windows[f.TableID]
	if !in {
		return j, false, e, false
	}
	if keys := l.req.Selection.Keys(); !keys.All() && !keys.OverlapsChunk(f.StartKey, f.EndKey) {
		return j, false, e, false
	}
	j = job{dataPath: dataPath, index: i, f: *f, lo: max(l.req.From, w.Since) + 1, hi: w.Until, since: w.Since}
	j.f.StartKey, j.f.EndKey, j.f.FlowIDs = "", "", nil
	ok = f.MaxTS >= j.lo && f.MinTS <= j.hi
	if l.req.From > w.Since && f.CF == sink.CFDefault && f.Op == sink.OpPut && f.MinTS < j.lo && f.MaxTS > w.Since {
		e = j
		e.early, e.lo, e.hi = true, w.Since+1, j.lo-1
		early = true
	}
	return j, ok, e, early
}

// collectNeeded reads the write-CF put chunks in range that may reference
// a value prewritten at or before From and records the default-CF keys
// of those values.
func (l *logRun) collectNeeded(ctx context.Context, jobs []job) error {
	var scan []job
	for _, j := range jobs {
		if j.f.CF == sink.CFWrite && j.f.Op == sink.OpPut && j.f.MinBeginTSInDefaultCF < j.lo && j.lo > j.since+1 {
			scan = append(scan, j)
		}
	}
	limit := l.req.MaxMemory / 4
	return readAhead(ctx, l.b, scan, l.req.Parallel, l.req.MaxMemory/2, func(i int, data []byte) error {
		j := &scan[i]
		return eachEntry(j, data, func(key, value []byte, ts uint64) error {
			if ts < j.lo || ts > j.hi || !l.selected(key) {
				return nil
			}
			w, err := event.DecodeWrite(value)
			if err != nil {
				return fmt.Errorf("chunk %d of %s: %w", j.index, j.dataPath, err)
			}
			if w.Type != event.WritePut || w.HasShortValue || w.StartTS >= j.lo || w.StartTS <= j.since {
				return nil
			}
			enc, _, _ := event.SplitDataKey(key)
			dk := string(append(append([]byte{}, enc...), tsSuffix(w.StartTS)...))
			if !l.needed[dk] {
				l.needed[dk] = true
				l.neededMem += int64(len(dk)) + 48
				if l.neededMem > limit {
					return fmt.Errorf("the values prewritten at or before --from that the puts after it need take more than a quarter of --max-memory (%d bytes): raise --max-memory", l.req.MaxMemory)
				}
			}
			if cur, ok := l.minNeeded[j.f.TableID]; !ok || w.StartTS < cur {
				l.minNeeded[j.f.TableID] = w.StartTS
			}
			return nil
		})
	})
}

// selected reports whether the data key's raw key lies in the selection's
// key range (a chunk that overlaps the range may hold keys outside it).
func (l *logRun) selected(dataKey []byte) bool {
	keys := l.req.Selection.Keys()
	if keys.All() {
		return true
	}
	raw, _, err := event.DecodeDataKey(dataKey)
	return err == nil && keys.Holds(raw)
}

// tsSuffix is the last 8 bytes of a data key at ts: BE64(^ts).
func tsSuffix(ts uint64) []byte {
	var b [8]byte
	x := ^ts
	for i := 7; i >= 0; i-- {
		b[i] = byte(x)
		x >>= 8
	}
	return b[:]
}

// eachEntry calls fn for every framed entry of a chunk's bytes, with its
// ts.
func eachEntry(j *job, data []byte, fn func(key, value []byte, ts uint64) error) error {
	for rest := data; len(rest) > 0; {
		k, v, r, err := event.NextEntry(rest)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", j.index, j.dataPath, err)
		}
		_, ts, err := event.SplitDataKey(k)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", j.index, j.dataPath, err)
		}
		if err := fn(k, v, ts); err != nil {
			return err
		}
		rest = r
	}
	return nil
}

// replayJob sends a job's entries as records of their region, then the
// region's new resolved ts: the highest that no later job of the region
// can pass (afterOf), at most To. A chunk of several regions is sent run by
// run (its FileMeta.Regions, in entry order), each run's entries as
// records of the run's region; a region's resolved ts moves after its last
// run in the chunk.
func (l *logRun) replayJob(ctx context.Context, j *job, data []byte) error {
	cf, op := event.CFDefault, event.OpPut
	if j.f.CF == sink.CFWrite {
		cf = event.CFWrite
	}
	if j.f.Op == sink.OpDelete {
		op = event.OpDelete
	}
	var runs []sink.RegionRun
	j.f.EachRegion(func(region uint64, n int64) { runs = append(runs, sink.RegionRun{Region: region, Entries: n}) })
	lastRun := make(map[uint64]int, 1)
	for k, r := range runs {
		lastRun[r.Region] = k
	}
	k, left := 0, runs[0].Entries
	l.startBatch(runs[0].Region)
	err := eachEntry(j, data, func(key, value []byte, ts uint64) error {
		for left == 0 {
			if err := l.endRun(ctx, j, runs[k].Region, lastRun[runs[k].Region] == k); err != nil {
				return err
			}
			if k++; k == len(runs) {
				return fmt.Errorf("chunk %d of %s: more entries than its number_of_entries %d", j.index, j.dataPath, j.f.NumberOfEntries)
			}
			left = runs[k].Entries
			l.startBatch(runs[k].Region)
		}
		left--
		if ts < j.lo || ts > j.hi || j.early && !l.needed[string(key)] || !l.selected(key) {
			return nil
		}
		if l.batchBytes > 0 && l.batchBytes+len(key)+len(value) > l.w.cut {
			if err := l.w.send(ctx, &l.batch); err != nil {
				return err
			}
			l.batch.Events, l.batchBytes = dropEvents(l.batch.Events), 0
		}
		l.batch.Events = append(l.batch.Events, event.Event{Key: key, Value: value, CF: cf, Op: op})
		l.batchBytes += len(key) + len(value)
		return nil
	})
	if err != nil {
		return err
	}
	if k != len(runs)-1 || left != 0 {
		return fmt.Errorf("chunk %d of %s: fewer entries than its number_of_entries %d", j.index, j.dataPath, j.f.NumberOfEntries)
	}
	return l.endRun(ctx, j, runs[k].Region, true)
}

// startBatch starts the records of a run of region's entries, at the
// region's resolved ts so far.
func (l *logRun) startBatch(region uint64) {
	l.batch = event.Batch{RegionID: region, ResolvedTS: l.resolved[region], Events: dropEvents(l.batch.Events)}
	l.batchBytes = 0
}

// dropEvents empties a batch's events for reuse. Its keys and values are
// slices of the chunk they were read from: left in the backing array, they
// would keep old chunks alive past the read-ahead's memory budget (a
// chunk of a large cycle is tens of MB).
func dropEvents(evs []event.Event) []event.Event {
	clear(evs)
	return evs[:0]
}

// endRun sends what the batch of a run of region holds. After the
// region's last run in the job (last) it also moves the region's resolved
// ts: the record carries the highest that no later job of the region can
// pass, never lower than before, and is sent even without events when the
// ts moves or the region had none yet.
func (l *logRun) endRun(ctx context.Context, j *job, region uint64, last bool) error {
	if !last {
		if len(l.batch.Events) == 0 {
			return nil
		}
		return l.w.send(ctx, &l.batch)
	}
	res := l.req.To
	if after := j.afterOf(region); after != 0 {
		res = min(res, after-1)
	}
	prev, seen := l.resolved[region]
	res = max(res, prev) // after only grows along a region's jobs; never step back
	if len(l.batch.Events) > 0 || !seen || res > prev {
		l.batch.ResolvedTS = res
		if err := l.w.send(ctx, &l.batch); err != nil {
			return err
		}
	}
	l.resolved[region] = res
	return nil
}
