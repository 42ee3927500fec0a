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
//   - The DDL transaction that adds or removes a table of a flow (create,
//     replace, drop) appends a pending entry to coverage:<id>:pending in
//     the same MULTI, numbered by coverage:<id>:seq, and adds the flow to
//     coverage:flows.
//   - Every owner of an apply partition, once its registry shows the flow as
//     Redis holds it now (so its routing follows every pending DDL), reports
//     for each pending entry the partition's value at the routing boundary:
//     for an added table, the highest commit ts the partition had seen
//     before it started to route the table; for a removed one, the
//     partition's checkpoint in the cycle frozen where it stopped. The
//     report rides in the commit of the cycle holding the records before the
//     boundary, fenced by the partition's lease, and is kept first-wins
//     (HSETNX in coverage:<id>:parts): a later owner starts at the committed
//     offset, which is where the committed report's boundary lies.
//   - Once every apply partition with records has reported an entry, it is
//     final: since = the max of the reports, until = the min (partitions
//     whose regions all dropped out report "idle" and are left out). Entries
//     finalize in order. The current window of each table is a field of
//     coverage:<id>; a window replaced by a new one for the same table moves
//     to coverage:<id>:history.
//
// Every event of the table with since < ts <= until is then in a committed
// chunk: a partition routed the table from its boundary on, and nothing it
// had seen before the boundary was newer than since; it routed it until its
// boundary, and everything up to its checkpoint there had arrived.

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

// Coverage pending-entry kinds.
const (
	CoverageSince = "since"
	CoverageUntil = "until"
)

// CoverageEntry is one pending window bound of a flow's table.
type CoverageEntry struct {
	Seq   uint64 `json:"seq"`
	Kind  string `json:"kind"` // CoverageSince or CoverageUntil
	Table uint32 `json:"table"`
	// Ckpt is, for an until entry, the flow's checkpoint_ts when the DDL
	// that removed the table was applied (0 if it had none). Until the
	// entry is final, the table's open window is complete only up to it
	// (see PendingUntil).
	Ckpt uint64 `json:"ckpt,omitempty"`
}

// PendingUntil returns, for each table of entries with a pending until
// entry, the smallest Ckpt of those entries: how far its current window is
// known to be complete while the until is pending.
//
// Why: once the DDL that removes a table is applied, each apply partition
// stops routing the table at its own boundary and reports it; until every
// partition has, the window has no until, yet the partitions that stopped
// no longer back up the table's events past their boundary while the
// checkpoint moves on. The events up to the flow's checkpoint at the DDL
// are in committed chunks, though: that checkpoint was reached before the
// DDL, so every partition had committed them while still routing the
// table. So a restore past it leaves the table out until the entry is
// final (then until, the min of the reports, says exactly how far).
func PendingUntil(entries []CoverageEntry) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for _, e := range entries {
		if e.Kind != CoverageUntil {
			continue
		}
		if c, ok := out[e.Table]; !ok || e.Ckpt < c {
			out[e.Table] = e.Ckpt
		}
	}
	return out
}

// CoverageReport is one partition's value for a pending entry.
type CoverageReport struct {
	FlowID    FlowID
	Seq       uint64
	Topic     string
	Partition int32
	TS        uint64
	Idle      bool // no live region: left out of an until's min
}

// PendingFlow is a flow with pending coverage entries, and its definition
// as Redis holds it now (Exists false: dropped).
type PendingFlow struct {
	ID      FlowID
	Exists  bool
	Info    FlowInfo
	Entries []CoverageEntry
}

func (k Keys) coverageSub(id uint32, sub string) string { return k.Coverage(id) + ":" + sub }

// CoveragePending is the list of a flow's pending coverage entries.
func (k Keys) CoveragePending(id uint32) string { return k.coverageSub(id, "pending") }

// CoverageParts is the hash of partition reports: "<seq>/<topic>/<p>" -> ts
// or "idle".
func (k Keys) CoverageParts(id uint32) string { return k.coverageSub(id, "parts") }

// CoverageSeq numbers a flow's pending entries.
func (k Keys) CoverageSeq(id uint32) string { return k.coverageSub(id, "seq") }

// CoverageHistory lists a flow's earlier windows (JSON with table_id).
func (k Keys) CoverageHistory(id uint32) string { return k.coverageSub(id, "history") }

// CoverageFlows is the set of flow ids with pending coverage entries.
func (k Keys) CoverageFlows() string { return k.base + "coverage:flows" }

// MaxTS is maxts:<topic>:<partition>, the highest commit ts the partition's
// committed records held: a new owner's "seen before" for an added table.
func (k Keys) MaxTS(topic string, partition int32) string {
	return k.base + "maxts:" + topic + ":" + strconv.Itoa(int(partition))
}

func partField(seq uint64, topic string, p int32) string {
	return strconv.FormatUint(seq, 10) + "/" + topic + "/" + strconv.Itoa(int(p))
}

// coverageTx WATCHes and reads the flow's entry counter and returns the
// writes that append a since entry per added table and an until entry per
// removed one.
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
	// old, which makes the bound PendingUntil gives lower, never wrong.
	var ckpt uint64
	if len(removed) > 0 {
		v, err := tx.HGet(ctx, k.FlowState(id), "checkpoint_ts").Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, fmt.Errorf("hget %s: %w", k.FlowState(id), err)
		default:
			if ckpt, err = strconv.ParseUint(v, 10, 64); err != nil {
				return nil, fmt.Errorf("parse %s checkpoint_ts = %q: %w", k.FlowState(id), v, err)
			}
		}
	}
	var vals []any
	for _, e := range []struct {
		kind   string
		tables []uint32
		ckpt   uint64
	}{{CoverageUntil, removed, ckpt}, {CoverageSince, added, 0}} {
		for _, t := range e.tables {
			seq++
			b, _ := json.Marshal(CoverageEntry{Seq: seq, Kind: e.kind, Table: t, Ckpt: e.ckpt})
			vals = append(vals, string(b))
		}
	}
	return func(p redis.Pipeliner) {
		p.RPush(ctx, k.CoveragePending(id), vals...)
		p.Set(ctx, seqKey, strconv.FormatUint(seq, 10), 0)
		p.SAdd(ctx, k.CoverageFlows(), u32(id))
	}, nil
}

// tableDiff returns the tables of next missing from cur (added) and those of
// cur missing from next (removed), each sorted and without duplicates.
func tableDiff(cur, next []uint32) (added, removed []uint32) {
	c := slices.Compact(slices.Sorted(slices.Values(cur)))
	n := slices.Compact(slices.Sorted(slices.Values(next)))
	for _, t := range n {
		if _, ok := slices.BinarySearch(c, t); !ok {
			added = append(added, t)
		}
	}
	for _, t := range c {
		if _, ok := slices.BinarySearch(n, t); !ok {
			removed = append(removed, t)
		}
	}
	return added, removed
}

// PendingCoverage returns every flow with pending coverage entries, with
// its definition as Redis holds it now.
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
		var ir *redis.StringCmd
		_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			lr = p.LRange(ctx, k.CoveragePending(id), 0, -1)
			ir = p.Get(ctx, k.FlowInfo(id))
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read pending coverage of flow %d: %w", id, err)
		}
		pf := PendingFlow{ID: id}
		if raw, err := ir.Result(); err == nil {
			if pf.Info, err = decodeInfo(k.FlowInfo(id), raw); err != nil {
				return nil, err
			}
			pf.Exists = true
		}
		for _, raw := range lr.Val() {
			var e CoverageEntry
			if err := json.Unmarshal([]byte(raw), &e); err != nil {
				return nil, fmt.Errorf("decode pending coverage of flow %d: %w", id, err)
			}
			pf.Entries = append(pf.Entries, e)
		}
		if len(pf.Entries) > 0 {
			out = append(out, pf)
		}
	}
	slices.SortFunc(out, func(a, b PendingFlow) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// Windows returns flow id's coverage windows: the current one of each table
// (by table) and the earlier ones (history, oldest first).
func (s *Store) Windows(ctx context.Context, id FlowID) (current map[uint32]Window, history []Window, err error) {
	k := s.keys
	cur, err := s.rdb.HGetAll(ctx, k.Coverage(id)).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("hgetall %s: %w", k.Coverage(id), err)
	}
	current = make(map[uint32]Window, len(cur))
	for f, v := range cur {
		t, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: table %q: %w", k.Coverage(id), f, err)
		}
		var w Window
		if err := json.Unmarshal([]byte(v), &w); err != nil {
			return nil, nil, fmt.Errorf("%s: table %d: %w", k.Coverage(id), t, err)
		}
		w.TableID = uint32(t)
		current[uint32(t)] = w
	}
	hist, err := s.rdb.LRange(ctx, k.CoverageHistory(id), 0, -1).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("lrange %s: %w", k.CoverageHistory(id), err)
	}
	for _, v := range hist {
		var w Window
		if err := json.Unmarshal([]byte(v), &w); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", k.CoverageHistory(id), err)
		}
		history = append(history, w)
	}
	return current, history, nil
}

// WindowAt returns the window of table that holds ts among current and
// history, and false if none does.
func WindowAt(current map[uint32]Window, history []Window, table uint32, ts uint64) (Window, bool) {
	if w, ok := current[table]; ok && w.Holds(ts) {
		return w, true
	}
	for i := len(history) - 1; i >= 0; i-- {
		if w := history[i]; w.TableID == table && w.Holds(ts) {
			return w, true
		}
	}
	return Window{}, false
}

// FinalizeCoverage makes final every pending entry that each partition of
// topic in withRecords has reported, in order, flow by flow. It returns how
// many entries it made final.
func (s *Store) FinalizeCoverage(ctx context.Context, topic string, withRecords []int32) (int, error) {
	k := s.keys
	ids, err := s.rdb.SMembers(ctx, k.CoverageFlows()).Result()
	if err != nil {
		return 0, fmt.Errorf("smembers %s: %w", k.CoverageFlows(), err)
	}
	total := 0
	for _, v := range ids {
		id64, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			continue
		}
		id := FlowID(id64)
		n := 0
		err = s.txn(ctx, "finalize_coverage", []string{k.CoveragePending(id), k.CoverageParts(id), k.Coverage(id)},
			func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
				n = 0
				return s.finalizeTx(ctx, tx, id, topic, withRecords, &n)
			})
		if err != nil {
			return total, fmt.Errorf("finalize coverage of flow %d: %w", id, err)
		}
		total += n
	}
	return total, nil
}

func (s *Store) finalizeTx(ctx context.Context, tx *redis.Tx, id FlowID, topic string, withRecords []int32, n *int) (func(redis.Pipeliner) error, error) {
	k := s.keys
	pend, err := tx.LRange(ctx, k.CoveragePending(id), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("lrange %s: %w", k.CoveragePending(id), err)
	}
	if len(pend) == 0 {
		return func(p redis.Pipeliner) error { p.SRem(ctx, k.CoverageFlows(), u32(id)); return nil }, nil
	}
	parts, err := tx.HGetAll(ctx, k.CoverageParts(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("hgetall %s: %w", k.CoverageParts(id), err)
	}
	cur, err := tx.HGetAll(ctx, k.Coverage(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("hgetall %s: %w", k.Coverage(id), err)
	}
	windows := map[uint32]*Window{}
	for f, v := range cur {
		t, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			continue
		}
		var w Window
		if json.Unmarshal([]byte(v), &w) == nil {
			w.TableID = uint32(t)
			windows[uint32(t)] = &w
		}
	}
	var history []string
	changed := map[uint32]bool{}
	var done []uint64
	for _, raw := range pend {
		var e CoverageEntry
		if err := json.Unmarshal([]byte(raw), &e); err != nil {
			return nil, fmt.Errorf("decode %s: %w", k.CoveragePending(id), err)
		}
		var vals []uint64
		complete := true
		for _, p := range withRecords {
			v, ok := parts[partField(e.Seq, topic, p)]
			if !ok {
				complete = false
				break
			}
			if v == CkptIdle {
				continue
			}
			ts, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", k.CoverageParts(id), v, err)
			}
			vals = append(vals, ts)
		}
		if !complete {
			break // entries finalize in order
		}
		switch e.Kind {
		case CoverageSince:
			if w := windows[e.Table]; w != nil {
				b, _ := json.Marshal(*w)
				history = append(history, string(b))
			}
			since := uint64(0)
			if len(vals) > 0 {
				since = slices.Max(vals)
			}
			windows[e.Table] = &Window{TableID: e.Table, Since: since}
		case CoverageUntil:
			w := windows[e.Table]
			if w == nil || w.Until != nil {
				break // never established, or closed already
			}
			until := w.Since // no live partition: an empty window
			if len(vals) > 0 {
				until = slices.Min(vals)
			}
			w.Until = &until
		}
		changed[e.Table] = true
		done = append(done, e.Seq)
	}
	*n = len(done)
	if len(done) == 0 {
		return nil, nil
	}
	var hdel []string
	for f := range parts {
		seq, _, _ := strings.Cut(f, "/")
		if s, err := strconv.ParseUint(seq, 10, 64); err == nil && s <= done[len(done)-1] {
			hdel = append(hdel, f)
		}
	}
	return func(p redis.Pipeliner) error {
		for t := range changed {
			w := windows[t]
			if w == nil {
				continue
			}
			b, _ := json.Marshal(Window{Since: w.Since, Until: w.Until})
			p.HSet(ctx, k.Coverage(id), strconv.FormatUint(uint64(t), 10), string(b))
		}
		if len(history) > 0 {
			p.RPush(ctx, k.CoverageHistory(id), toAny(history)...)
		}
		p.LTrim(ctx, k.CoveragePending(id), int64(len(done)), -1)
		if len(hdel) > 0 {
			p.HDel(ctx, k.CoverageParts(id), hdel...)
		}
		if len(done) == len(pend) {
			p.SRem(ctx, k.CoverageFlows(), u32(id))
		}
		return nil
	}, nil
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// PartitionStart is what a new owner of an apply partition needs to know of
// the committed position for coverage reports: the highest commit ts of the
// committed records (0: none) and the committed checkpoint (HasCkpt false:
// none; Idle: every region had dropped out).
type PartitionStart struct {
	MaxTS   uint64
	Ckpt    uint64
	HasCkpt bool
	Idle    bool
}

// PartitionStart reads maxts and ckpt of a partition.
func (s *Store) PartitionStart(ctx context.Context, topic string, partition int32) (PartitionStart, error) {
	k := s.keys
	vals, err := s.rdb.MGet(ctx, k.MaxTS(topic, partition), k.Ckpt(topic, partition)).Result()
	if err != nil {
		return PartitionStart{}, fmt.Errorf("mget maxts and ckpt of %s/%d: %w", topic, partition, err)
	}
	var st PartitionStart
	if v, ok := vals[0].(string); ok {
		if st.MaxTS, err = strconv.ParseUint(v, 10, 64); err != nil {
			return st, fmt.Errorf("parse %s = %q: %w", k.MaxTS(topic, partition), v, err)
		}
	}
	if v, ok := vals[1].(string); ok {
		if v == CkptIdle {
			st.Idle = true
		} else if st.Ckpt, err = strconv.ParseUint(v, 10, 64); err != nil {
			return st, fmt.Errorf("parse %s = %q: %w", k.Ckpt(topic, partition), v, err)
		} else {
			st.HasCkpt = true
		}
	}
	return st, nil
}
