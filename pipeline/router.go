package pipeline

import (
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
