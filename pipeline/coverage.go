package pipeline

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// Coverage reports (docs/FORMAT.md, "Coverage rule"; the Redis side is in
// meta/coverage.go).
//
// A partition's values for a pending step are those at its routing
// boundary: the moment the consume loop first routed with the step's
// tables added and removed. The loop captures them when it sees the change
// (observeFlows, before it routes another record) and reports them once
// Redis shows the step and the registry routes the flow as Redis holds it,
// which may be later. A partition assigned after the change routed the new
// definition from its start offset, so its values are those of the
// committed position there. Each report also says up to which step the
// boundary moved (upto): the steps one registry refresh jumped over share
// a boundary, so that the finalizer can treat them as one change.

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

// The two bounds of a step's values.
const (
	boundSince = "since" // of the tables it adds
	boundUntil = "until" // of the tables it removes
)

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
	start meta.PartitionStart
	// startSeqs are the flows' coverage seqs in the view the partition
	// started routing with (nil until the session's first view): the
	// steps up to them were crossed at the start position.
	startSeqs map[meta.FlowID]uint64
	captured  []covCapture
	reported  map[covEntry]bool
	reports   []meta.CoverageReport // valued, for the next freeze
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
		// The session's first view: partitions start on it.
		for _, ps := range s.parts {
			if ps.cov.startSeqs == nil {
				ps.cov.startSeqs = now.seqs
			}
		}
		return
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
		since := s.boundaryValue(ps, boundSince, tnow)
		until := s.boundaryValue(ps, boundUntil, tnow)
		for _, c := range caps {
			c.since, c.until = since, until
			ps.cov.captured = append(ps.cov.captured, c)
		}
	}
}

// report is ps's report of step e of flow id: the values captured at the
// boundary that crossed it, or, for a step before the partition's first
// view, those of its start position, crossed with every step up to that
// view's.
func (pc *partCoverage) report(id meta.FlowID, e meta.CoverageEntry) (since, until covValue, upto uint64) {
	for _, c := range pc.captured {
		if c.flow == id && c.after < e.Seq && e.Seq <= c.upto {
			return c.since, c.until, c.upto
		}
	}
	return startValue(pc.start, boundSince), startValue(pc.start, boundUntil), max(pc.startSeqs[id], e.Seq)
}

// forget drops what no pending step of flows can use any more: the reports
// made of steps no longer pending and the captures below every pending
// step, so that a long session keeps only what its pending steps need.
func (pc *partCoverage) forget(pending map[meta.FlowID]uint64) {
	for k := range pc.reported {
		if first, ok := pending[k.flow]; !ok || k.seq < first {
			delete(pc.reported, k)
		}
	}
	pc.captured = slices.DeleteFunc(pc.captured, func(c covCapture) bool {
		first, ok := pending[c.flow]
		return !ok || c.upto < first
	})
}

// boundaryValue is ps's value for a bound of kind now: for since, the
// highest commit ts it has seen; for until, its checkpoint (idle without a
// live region). A partition that has handled no record yet stands at its
// committed position.
func (s *session) boundaryValue(ps *partState, kind string, now time.Time) covValue {
	if ps.next < 0 {
		return startValue(ps.cov.start, kind)
	}
	if kind == boundSince {
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
	if kind == boundSince {
		return covValue{ts: st.MaxTS}
	}
	if st.Idle {
		return covValue{idle: true}
	}
	return covValue{ts: st.Ckpt}
}

// collectCoverage turns pending steps into reports of every owned
// partition that has not reported them, for the flows the registry routes
// as Redis holds them now (the same coverage seq). A failure leaves
// s.covDirty set: the values are captured already, so a later try reports
// the same ones.
func (s *session) collectCoverage(ctx context.Context) {
	c := s.c
	pending, err := c.d.Store.PendingCoverage(ctx)
	if err != nil {
		c.log.Warn("reading pending coverage windows failed; retried on the next poll", "err", err)
		return
	}
	s.covDirty = false
	first := make(map[meta.FlowID]uint64, len(pending))
	for _, pf := range pending {
		first[pf.ID] = pf.Entries[0].Seq
		f, known := c.d.Registry.Flow(pf.ID)
		if pf.Exists != known || known && f.CoverageSeq != pf.Seq {
			s.covDirty = true // the registry lags Redis: after its refresh
			continue
		}
		if !known { // dropped: named by its last definition, if Redis kept it
			f = &meta.Flow{ID: pf.ID, Info: pf.Info}
		}
		if s.covFlows == nil {
			s.covFlows = map[meta.FlowID]*meta.Flow{}
		}
		s.covFlows[pf.ID] = f
		for _, e := range pf.Entries {
			key := covEntry{pf.ID, e.Seq}
			for _, ps := range s.parts {
				if ps.cov.reported[key] {
					continue
				}
				ps.cov.reported[key] = true
				since, until, upto := ps.cov.report(pf.ID, e)
				ps.cov.reports = append(ps.cov.reports, meta.CoverageReport{
					FlowID: pf.ID, Seq: e.Seq, Topic: c.d.ApplyTopic, Partition: ps.partition,
					Since: meta.CoverageValue{TS: since.ts, Idle: since.idle},
					Until: meta.CoverageValue{TS: until.ts, Idle: until.idle}, Upto: upto,
				})
			}
		}
	}
	for _, ps := range s.parts {
		ps.cov.forget(first)
	}
}

// takeReports moves every partition's reports into cyc, with the flows
// they are of. Must hold s.mu.
func (s *session) takeReports(cyc *cycle) {
	for _, ps := range s.parts {
		if len(ps.cov.reports) == 0 {
			continue
		}
		cyc.coverage = append(cyc.coverage, ps.cov.reports...)
		cyc.covLeases = append(cyc.covLeases, ps.lease)
		ps.cov.reports = nil
	}
	for _, r := range cyc.coverage {
		if cyc.covFlows == nil {
			cyc.covFlows = map[meta.FlowID]*meta.Flow{}
		}
		cyc.covFlows[r.FlowID] = s.covFlows[r.FlowID]
	}
}
