package meta

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Coverage windows (docs/FORMAT.md, "Coverage rule"; the keys are in "Redis
// keys"). A change stream only holds what happened
// after a flow started to receive it, so every table of a flow has a window
// (since, until] of commit ts inside which the backup is complete.
//
// How a window is established, and why its bounds hold:
//
//   - The DDL transaction that adds or removes tables of a flow (create,
//     replace, drop) appends one pending step to coverage:<id>:pending in
//     the same MULTI, numbered by coverage:<id>:seq (one number per DDL,
//     whatever the number of tables), and writes the step's tables, sorted
//     and packed, to coverage:<id>:step:<seq>:add and :del
//     (coverage_steps.go). Its cost is that of the tables it changes.
//   - Every owner of an apply partition, once its registry shows the flow as
//     Redis holds it now (so its routing follows every pending DDL), reports
//     for each pending step the partition's values at the routing boundary:
//     for an added table, the highest commit ts the partition had seen
//     before it started to route it (since); for a removed one, the
//     partition's checkpoint in the cycle frozen where it stopped (until);
//     and the last step its routing moved to at that boundary (upto): a
//     partition whose registry went from before step s to after step e in
//     one refresh never routed anything in between, and reports each of the
//     steps s..e with the same values and upto e. The report rides in the
//     commit of the cycle holding the records before the boundary, fenced
//     by the partition's lease, and is kept first-wins (HSETNX in
//     coverage:<id>:parts): a later owner starts at the committed offset,
//     which is where the committed report's boundary lies.
//   - Pending steps become final in order, a cell at a time: the longest
//     run of steps from the first pending one that every apply partition
//     with records has reported with the same values, and moved across at
//     once (upto at least the cell's last step). No partition routed the
//     flow's definitions inside a cell, so the cell counts as one change,
//     from the tables before it to the tables after it: a table in both
//     keeps its window, however often the cell's steps removed and added it
//     again (a replace storm of 50 alternating 100,000-table sets observed
//     in one refresh changes nothing); a table only after it gets since =
//     the max of the reports; a table only before it gets until = the min
//     (partitions whose regions all dropped out report "idle" and are left
//     out). A cell's tables are written in chunks (coverage_finalize.go),
//     so the work and memory follow the tables it changes. A window
//     replaced by a new one for the same table moves to the history.
//
// Every event of the table with since < ts <= until is then in a committed
// chunk: each partition routed the table from its boundary on, and nothing
// it had seen before the boundary was newer than since; it routed it until
// its boundary, and everything up to its checkpoint there had arrived.

// Window is one coverage window of a table. Until is nil while the table is
// part of the flow.
type Window struct {
	TableID uint32  `json:"table_id,omitempty"`
	Since   uint64  `json:"since"`
	Until   *uint64 `json:"until"`
}

// Holds reports whether ts lies in the window: since <= ts <= until.
func (w Window) Holds(ts uint64) bool {
	return w.Since <= ts && (w.Until == nil || ts <= *w.Until)
}

// Contains reports whether an event at commit ts is inside the window's
// data: since < ts <= until.
func (w Window) Contains(ts uint64) bool {
	return w.Since < ts && (w.Until == nil || ts <= *w.Until)
}

// CoverageEntry is one pending step of a flow: the tables one DDL added
// and removed (how many of each).
type CoverageEntry struct {
	Seq     uint64 `json:"seq"`
	Added   int    `json:"add"`
	Removed int    `json:"del"`
	// Ckpt is, for a step that removes tables, the flow's checkpoint_ts
	// when the DDL was applied (0 if it had none). Until the step is
	// final, a removed table's open window is complete only up to it (see
	// Store.PendingRemoved).
	Ckpt uint64 `json:"ckpt,omitempty"`
	// legacy is a per-table entry an earlier version wrote: one table,
	// added (kind "since") or removed ("until").
	legacy *legacyEntry
}

// legacyEntry is a pending entry of the per-table format.
type legacyEntry struct {
	Kind  string `json:"kind"`
	Table uint32 `json:"table"`
}

// Legacy per-table entry kinds.
const (
	legacySince = "since"
	legacyUntil = "until"
)

// decodeEntry reads a pending step, or a per-table entry of the earlier
// format as a step of one table.
func decodeEntry(raw string) (CoverageEntry, error) {
	var v struct {
		Seq     uint64 `json:"seq"`
		Added   int    `json:"add"`
		Removed int    `json:"del"`
		Ckpt    uint64 `json:"ckpt"`
		Kind    string `json:"kind"`
		Table   uint32 `json:"table"`
	}
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return CoverageEntry{}, err
	}
	e := CoverageEntry{Seq: v.Seq, Added: v.Added, Removed: v.Removed, Ckpt: v.Ckpt}
	switch v.Kind {
	case "":
	case legacySince:
		e.Added, e.legacy = 1, &legacyEntry{Kind: v.Kind, Table: v.Table}
	case legacyUntil:
		e.Removed, e.legacy = 1, &legacyEntry{Kind: v.Kind, Table: v.Table}
	default:
		return CoverageEntry{}, fmt.Errorf("unknown entry kind %q", v.Kind)
	}
	return e, nil
}

// CoverageValue is a partition's value for one bound at its boundary: a
// ts, or Idle (no live region: left out of the cell's max or min).
type CoverageValue struct {
	TS   uint64
	Idle bool
}

// CoverageReport is one partition's values for a pending step.
type CoverageReport struct {
	FlowID    FlowID
	Seq       uint64
	Topic     string
	Partition int32
	Since     CoverageValue // for the tables the step adds
	Until     CoverageValue // for the tables it removes
	// Upto is the last step the partition's routing moved to at this
	// boundary (0: Seq alone). Steps the partition reports with the same
	// values and Upto were crossed at once.
	Upto uint64
}

// value is the report as stored: "<since>:<until>:<upto>", each bound a
// decimal ts or "idle".
func (r CoverageReport) value() string {
	v := func(c CoverageValue) string {
		if c.Idle {
			return CkptIdle
		}
		return u64(c.TS)
	}
	upto := max(r.Upto, r.Seq)
	return v(r.Since) + ":" + v(r.Until) + ":" + u64(upto)
}

// partReport is a stored report as the finalizer reads it.
type partReport struct {
	since, until CoverageValue
	upto         uint64
	raw          string // the bounds, for comparing reports of two steps
}

// parseReport reads a stored report of step seq; a bare ts or "idle" is a
// report of the per-table format (one bound, one step).
func parseReport(seq uint64, v string) (partReport, error) {
	val := func(s string) (CoverageValue, error) {
		if s == CkptIdle {
			return CoverageValue{Idle: true}, nil
		}
		ts, err := strconv.ParseUint(s, 10, 64)
		return CoverageValue{TS: ts}, err
	}
	parts := strings.Split(v, ":")
	if len(parts) == 1 {
		c, err := val(v)
		return partReport{since: c, until: c, upto: seq, raw: v}, err
	}
	if len(parts) != 3 {
		return partReport{}, fmt.Errorf("report %q: want since:until:upto", v)
	}
	since, err := val(parts[0])
	if err != nil {
		return partReport{}, fmt.Errorf("report %q: %w", v, err)
	}
	until, err := val(parts[1])
	if err != nil {
		return partReport{}, fmt.Errorf("report %q: %w", v, err)
	}
	upto, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return partReport{}, fmt.Errorf("report %q: %w", v, err)
	}
	return partReport{since: since, until: until, upto: max(upto, seq), raw: parts[0] + ":" + parts[1]}, nil
}

// PendingFlow is a flow with pending coverage steps (the first
// maxPendingRead of them), whether Redis still holds the flow (Exists
// false: dropped) and its coverage seq now, which a registry that routes
// the flow as Redis holds it shows too. Info is a dropped flow's last
// definition, if its drop recorded one (catalog:rev:<id> info), so that a
// meta can name the flow its reports are of.
type PendingFlow struct {
	ID      FlowID
	Exists  bool
	Seq     uint64
	Info    FlowInfo
	Entries []CoverageEntry
}

// maxPendingRead bounds the pending steps read of one flow at once; the
// rest are read once the first are final.
const maxPendingRead = 1024

func (k Keys) coverageSub(id uint32, sub string) string { return k.Coverage(id) + ":" + sub }

// CoveragePending is the list of a flow's pending coverage steps.
func (k Keys) CoveragePending(id uint32) string { return k.coverageSub(id, "pending") }

// CoverageParts is the hash of partition reports:
// "<seq>/<topic>/<p>" -> "<since>:<until>:<upto>".
func (k Keys) CoverageParts(id uint32) string { return k.coverageSub(id, "parts") }

// CoverageSeq numbers a flow's pending steps.
func (k Keys) CoverageSeq(id uint32) string { return k.coverageSub(id, "seq") }

// CoverageHistory is the list of a flow's earlier windows (JSON with
// table_id) as versions before coverage:<id>:past wrote them; it is read,
// never written.
func (k Keys) CoverageHistory(id uint32) string { return k.coverageSub(id, "history") }

// CoveragePast is the hash of a flow's earlier windows: "<table>" -> JSON
// array of windows, oldest first, only those a restore can still choose
// (coverage_history.go).
func (k Keys) CoveragePast(id uint32) string { return k.coverageSub(id, "past") }

// CoverageFin is the cell being made final, "<first>:<last>:<table>":
// steps first..last, tables up to table written (coverage_finalize.go).
func (k Keys) CoverageFin(id uint32) string { return k.coverageSub(id, "fin") }

// CoverageStep is the packed, sorted tables step seq adds (kind "add") or
// removes ("del").
func (k Keys) CoverageStep(id uint32, seq uint64, kind string) string {
	return k.coverageSub(id, "step:"+u64(seq)+":"+kind)
}

// CoverageFlows is the set of flow ids with pending coverage steps.
func (k Keys) CoverageFlows() string { return k.base + "coverage:flows" }

// MaxTS is maxts:<topic>:<partition>, the highest commit ts the partition's
// committed records held: a new owner's "seen before" for an added table.
func (k Keys) MaxTS(topic string, partition int32) string {
	return k.base + "maxts:" + topic + ":" + strconv.Itoa(int(partition))
}

func partField(seq uint64, topic string, p int32) string {
	return strconv.FormatUint(seq, 10) + "/" + topic + "/" + strconv.Itoa(int(p))
}

// coverageTx WATCHes and reads the flow's step counter and returns the
// writes that append one step with the added and removed tables (each
// sorted, without duplicates).
func (s *Store) coverageTx(ctx context.Context, tx *redis.Tx, id FlowID, added, removed []uint32) (func(redis.Pipeliner), error) {
	if len(added) == 0 && len(removed) == 0 {
		return func(redis.Pipeliner) {}, nil
	}
	k := s.keys
	seqKey := k.CoverageSeq(id)
	if err := tx.Watch(ctx, seqKey).Err(); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	str, _, err := getString(ctx, tx, seqKey)
	if err != nil {
		return nil, err
	}
	var seq uint64
	if str != "" {
		if seq, err = strconv.ParseUint(str, 10, 64); err != nil {
			return nil, fmt.Errorf("parse %s = %q: %w", seqKey, str, err)
		}
	}
	// The checkpoint only grows: one read before the MULTI may be a little
	// old, which makes the bound PendingRemoved gives lower, never wrong.
	// Tables are removed only from a live flow (a replace, a drop of a
	// flow with a definition), so it is the effective checkpoint
	// (checkpoint.go).
	var ckpt uint64
	if len(removed) > 0 {
		if ckpt, err = s.readCheckpoint(ctx, tx, id); err != nil {
			return nil, err
		}
	}
	seq++
	entry, _ := json.Marshal(CoverageEntry{Seq: seq, Added: len(added), Removed: len(removed), Ckpt: ckpt})
	return func(p redis.Pipeliner) {
		if len(added) > 0 {
			p.Set(ctx, k.CoverageStep(id, seq, stepAdd), packTables(added), 0)
		}
		if len(removed) > 0 {
			p.Set(ctx, k.CoverageStep(id, seq, stepDel), packTables(removed), 0)
		}
		p.RPush(ctx, k.CoveragePending(id), string(entry))
		p.Set(ctx, seqKey, strconv.FormatUint(seq, 10), 0)
		p.SAdd(ctx, k.CoverageFlows(), u32(id))
	}, nil
}

// tableDiff returns the tables of next missing from cur (added) and those of
// cur missing from next (removed), each sorted and without duplicates.
func tableDiff(cur, next []uint32) (added, removed []uint32) {
	c := slices.Compact(slices.Sorted(slices.Values(cur)))
	n := slices.Compact(slices.Sorted(slices.Values(next)))
	i, j := 0, 0
	for i < len(c) || j < len(n) {
		switch {
		case j == len(n) || i < len(c) && c[i] < n[j]:
			removed = append(removed, c[i])
			i++
		case i == len(c) || n[j] < c[i]:
			added = append(added, n[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

// PendingCoverage returns every flow with pending coverage steps (at most
// maxPendingRead of each, the first ones), whether Redis still holds it
// and its coverage seq: what the consume loop reports on, at a cost of the
// steps, not of their tables.
func (s *Store) PendingCoverage(ctx context.Context) ([]PendingFlow, error) {
	k := s.keys
	ids, err := s.rdb.SMembers(ctx, k.CoverageFlows()).Result()
	if err != nil {
		return nil, fmt.Errorf("smembers %s: %w", k.CoverageFlows(), err)
	}
	var out []PendingFlow
	for _, v := range ids {
		id64, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			continue
		}
		id := FlowID(id64)
		var lr *redis.StringSliceCmd
		var ex *redis.IntCmd
		var sq *redis.StringCmd
		_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			lr = p.LRange(ctx, k.CoveragePending(id), 0, maxPendingRead-1)
			ex = p.Exists(ctx, k.FlowInfo(id))
			sq = p.Get(ctx, k.CoverageSeq(id))
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read pending coverage of flow %d: %w", id, err)
		}
		pf := PendingFlow{ID: id, Exists: ex.Val() > 0}
		if v, err := sq.Result(); err == nil {
			if pf.Seq, err = strconv.ParseUint(v, 10, 64); err != nil {
				return nil, fmt.Errorf("parse %s = %q: %w", k.CoverageSeq(id), v, err)
			}
		}
		for _, raw := range lr.Val() {
			e, err := decodeEntry(raw)
			if err != nil {
				return nil, fmt.Errorf("decode pending coverage of flow %d: %w", id, err)
			}
			pf.Entries = append(pf.Entries, e)
		}
		if len(pf.Entries) > 0 && !pf.Exists {
			// Only a dropped flow's last definition is read: a live one's
			// is the registry's.
			raw, err := s.rdb.HGet(ctx, k.CatalogRev(id), "info").Result()
			switch {
			case err == nil:
				if pf.Info, err = decodeInfo(k.CatalogRev(id), raw); err != nil {
					return nil, err
				}
			case !errors.Is(err, redis.Nil):
				return nil, fmt.Errorf("read last definition of flow %d: %w", id, err)
			}
		}
		if len(pf.Entries) > 0 {
			out = append(out, pf)
		}
	}
	slices.SortFunc(out, func(a, b PendingFlow) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// PendingAdded returns the tables that pending steps of flow id add: the
// tables whose window is not established yet. It reads the steps' tables
// in chunks; the result holds each table once.
func (s *Store) PendingAdded(ctx context.Context, id FlowID) (map[uint32]bool, error) {
	out := map[uint32]bool{}
	err := s.eachPendingTable(ctx, id, stepAdd, func(_ CoverageEntry, t uint32) { out[t] = true })
	return out, err
}

// eachPendingTable calls fn with each table of kind (stepAdd or stepDel)
// of every pending step of flow id, reading the tables in chunks.
func (s *Store) eachPendingTable(ctx context.Context, id FlowID, kind string, fn func(e CoverageEntry, table uint32)) error {
	raws, err := s.rdb.LRange(ctx, s.keys.CoveragePending(id), 0, -1).Result()
	if err != nil {
		return fmt.Errorf("lrange %s: %w", s.keys.CoveragePending(id), err)
	}
	for _, raw := range raws {
		e, err := decodeEntry(raw)
		if err != nil {
			return fmt.Errorf("decode pending coverage of flow %d: %w", id, err)
		}
		st := s.stepStream(id, e, kind)
		for {
			t, ok, err := st.next(ctx)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			fn(e, t)
		}
	}
	return nil
}

// PendingRemoved returns, for each table that a pending step of flow id
// removes, the smallest Ckpt of those steps: how far the table's current
// window is known to be complete while the removal is pending. It reads the
// steps' removed tables in chunks.
//
// Why: once the DDL that removes a table is applied, each apply partition
// stops routing the table at its own boundary and reports it; until every
// partition has, the window has no until, yet the partitions that stopped
// no longer back up the table's events past their boundary while the
// checkpoint moves on. The events up to the flow's checkpoint at the DDL
// are in committed chunks, though: that checkpoint was reached before the
// DDL, so every partition had committed them while still routing the
// table. So a restore past it leaves the table out until the step is final
// (then until, the min of the reports, says exactly how far). A legacy
// entry carries no checkpoint: its table is complete up to 0.
func (s *Store) PendingRemoved(ctx context.Context, id FlowID) (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	err := s.eachPendingTable(ctx, id, stepDel, func(e CoverageEntry, t uint32) {
		if c, seen := out[t]; !seen || e.Ckpt < c {
			out[t] = e.Ckpt
		}
	})
	return out, err
}

// PendingSteps returns flow id's pending steps with their tables, what a
// catalog of the flow records of them.
func (s *Store) PendingSteps(ctx context.Context, id FlowID) ([]PendingStep, error) {
	raws, err := s.rdb.LRange(ctx, s.keys.CoveragePending(id), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("lrange %s: %w", s.keys.CoveragePending(id), err)
	}
	return s.pendingSteps(ctx, id, raws)
}
