package pipeline

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// fatal owns the fatal-flow state (docs/OPERATING.md, "Recover a fatal flow"): how
// many flush cycles of each flow failed in a row, which flows are fatal,
// their status in flow:state and the flow_fatal gauge. Every change goes
// through its methods under one lock; Redis is written outside it.
//
// A flow becomes fatal after --fatal-after failed cycles in a row, unless
// it was dropped: a dropped flow cannot be resumed, and its cycle (which
// still owes the data routed before the drop) keeps retrying without
// stopping the others. The consume loop stops fetching while any flow is
// fatal. A flow stops being fatal when a cycle of it commits, when a resume
// DDL is applied (by any replica: reconcile), when it is dropped, and at the
// start of a session (its failed cycles belonged to the session before).
type fatal struct {
	store *meta.Store
	reg   *meta.Registry
	m     *metrics
	log   *slog.Logger
	after int

	mu       sync.Mutex
	failures map[meta.FlowID]int  // failed cycles in a row
	flows    map[meta.FlowID]bool // fatal now
}

func newFatal(store *meta.Store, reg *meta.Registry, m *metrics, log *slog.Logger, after int) *fatal {
	return &fatal{store: store, reg: reg, m: m, log: log, after: after,
		failures: map[meta.FlowID]int{}, flows: map[meta.FlowID]bool{}}
}

// any reports whether a flow is fatal: fetching stops.
func (x *fatal) any() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.flows) > 0
}

// ids returns the fatal flows.
func (x *fatal) ids() map[meta.FlowID]bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[meta.FlowID]bool, len(x.flows))
	for id := range x.flows {
		out[id] = true
	}
	return out
}

// reset forgets every count and fatal flag: a new session starts.
func (x *fatal) reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	clear(x.failures)
	clear(x.flows)
}

// failed counts one failed cycle for each flow of flows and makes those at
// the limit fatal: flow:state in Redis first (every replica sees it, and a
// resume or drop clears it), then the flag and the gauge.
func (x *fatal) failed(ctx context.Context, flows []*meta.Flow, err error) {
	for _, fl := range flows {
		label := flowLabel(fl.Info.CatalogName, fl.Info.FlowName)
		x.m.flushFailures.WithLabelValues(label).Inc()
		x.mu.Lock()
		x.failures[fl.ID]++
		n, already := x.failures[fl.ID], x.flows[fl.ID]
		x.mu.Unlock()
		if n < x.after || already {
			continue
		}
		if _, ok := x.reg.Flow(fl.ID); !ok {
			x.log.Warn("flush of a dropped flow keeps failing; retrying", "flow", label, "flow_id", fl.ID, "failed_cycles", n, "err", err)
			continue
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if serr := x.store.SetFlowFatal(sctx, fl.ID, err.Error()); serr != nil {
			x.log.Warn("recording the fatal state in Redis failed", "flow", label, "err", serr)
		}
		cancel()
		x.mu.Lock()
		x.flows[fl.ID] = true
		x.mu.Unlock()
		x.m.flowFatal.WithLabelValues(label).Set(1)
		x.log.Error("flow is fatal: fetching stopped until a retry succeeds or the flow is resumed",
			"flow", label, "failed_cycles", n, "err", err)
	}
}

// committed clears the counts and the fatal state of flows after a cycle
// of theirs committed. A flow another replica (or an earlier session) made
// fatal is active again in Redis too.
func (x *fatal) committed(flows []*meta.Flow) {
	for _, fl := range flows {
		x.mu.Lock()
		delete(x.failures, fl.ID)
		was := x.flows[fl.ID]
		delete(x.flows, fl.ID)
		x.mu.Unlock()
		if cur, ok := x.reg.Flow(fl.ID); ok && cur.Status == meta.StatusFatal {
			was = true
		}
		if !was {
			continue
		}
		label := flowLabel(fl.Info.CatalogName, fl.Info.FlowName)
		x.m.flowFatal.WithLabelValues(label).Set(0)
		x.log.Info("flow recovered: a flush cycle succeeded", "flow", label)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := x.store.SetFlowActive(ctx, fl.ID); err != nil {
			x.log.Warn("recording the active state in Redis failed", "flow", label, "err", err)
		}
		cancel()
	}
}

// resumed clears flow id's state after a resume DDL this replica applied.
func (x *fatal) resumed(id meta.FlowID) {
	x.mu.Lock()
	delete(x.failures, id)
	was := x.flows[id]
	delete(x.flows, id)
	x.mu.Unlock()
	if fl, ok := x.reg.Flow(id); ok && was {
		label := flowLabel(fl.Info.CatalogName, fl.Info.FlowName)
		x.m.flowFatal.WithLabelValues(label).Set(0)
		x.log.Info("flow resumed by DDL; retrying its flush", "flow", label)
	}
}

// reconcile clears the fatal flag of every flow the registry no longer
// holds fatal (a resume applied by any replica, or a drop) and reports
// whether it cleared one.
func (x *fatal) reconcile() bool {
	x.mu.Lock()
	var cleared []meta.FlowID
	for id := range x.flows {
		if f, ok := x.reg.Flow(id); ok && f.Status == meta.StatusFatal {
			continue
		}
		delete(x.flows, id)
		delete(x.failures, id)
		cleared = append(cleared, id)
	}
	x.mu.Unlock()
	for _, id := range cleared {
		if f, ok := x.reg.Flow(id); ok {
			label := flowLabel(f.Info.CatalogName, f.Info.FlowName)
			x.m.flowFatal.WithLabelValues(label).Set(0)
			x.log.Info("flow no longer fatal in Redis (resumed); fetching again", "flow", label, "flow_id", id)
		} else {
			x.log.Info("fatal flow dropped; fetching again", "flow_id", id)
		}
	}
	return len(cleared) > 0
}
