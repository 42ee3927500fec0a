package pipeline

import (
	"slices"
	"strconv"
	"strings"

	"github.com/flowlog/flowlog/meta"
)

// flowView is what the consume loop last saw of the flows, to tell what a
// registry refresh changed whoever applied the DDL: this replica or another.
type flowView struct {
	version uint64
	tables  map[meta.FlowID]string // flow id -> its sorted source tables
	seqs    map[meta.FlowID]uint64 // flow id -> its coverage seq (meta.Flow.CoverageSeq)
	labels  map[string]bool        // flow labels with metric series
}

// observeFlows reacts to the flow changes the registry loaded since the last
// call. It reports whether a flow was dropped or its tables changed: what
// was routed under the old definitions must then leave in a cycle of its
// own (the caller freezes). On the way it gives every flow its flow_fatal
// and flush_failures_total series at 0, removes the series of flows whose
// name is gone, and clears the fatal flag of flows that Redis no longer
// holds fatal (resumed or dropped, by any replica). Called by the consume
// loop only.
func (s *session) observeFlows() (changed bool) {
	c := s.c
	v := c.d.Registry.Version()
	if s.flows.tables != nil && v == s.flows.version {
		return false
	}
	flows := c.d.Registry.Flows()
	tables := make(map[meta.FlowID]string, len(flows))
	seqs := make(map[meta.FlowID]uint64, len(flows))
	labels := make(map[string]bool, len(flows))
	for _, f := range flows {
		tables[f.ID] = tableSet(f.Info.SourceTableIDs)
		seqs[f.ID] = f.CoverageSeq
		l := flowLabel(f.Info.CatalogName, f.Info.FlowName)
		labels[l] = true
		c.m.flowFatal.WithLabelValues(l)
		c.m.flushFailures.WithLabelValues(l)
	}
	if s.flows.tables != nil {
		for id, was := range s.flows.tables {
			if now, ok := tables[id]; !ok || now != was {
				changed = true
			}
		}
	}
	for l := range c.flowLabels {
		if !labels[l] {
			c.m.deleteFlow(l)
		}
	}
	c.flowLabels = labels
	view := flowView{version: v, tables: tables, seqs: seqs, labels: labels}
	s.captureBoundaries(s.flows, view)
	s.flows = view
	s.covDirty = true
	if c.fatal.reconcile() {
		s.fl.kick()
	}
	return changed
}

func tableSet(ids []uint32) string {
	sorted := slices.Sorted(slices.Values(ids))
	parts := make([]string, len(sorted))
	for i, t := range sorted {
		parts[i] = strconv.FormatUint(uint64(t), 10)
	}
	return strings.Join(parts, ",")
}
