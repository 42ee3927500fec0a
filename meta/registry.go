package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Flow is one flow as the router sees it: its id, definition and runtime
// status (StatusActive or StatusFatal; "" if it has no state yet). A Flow
// belongs to an immutable registry snapshot and must not be modified.
type Flow struct {
	ID     FlowID
	Info   FlowInfo
	Status string
	// CoverageSeq is coverage:<id>:seq as of Info: the last pending
	// coverage entry the DDL that wrote Info appended (0: none). Info and
	// CoverageSeq are read in one MULTI, and a DDL writes both in one, so a
	// router that routes Info stands past exactly the entries up to it.
	CoverageSeq uint64
}

// registrySnapshot is one immutable view of the flows.
type registrySnapshot struct {
	flows   []*Flow // sorted by id
	byID    map[FlowID]*Flow
	byTable map[uint32][]*Flow // each sorted by id
	// sets are the flow sets of byTable and all, the set of every flow;
	// setsByKey those of this snapshot, for the next refresh to keep.
	sets      map[uint32]*FlowSet
	all       *FlowSet
	setsByKey map[string]*FlowSet
}

// Registry is the in-memory table -> flows map the router reads on its hot
// path. Readers load an immutable snapshot through an atomic pointer and
// never lock; Refresh builds a new snapshot from Redis and swaps it in.
type Registry struct {
	s       *Store
	mu      sync.Mutex // serializes Refresh
	snap    atomic.Pointer[registrySnapshot]
	version atomic.Uint64
}

// NewRegistry returns an empty registry over s; call Refresh to load it.
func NewRegistry(s *Store) *Registry {
	r := &Registry{s: s}
	r.snap.Store(&registrySnapshot{byID: map[FlowID]*Flow{}, byTable: map[uint32][]*Flow{}, sets: map[uint32]*FlowSet{}})
	return r
}

// Refresh reloads every flow from Redis (the flows set, then each flow's
// info, status and coverage seq in one MULTI) and swaps in the new snapshot. A flow
// listed in the set whose info is gone (dropped meanwhile) is left out. On
// error the previous snapshot stays.
//
// The infos and coverage seqs are read with MGET, refreshMGet keys a
// command, and the statuses with an HGET each: every replica refreshes
// after every DDL, so a refresh is N x F reads per DDL for N replicas and
// F flows, and one command per flow instead of three is most of its Redis
// work (docs/SIZING.md, "Replicas and Redis").
func (r *Registry) Refresh(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids, err := r.s.AllFlows(ctx)
	if err != nil {
		return fmt.Errorf("refresh registry: %w", err)
	}
	k := r.s.keys
	var infoCmds, seqCmds []*redis.SliceCmd
	states := make([]*redis.StringCmd, len(ids))
	if len(ids) > 0 {
		_, err = r.s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for lo := 0; lo < len(ids); lo += refreshMGet {
				chunk := ids[lo:min(lo+refreshMGet, len(ids))]
				infoKeys, seqKeys := make([]string, len(chunk)), make([]string, len(chunk))
				for i, id := range chunk {
					infoKeys[i], seqKeys[i] = k.FlowInfo(id), k.CoverageSeq(id)
				}
				infoCmds = append(infoCmds, p.MGet(ctx, infoKeys...))
				seqCmds = append(seqCmds, p.MGet(ctx, seqKeys...))
			}
			for i, id := range ids {
				states[i] = p.HGet(ctx, k.FlowState(id), "status")
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("refresh registry: read flows: %w", err)
		}
	}
	infos, err := mgetValues(infoCmds)
	if err != nil {
		return fmt.Errorf("refresh registry: get infos: %w", err)
	}
	seqs, err := mgetValues(seqCmds)
	if err != nil {
		return fmt.Errorf("refresh registry: get coverage seqs: %w", err)
	}
	snap := &registrySnapshot{
		flows:   make([]*Flow, 0, len(ids)),
		byID:    make(map[FlowID]*Flow, len(ids)),
		byTable: map[uint32][]*Flow{},
	}
	for i, id := range ids {
		v, ok := infos[i].(string)
		if !ok {
			continue
		}
		info, err := decodeInfo(k.FlowInfo(id), v)
		if err != nil {
			return fmt.Errorf("refresh registry: %w", err)
		}
		status, err := states[i].Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("refresh registry: status of flow %d: %w", id, err)
		}
		f := &Flow{ID: id, Info: info, Status: status}
		if v, ok := seqs[i].(string); ok {
			if f.CoverageSeq, err = strconv.ParseUint(v, 10, 64); err != nil {
				return fmt.Errorf("refresh registry: parse %s = %q: %w", k.CoverageSeq(id), v, err)
			}
		}
		snap.flows = append(snap.flows, f)
		snap.byID[id] = f
		for _, t := range slices.Compact(slices.Sorted(slices.Values(info.SourceTableIDs))) {
			snap.byTable[t] = append(snap.byTable[t], f)
		}
	}
	in := newInterner(r.snap.Load().setsByKey)
	snap.sets = make(map[uint32]*FlowSet, len(snap.byTable))
	for t, flows := range snap.byTable {
		snap.sets[t] = in.set(flows)
	}
	if len(snap.flows) > 0 {
		snap.all = in.set(snap.flows)
	}
	snap.setsByKey = in.next
	r.snap.Store(snap)
	r.version.Add(1)
	return nil
}

// refreshMGet bounds the keys of one MGET of a refresh, so that no reply
// of a registry of many flows is one huge array.
const refreshMGet = 1000

// mgetValues are the values of MGETs in order: a string, or nil for a
// missing key.
func mgetValues(cmds []*redis.SliceCmd) ([]any, error) {
	var out []any
	for _, c := range cmds {
		vals, err := c.Result()
		if err != nil {
			return nil, err
		}
		out = append(out, vals...)
	}
	return out, nil
}

// Version counts successful refreshes: a reader that saw version v has seen
// every change loaded since it differs.
func (r *Registry) Version() uint64 { return r.version.Load() }

// ForTable returns the flows whose source tables include table, sorted by
// id, whatever their status; nil if there are none or table is not a valid
// uint32 table id. The slice is shared: do not modify it.
func (r *Registry) ForTable(table int64) []*Flow {
	if table < 0 || table > int64(^uint32(0)) {
		return nil
	}
	return r.snap.Load().byTable[uint32(table)]
}

// SetForTable returns the set of flows ForTable returns, nil if there are
// none. The set is shared: do not modify it.
func (r *Registry) SetForTable(table int64) *FlowSet {
	if table < 0 || table > int64(^uint32(0)) {
		return nil
	}
	return r.snap.Load().sets[uint32(table)]
}

// AllSet returns the set of every flow, nil if there are none.
func (r *Registry) AllSet() *FlowSet { return r.snap.Load().all }

// Flows returns every flow, sorted by id. The slice is shared: do not
// modify it.
func (r *Registry) Flows() []*Flow { return r.snap.Load().flows }

// Flow returns flow id, and false if the registry does not know it.
func (r *Registry) Flow(id FlowID) (*Flow, bool) {
	f, ok := r.snap.Load().byID[id]
	return f, ok
}
