package pipeline

import (
	"context"
	"math"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// Coverage reports (docs/FORMAT.md, "Coverage rule"; the Redis side is in
// meta/coverage.go).
//
// A partition's value for a pending entry is the one at its routing
// boundary: the moment the consume loop first routed with the table added
// (or without it). The loop captures those values when it sees the change
// (observeFlows, before it routes another record) and reports them once
// Redis shows the entry and the registry routes the flow as Redis holds it,
// which may be later. A partition assigned after the change routed the new
// definition from its start offset, so its values are those of the
// committed position there.

// covCapture is a partition's boundary values for the pending entries of
// one flow numbered after < seq <= upto: the entries of the DDL the consume
// loop saw applied between two registry views (a drop: every entry after).
// Captures are per seq range, never per table, so a table removed, added and
// removed again while the registry lagged gets each removal's own boundary.
type covCapture struct {
	flow         meta.FlowID
	after, upto  uint64
	since, until covValue
}

// covEntry keys a pending entry a partition has reported.
type covEntry struct {
	flow meta.FlowID
	seq  uint64
}

// covValue is a partition's value for an entry: a ts, or idle.
type covValue struct {
	ts   uint64
	idle bool
}

// partCoverage is a partition's coverage state in this session.
type partCoverage struct {
	start    meta.PartitionStart
	captured []covCapture
	reported map[covEntry]bool
	reports  []meta.CoverageReport // valued, for the next freeze
}

func newPartCoverage(start meta.PartitionStart) partCoverage {
	return partCoverage{start: start, reported: map[covEntry]bool{}}
}

// captureBoundaries records, for every owned partition, its boundary
// values for the coverage entries of every flow whose coverage seq moved
// between two views (a created flow: from 0; a dropped one: every entry
// after the old view's). Must hold s.mu; the caller freezes right after
// when tables were lost.
func (s *session) captureBoundaries(old, now flowView) {
	if old.tables == nil {
		return // the session's first view: partitions start on it
	}
	var caps []covCapture
	for id := range now.tables {
		was, ok := old.seqs[id]
		if ok && was >= now.seqs[id] {
			continue
		}
		if !ok {
			was = 0
		}
		caps = append(caps, covCapture{flow: id, after: was, upto: now.seqs[id]})
	}
	for id := range old.tables {
		if _, ok := now.tables[id]; !ok {
			caps = append(caps, covCapture{flow: id, after: old.seqs[id], upto: math.MaxUint64})
		}
	}
	if len(caps) == 0 {
		return
	}
	tnow := time.Now()
	for _, ps := range s.parts {
		since := s.boundaryValue(ps, meta.CoverageSince, tnow)
		until := s.boundaryValue(ps, meta.CoverageUntil, tnow)
		for _, c := range caps {
			c.since, c.until = since, until
			ps.cov.captured = append(ps.cov.captured, c)
		}
	}
}

// capturedValue is ps's captured value for entry e of flow id, and false if
// the entry came before the partition's first view (its value is then that
// of its start position).
func (pc *partCoverage) capturedValue(id meta.FlowID, e meta.CoverageEntry) (covValue, bool) {
	for _, c := range pc.captured {
		if c.flow == id && c.after < e.Seq && e.Seq <= c.upto {
			if e.Kind == meta.CoverageSince {
				return c.since, true
			}
			return c.until, true
		}
	}
	return covValue{}, false
}

// boundaryValue is ps's value for a bound of kind now: for since, the
// highest commit ts it has seen; for until, its checkpoint (idle without a
// live region). A partition that has handled no record yet stands at its
// committed position.
func (s *session) boundaryValue(ps *partState, kind string, now time.Time) covValue {
	if ps.next < 0 {
		return startValue(ps.cov.start, kind)
	}
	if kind == meta.CoverageSince {
		return covValue{ts: ps.maxTS}
	}
	ck, ok := ps.checkpoint(now, s.c.cfg.RegionTTL)
	if !ok {
		return covValue{idle: true}
	}
	return covValue{ts: ck}
}

// startValue is a partition's value at its committed position: the
// committed max ts for since; for until the committed checkpoint, idle if
// it was idle, and 0 (nothing covered) if there is none.
func startValue(st meta.PartitionStart, kind string) covValue {
	if kind == meta.CoverageSince {
		return covValue{ts: st.MaxTS}
	}
	if st.Idle {
		return covValue{idle: true}
	}
	return covValue{ts: st.Ckpt}
}

// collectCoverage turns pending entries into reports of every owned
// partition that has not reported them, for the flows the registry routes
// as Redis holds them now. A failure leaves s.covDirty set: the values are
// captured already, so a later try reports the same ones.
func (s *session) collectCoverage(ctx context.Context) {
	c := s.c
	pending, err := c.d.Store.PendingCoverage(ctx)
	if err != nil {
		c.log.Warn("reading pending coverage windows failed; retried on the next poll", "err", err)
		return
	}
	s.covDirty = false
	for _, pf := range pending {
		f, known := c.d.Registry.Flow(pf.ID)
		if pf.Exists != known || known && !f.Info.UpdatedTime.Equal(pf.Info.UpdatedTime) {
			s.covDirty = true // the registry lags Redis: after its refresh
			continue
		}
		for _, e := range pf.Entries {
			key := covEntry{pf.ID, e.Seq}
			for _, ps := range s.parts {
				if ps.cov.reported[key] {
					continue
				}
				ps.cov.reported[key] = true
				v, ok := ps.cov.capturedValue(pf.ID, e)
				if !ok {
					v = startValue(ps.cov.start, e.Kind)
				}
				ps.cov.reports = append(ps.cov.reports, meta.CoverageReport{
					FlowID: pf.ID, Seq: e.Seq, Topic: c.d.ApplyTopic, Partition: ps.partition, TS: v.ts, Idle: v.idle,
				})
			}
		}
	}
}

// takeReports moves every partition's reports into cyc. Must hold s.mu.
func (s *session) takeReports(cyc *cycle) {
	for _, ps := range s.parts {
		if len(ps.cov.reports) == 0 {
			continue
		}
		cyc.coverage = append(cyc.coverage, ps.cov.reports...)
		cyc.covLeases = append(cyc.covLeases, ps.lease)
		ps.cov.reports = nil
	}
}
