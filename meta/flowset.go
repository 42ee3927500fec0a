package meta

import (
	"strconv"
	"strings"
)

// FlowSet is the set of flows the registry routes a table's events to (or,
// for meta keys, every flow). Layout v2 stores an event once for its set:
// its chunk carries the ids of the set. A set has one *FlowSet while the
// registry keeps routing to it, across refreshes that do not change it, so
// the pointer identifies it: a temp file keyed by it goes on receiving the
// set's events when an unrelated flow changes.
type FlowSet struct {
	// IDs are the flows' ids, ascending.
	IDs []FlowID
	// Flows are the flows, by id, as of the refresh that built the set.
	// Their ids, catalogs and names are those of the set (a set whose
	// names change is a new set); the rest of a Flow may have changed
	// since: read it from the registry.
	Flows []*Flow
}

// setKey is the identity of a set of flows: ids and names.
func setKey(flows []*Flow) string {
	var b strings.Builder
	for _, f := range flows {
		b.WriteString(strconv.FormatUint(uint64(f.ID), 10))
		b.WriteByte('/')
		b.WriteString(f.Info.CatalogName)
		b.WriteByte('/')
		b.WriteString(f.Info.FlowName)
		b.WriteByte(',')
	}
	return b.String()
}

// interner hands out one *FlowSet per set of flows, keeping those of the
// previous refresh that are still in use.
type interner struct {
	prev, next map[string]*FlowSet
}

func newInterner(prev map[string]*FlowSet) *interner {
	return &interner{prev: prev, next: map[string]*FlowSet{}}
}

// set returns the *FlowSet of flows (sorted by id, not empty).
func (in *interner) set(flows []*Flow) *FlowSet {
	key := setKey(flows)
	if s := in.next[key]; s != nil {
		return s
	}
	s := in.prev[key]
	if s == nil {
		s = &FlowSet{IDs: make([]FlowID, len(flows)), Flows: flows}
		for i, f := range flows {
			s.IDs[i] = f.ID
		}
	}
	in.next[key] = s
	return s
}
