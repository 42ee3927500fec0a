package sink

import (
	"context"
	"fmt"
	"math"
	"sync"
)

// A restore plan: which snapshot each table starts from, and which log
// chunks it reads on top.
//
// Without a snapshot a table reads its window's events, since < ts <= TS.
// With a snapshot at S (cut from the same window) the table's state at S is
// the snapshot's, so only write records with S < commit ts <= TS are read.
// Their default-CF values may have been prewritten at or before S, though:
// a put committed after S can reference a value at any start ts inside the
// window. The write-CF chunks read say how far back that reaches
// (min_begin_ts_in_default_cf, the min start ts of their records), so the
// default-CF entries read are those with ts >= that bound (and > since, as
// without a snapshot: a value prewritten before the window was never
// backed up, and the put counts as NoValue either way).

// The metas are streamed twice (see meta_stream.go): planRestore reads
// them once to check every one and to learn what the plan needs to know of
// all of them (whether a write record is at or below TS, and the bound on
// default-CF values above), then the chunk readers take the plan's jobs as
// a second read of the metas yields them (restorePlan.each). So a restore
// holds no meta and no list of chunks, however many the flow has.

// chunkJob is one chunk to read, and the ts range of its entries that
// matter: lo <= ts <= hi.
type chunkJob struct {
	path   string
	index  int
	f      FileMeta
	lo, hi uint64
}

// keep reports whether an entry at ts of the job's chunk is read.
func (j *chunkJob) keep(ts uint64) bool { return j.lo <= ts && ts <= j.hi }

// restorePlan is what a restore reads.
type restorePlan struct {
	o     *RestoreOptions
	bases map[int64]snapshotBase // tables restored from a snapshot
	// minBegin is, per table with a snapshot, the min start ts of the write
	// records of the write-CF chunks read: the oldest default-CF value
	// they can reference.
	minBegin map[int64]uint64
	chunks   int // chunks the plan reads
}

// How pick classifies a chunk.
const (
	pickNone        = iota
	pickRead        // read it
	pickBaseWrite   // a write-CF chunk after its table's snapshot: read it
	pickBaseDefault // a default-CF chunk of a table with a snapshot: read it only if minBegin says a write read may need it
)

// pick decides what chunk i of dataPath, described by f, is to the plan.
func (p *restorePlan) pick(dataPath string, i int, f *FileMeta) (chunkJob, int) {
	o := p.o
	if f.IsMeta || f.Op != OpPut || f.NumberOfEntries == 0 && f.RawLength == 0 || !o.selected(f.TableID) || f.MinTS > o.TS ||
		!o.keys.overlaps(f.StartKey, f.EndKey) {
		return chunkJob{}, pickNone
	}
	j := chunkJob{path: dataPath, index: i, f: *f, hi: o.TS}
	if o.Windows != nil {
		w, ok := o.Windows[f.TableID]
		if !ok || f.MaxTS <= w.Since || f.MinTS > w.Until {
			return chunkJob{}, pickNone // no event of the chunk is inside the window
		}
		j.lo, j.hi = w.Since+1, w.Until
	}
	j.f.StartKey, j.f.EndKey, j.f.FlowIDs = "", "", nil // not needed: hold less per chunk
	b, ok := p.bases[f.TableID]
	switch {
	case !ok:
		return j, pickRead
	case f.CF == CFWrite:
		if f.MaxTS <= b.ts {
			return chunkJob{}, pickNone // all in the snapshot
		}
		j.lo = max(j.lo, b.ts+1)
		return j, pickBaseWrite
	}
	return j, pickBaseDefault
}

// job returns the job of chunk i of dataPath, once the first read of the
// metas has set minBegin, and whether the chunk is read at all.
func (p *restorePlan) job(dataPath string, i int, f *FileMeta) (chunkJob, bool) {
	j, kind := p.pick(dataPath, i, f)
	switch kind {
	case pickNone:
		return j, false
	case pickBaseDefault:
		lo := p.minBegin[f.TableID]
		if j.f.MaxTS < lo {
			return j, false // no put read references a value this early
		}
		j.lo = max(j.lo, lo)
	}
	return j, true
}

// each reads the metas again, in order, and sends every job of the plan.
func (p *restorePlan) each(ctx context.Context, send func(chunkJob) error) error {
	for _, mp := range p.o.MetaPaths {
		_, err := streamFlowMeta(ctx, p.o.Bucket, p.o.Flow, mp, !p.o.Keys.All(), nil, func(m *Meta, i int, f *FileMeta) error {
			if j, ok := p.job(m.DataPath, i, f); ok {
				return send(j)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// planScan is what the first read of one meta learns.
type planScan struct {
	first    uint64 // min_ts of the earliest write-CF chunk
	writes   bool   // a write-CF chunk starts at or below TS
	minBegin map[int64]uint64
	defMax   map[int64][]uint64 // max_ts of the default-CF chunks of tables with a snapshot
	chunks   int                // chunks read whatever minBegin is
}

func (s *planScan) file(p *restorePlan, dataPath string, i int, f *FileMeta) {
	o := p.o
	// Whether the restore has data as of TS is a question of its tables,
	// not of its key range: a range without keys restores empty tables.
	if f.CF == CFWrite && !f.IsMeta && f.Op == OpPut && (f.NumberOfEntries > 0 || f.RawLength > 0) && o.selected(f.TableID) {
		if s.first == 0 || f.MinTS < s.first {
			s.first = f.MinTS
		}
		s.writes = s.writes || f.MinTS <= o.TS
	}
	j, kind := p.pick(dataPath, i, f)
	switch kind {
	case pickRead:
		s.chunks++
	case pickBaseWrite:
		s.chunks++
		if v, ok := s.minBegin[f.TableID]; !ok || f.MinBeginTSInDefaultCF < v {
			s.minBegin[f.TableID] = f.MinBeginTSInDefaultCF
		}
	case pickBaseDefault:
		s.defMax[f.TableID] = append(s.defMax[f.TableID], j.f.MaxTS)
	}
}

// planRestore picks the tables' snapshots and reads the metas through
// once: each must be the flow's and valid. It fails with a *NoDataError if
// no table has a snapshot and no write-CF chunk of the restored tables
// starts at or below TS, and with a *TruncatedError if the log a table
// needs was truncated.
func planRestore(ctx context.Context, o *RestoreOptions) (*restorePlan, error) {
	if o.TS < o.TruncatedBefore {
		return nil, &TruncatedError{TS: o.TS, TruncatedBefore: o.TruncatedBefore, Table: -1}
	}
	bases, err := pickBases(ctx, *o)
	if err != nil {
		return nil, err
	}
	for id, w := range o.Windows {
		if o.TruncatedBefore == 0 || w.Since >= o.TruncatedBefore {
			continue
		}
		if b, ok := bases[id]; !ok || b.ts < o.TruncatedBefore {
			return nil, &TruncatedError{TS: o.TS, TruncatedBefore: o.TruncatedBefore, Table: id}
		}
	}
	p := &restorePlan{o: o, bases: bases, minBegin: map[int64]uint64{}}
	for id := range bases {
		p.minBegin[id] = math.MaxUint64
	}
	var (
		mu  sync.Mutex
		all = planScan{minBegin: p.minBegin, defMax: map[int64][]uint64{}}
	)
	err = forEach(ctx, len(o.MetaPaths), o.Parallel, func(ctx context.Context, k int) error {
		s := planScan{minBegin: map[int64]uint64{}, defMax: map[int64][]uint64{}}
		_, err := streamFlowMeta(ctx, o.Bucket, o.Flow, o.MetaPaths[k], !o.Keys.All(), nil, func(m *Meta, i int, f *FileMeta) error {
			s.file(p, m.DataPath, i, f)
			return nil
		})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if s.first != 0 && (all.first == 0 || s.first < all.first) {
			all.first = s.first
		}
		all.writes = all.writes || s.writes
		all.chunks += s.chunks
		for t, v := range s.minBegin {
			all.minBegin[t] = min(all.minBegin[t], v)
		}
		for t, v := range s.defMax {
			all.defMax[t] = append(all.defMax[t], v...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	p.chunks = all.chunks
	for t, maxes := range all.defMax {
		for _, m := range maxes {
			if m >= p.minBegin[t] {
				p.chunks++
			}
		}
	}
	if !all.writes && len(bases) == 0 {
		return nil, &NoDataError{TS: o.TS, First: all.first}
	}
	return p, nil
}

// TruncatedError is a restore that needs log the flow no longer holds: a
// ts below the truncation point, or a table whose window began before the
// truncation point and that no snapshot at or after it holds.
type TruncatedError struct {
	TS              uint64
	TruncatedBefore uint64 // the oldest restorable ts
	Table           int64  // the table that cannot be restored, or -1 for all
}

func (e *TruncatedError) Error() string {
	if e.Table < 0 {
		return fmt.Sprintf("cannot restore as of %d: the log before %d was truncated; the oldest restorable ts is %d", e.TS, e.TruncatedBefore, e.TruncatedBefore)
	}
	return fmt.Sprintf("cannot restore table %d as of %d: the log before %d was truncated and no listed snapshot at or after it holds the table's window", e.Table, e.TS, e.TruncatedBefore)
}
