package pipeline

import (
	"bytes"
	"sort"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// Skip reasons of events_total{result="skipped"}.
const (
	reasonLockCF = "lock_cf"
	reasonNoTbl  = "no_table"
	reasonNoFlow = "no_flow"
	// reasonBadKey is not a skip: the router's caller sends the record to
	// the DLQ.
	reasonBadKey = event.ReasonBadKey
	// reasonTSFuture is a DLQ reason: a resolved or event ts further
	// ahead of the consumer's clock than --max-clock-skew.
	reasonTSFuture = "ts_future"
)

// Router maps an event's key to the flows that cover it, from the flow
// registry (table id -> flows). A flow covers the key ranges of its source
// tables: for table t, the encoded keys from EncodeBytes(TablePrefix(t))
// (inclusive) to EncodeBytes(TablePrefix(t+1)) (exclusive). Meta keys go to
// every flow. The registry is swapped atomically on DDL, so Router needs no
// lock and allocates nothing per event.
type Router struct {
	reg *meta.Registry
}

// NewRouter returns a router reading reg.
func NewRouter(reg *meta.Registry) *Router { return &Router{reg: reg} }

// Route returns the flows an encoded key (without ts) goes to, whether it is
// a meta key, and, when it goes nowhere, the skip reason.
func (r *Router) Route(encoded []byte) (flows []*meta.Flow, table int64, isMeta bool, reason string) {
	kind, table := event.Classify(encoded)
	switch kind {
	case event.KindTable:
		flows = r.reg.ForTable(table)
		if len(flows) == 0 {
			return nil, table, false, reasonNoFlow
		}
		return flows, table, false, ""
	case event.KindMeta:
		flows = r.reg.Flows()
		if len(flows) == 0 {
			return nil, 0, true, reasonNoFlow
		}
		return flows, 0, true, ""
	case event.KindBadTable:
		return nil, 0, false, reasonBadKey
	default:
		return nil, 0, false, reasonNoTbl
	}
}

// RouteSet is Route returning the flows as their set (meta.FlowSet), as
// layout v2 stores an event: once, for every flow that routed it.
func (r *Router) RouteSet(encoded []byte) (set *meta.FlowSet, table int64, isMeta bool, reason string) {
	kind, table := event.Classify(encoded)
	switch kind {
	case event.KindTable:
		if set = r.reg.SetForTable(table); set == nil {
			return nil, table, false, reasonNoFlow
		}
		return set, table, false, ""
	case event.KindMeta:
		if set = r.reg.AllSet(); set == nil {
			return nil, 0, true, reasonNoFlow
		}
		return set, 0, true, ""
	case event.KindBadTable:
		return nil, 0, false, reasonBadKey
	default:
		return nil, 0, false, reasonNoTbl
	}
}

// Selector picks flows the way TiKV's log-backup router selects tasks: by
// name, by a key, by a key range, or all.
type Selector struct {
	Catalog, Name string // by name (Catalog "" means "default")
	Key           []byte // by encoded key
	Start, End    []byte // by encoded range [Start, End); End nil = unbounded
	All           bool
}

// Select returns the flows sel matches, sorted by id.
func (r *Router) Select(sel Selector) []*meta.Flow {
	var out []*meta.Flow
	for _, f := range r.reg.Flows() {
		switch {
		case sel.All:
		case sel.Name != "":
			cat := sel.Catalog
			if cat == "" {
				cat = "default"
			}
			if f.Info.CatalogName != cat || f.Info.FlowName != sel.Name {
				continue
			}
		case sel.Key != nil:
			if !coversKey(f, sel.Key) {
				continue
			}
		case sel.Start != nil:
			if !overlaps(f, sel.Start, sel.End) {
				continue
			}
		default:
			continue
		}
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// FlowRanges returns the encoded key ranges a flow covers, sorted by start.
func FlowRanges(f *meta.Flow) [][2][]byte {
	ids := append([]uint32(nil), f.Info.SourceTableIDs...)
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make([][2][]byte, 0, len(ids))
	for _, id := range ids {
		out = append(out, [2][]byte{
			event.EncodeBytes(nil, event.TablePrefix(int64(id))),
			event.EncodeBytes(nil, event.TablePrefix(int64(id)+1)),
		})
	}
	return out
}

func coversKey(f *meta.Flow, key []byte) bool {
	for _, r := range FlowRanges(f) {
		if bytes.Compare(key, r[0]) >= 0 && bytes.Compare(key, r[1]) < 0 {
			return true
		}
	}
	return false
}

func overlaps(f *meta.Flow, start, end []byte) bool {
	for _, r := range FlowRanges(f) {
		if (end == nil || bytes.Compare(r[0], end) < 0) && bytes.Compare(start, r[1]) < 0 {
			return true
		}
	}
	return false
}
