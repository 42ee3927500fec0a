package pipeline

import (
	"context"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// Coverage reports (DESIGN 7; the protocol is described in meta/coverage.go).
//
// A partition's value for a pending entry is the one at its routing
// boundary: the moment the consume loop first routed with the table added
// (or without it). The loop captures those values when it sees the change
// (observeFlows, before it routes another record) and reports them once
// Redis shows the entry and the registry routes the flow as Redis holds it,
// which may be later. A partition assigned after the change routed the new
// definition from its start offset, so its values are those of the
// committed position there.

// covTable keys a captured boundary value.
type covTable struct {
	flow  meta.FlowID
	table uint32
	kind  string
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
	captured map[covTable]covValue
	reported map[covEntry]bool
	reports  []meta.CoverageReport // valued, for the next freeze
}

func newPartCoverage(start meta.PartitionStart) partCoverage {
	return partCoverage{start: start, captured: map[covTable]covValue{}, reported: map[covEntry]bool{}}
}

// captureBoundaries records, for every owned partition, the boundary
// values of the tables each flow gained or lost between two views. Must
// hold s.mu; the caller freezes right after when tables were lost.
func (s *session) captureBoundaries(old, now map[meta.FlowID]string, flows []*meta.Flow) {
	if old == nil {
		return // the session's first view: partitions start on it
	}
	tables := func(id meta.FlowID, in map[meta.FlowID]string) map[uint32]bool {
		out := map[uint32]bool{}
		if _, ok := in[id]; !ok {
			return out
		}
		for _, f := range flows {
			if f.ID == id {
				for _, t := range f.Info.SourceTableIDs {
					out[t] = true
				}
			}
		}
		return out
	}
	type change struct {
		key covTable
	}
	var changes []change
	for id, sig := range now {
		if was, ok := old[id]; ok && was == sig {
			continue
		}
		before := parseTableSet(old[id])
		for t := range tables(id, now) {
			if !before[t] {
				changes = append(changes, change{covTable{id, t, meta.CoverageSince}})
			}
		}
		for t := range before {
			if !tables(id, now)[t] {
				changes = append(changes, change{covTable{id, t, meta.CoverageUntil}})
			}
		}
	}
	for id, sig := range old {
		if _, ok := now[id]; ok {
			continue
		}
		for t := range parseTableSet(sig) {
			changes = append(changes, change{covTable{id, t, meta.CoverageUntil}})
		}
	}
	if len(changes) == 0 {
		return
	}
	tnow := time.Now()
	for _, ps := range s.parts {
		for _, ch := range changes {
			ps.cov.captured[ch.key] = s.boundaryValue(ps, ch.key.kind, tnow)
		}
	}
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
				v, ok := ps.cov.captured[covTable{pf.ID, e.Table, e.Kind}]
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
