package sink

import (
	"context"
	"fmt"
	"math"
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
	jobs  []chunkJob
	bases map[int64]snapshotBase // tables restored from a snapshot
}

// planRestore picks the tables' snapshots, reads the metas and lists the
// chunks the restore needs. It fails with a *NoDataError if no table has a
// snapshot and no write-CF chunk of the restored tables starts at or below
// TS, and with a *TruncatedError if the log a table needs was truncated.
func planRestore(ctx context.Context, o RestoreOptions) (*restorePlan, error) {
	if o.TS < o.TruncatedBefore {
		return nil, &TruncatedError{TS: o.TS, TruncatedBefore: o.TruncatedBefore, Table: -1}
	}
	bases, err := pickBases(ctx, o)
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
	p := &restorePlan{bases: bases}
	var (
		first  uint64 // min_ts of the earliest write-CF chunk
		writes bool   // a write-CF chunk starts at or below TS
		// minBegin is, per table with a snapshot, the min start ts of the
		// write records of the write-CF chunks read.
		minBegin = map[int64]uint64{}
		defaults []chunkJob
	)
	for id := range bases {
		minBegin[id] = math.MaxUint64
	}
	for _, mp := range o.MetaPaths {
		m, err := readFlowMeta(ctx, o.Bucket, o.Flow, mp)
		if err != nil {
			return nil, err
		}
		for i, f := range m.Files {
			if f.IsMeta || f.Op != OpPut || f.NumberOfEntries == 0 && f.RawLength == 0 {
				continue
			}
			if o.Tables != nil && !o.Tables[f.TableID] {
				continue
			}
			if f.CF == CFWrite {
				if first == 0 || f.MinTS < first {
					first = f.MinTS
				}
				writes = writes || f.MinTS <= o.TS
			}
			if f.MinTS > o.TS {
				continue
			}
			j := chunkJob{path: m.DataPath, index: i, f: f, hi: o.TS}
			if o.Windows != nil {
				w, ok := o.Windows[f.TableID]
				if !ok || f.MaxTS <= w.Since || f.MinTS > w.Until {
					continue // no event of the chunk is inside the window
				}
				j.lo, j.hi = w.Since+1, w.Until
			}
			j.f.StartKey, j.f.EndKey = "", "" // not needed: hold less per chunk
			b, ok := bases[f.TableID]
			switch {
			case !ok:
				p.jobs = append(p.jobs, j)
			case f.CF == CFWrite:
				if f.MaxTS <= b.ts {
					continue // all in the snapshot
				}
				j.lo = max(j.lo, b.ts+1)
				minBegin[f.TableID] = min(minBegin[f.TableID], f.MinBeginTSInDefaultCF)
				p.jobs = append(p.jobs, j)
			default:
				defaults = append(defaults, j) // once minBegin is known
			}
		}
	}
	for _, j := range defaults {
		lo := minBegin[j.f.TableID]
		if j.f.MaxTS < lo {
			continue // no put read references a value this early
		}
		j.lo = max(j.lo, lo)
		p.jobs = append(p.jobs, j)
	}
	if !writes && len(bases) == 0 {
		return nil, &NoDataError{TS: o.TS, First: first}
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
