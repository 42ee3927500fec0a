package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The history of a flow's windows keeps only what a restore can still
// choose. restore --ts T takes, for a table, the first window that holds T
// in this order: the current window, then the earlier ones newest first
// (WindowAt). An earlier window is dropped, when a window replaces it and
// whenever its table's history is written, if no T could choose it:
//
//   - it holds no ts (since > until: a table removed before any partition
//     had seen past its addition, as a replace storm makes them);
//   - it ends before the flow's truncation point (truncated_before: a
//     restore below it is refused anyway);
//   - a window that comes before it in that order holds every ts it holds
//     (the same window twice, from tables removed and added back while
//     nothing moved).
//
// So what remains is exactly the windows some restore can use, and a
// restore's choice, and with it its result, is the same as with the whole
// history. The history is the hash coverage:<id>:past, table -> JSON array
// of windows, oldest first; the list coverage:<id>:history of earlier
// versions is still read, as the oldest windows of each table.

// pruneHistory returns the windows of hist (one table's, oldest first)
// that a restore can still choose, given its current window (nil: none)
// and the truncation point tb (0: none).
func pruneHistory(hist []Window, cur *Window, tb uint64) []Window {
	var preferred []Window // windows a restore looks at before the one at hand
	if cur != nil {
		preferred = append(preferred, *cur)
	}
	keep := make([]bool, len(hist))
	for i := len(hist) - 1; i >= 0; i-- {
		w := hist[i]
		if w.Until != nil && (*w.Until < w.Since || *w.Until < tb) {
			continue
		}
		if slices.ContainsFunc(preferred, func(p Window) bool { return covers(p, w) }) {
			continue
		}
		keep[i] = true
		preferred = append(preferred, w)
	}
	out := hist[:0:0]
	for i, w := range hist {
		if keep[i] {
			out = append(out, w)
		}
	}
	return out
}

// covers reports whether every ts w holds, p holds too.
func covers(p, w Window) bool {
	if p.Since > w.Since {
		return false
	}
	switch {
	case p.Until == nil:
		return true
	case w.Until == nil:
		return false
	}
	return *w.Until <= *p.Until
}

// encodeHistory is one table's field of coverage:<id>:past.
func encodeHistory(ws []Window) string {
	out := make([]Window, len(ws))
	for i, w := range ws {
		out[i] = Window{Since: w.Since, Until: w.Until}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func decodeHistory(key string, table uint32, v string) ([]Window, error) {
	var ws []Window
	if err := json.Unmarshal([]byte(v), &ws); err != nil {
		return nil, fmt.Errorf("%s: table %d: %w", key, table, err)
	}
	for i := range ws {
		ws[i].TableID = table
	}
	return ws, nil
}

// Windows returns flow id's coverage windows: the current one of each table
// (by table) and the earlier ones (oldest first within each table).
func (s *Store) Windows(ctx context.Context, id FlowID) (current map[uint32]Window, history []Window, err error) {
	k := s.keys
	var cur, past *redis.MapStringStringCmd
	var legacy *redis.StringSliceCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		cur = p.HGetAll(ctx, k.Coverage(id))
		legacy = p.LRange(ctx, k.CoverageHistory(id), 0, -1)
		past = p.HGetAll(ctx, k.CoveragePast(id))
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("read coverage windows of flow %d: %w", id, err)
	}
	return s.parseCoverage(id, cur.Val(), legacy.Val(), past.Val())
}

// parseCoverage decodes a flow's coverage:<id>, its history list of earlier
// versions and coverage:<id>:past, each read whole: the current windows by
// table, and the history oldest first within each table (the legacy list's
// windows before those of past, tables in the order of their fields).
func (s *Store) parseCoverage(id FlowID, cur map[string]string, legacy []string, past map[string]string) (current map[uint32]Window, history []Window, err error) {
	k := s.keys
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
	for _, v := range legacy {
		var w Window
		if err := json.Unmarshal([]byte(v), &w); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", k.CoverageHistory(id), err)
		}
		history = append(history, w)
	}
	for _, f := range slices.Sorted(maps.Keys(past)) {
		t, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: table %q: %w", k.CoveragePast(id), f, err)
		}
		ws, err := decodeHistory(k.CoveragePast(id), uint32(t), past[f])
		if err != nil {
			return nil, nil, err
		}
		history = append(history, ws...)
	}
	return current, history, nil
}

// WindowAt returns the window of table that holds ts among current and
// history, and false if none does: the current window first, then the
// earlier ones, newest first.
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

// PruneHistory drops from flow id's history the windows no restore can
// choose any more (pruneHistory), reading and rewriting it a chunk of
// tables at a time; run it after the truncation point moved. It returns
// how many windows it dropped.
func (s *Store) PruneHistory(ctx context.Context, id FlowID) (int, error) {
	k := s.keys
	tb, _, err := s.TruncatedBefore(ctx, id)
	if err != nil {
		return 0, err
	}
	dropped := 0
	var cursor uint64
	for {
		fields, next, err := s.rdb.HScan(ctx, k.CoveragePast(id), cursor, "*", stepChunk).Result()
		if err != nil {
			return dropped, fmt.Errorf("hscan %s: %w", k.CoveragePast(id), err)
		}
		for i := 0; i+1 < len(fields); i += 2 {
			n, err := s.pruneTable(ctx, id, fields[i], tb)
			if err != nil {
				return dropped, err
			}
			dropped += n
		}
		if cursor = next; cursor == 0 {
			return dropped, nil
		}
	}
}

// pruneTable prunes one table's history in a transaction.
func (s *Store) pruneTable(ctx context.Context, id FlowID, field string, tb uint64) (int, error) {
	k := s.keys
	t, err := strconv.ParseUint(field, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%s: table %q: %w", k.CoveragePast(id), field, err)
	}
	dropped := 0
	err = s.txn(ctx, "prune_history", []string{k.CoveragePast(id), k.Coverage(id)}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		vals, err := tx.HMGet(ctx, k.CoveragePast(id), field).Result()
		if err != nil {
			return nil, fmt.Errorf("hget %s: %w", k.CoveragePast(id), err)
		}
		raw, ok := vals[0].(string)
		if !ok {
			return nil, nil
		}
		hist, err := decodeHistory(k.CoveragePast(id), uint32(t), raw)
		if err != nil {
			return nil, err
		}
		cur, err := currentWindow(ctx, tx, k.Coverage(id), uint32(t))
		if err != nil {
			return nil, err
		}
		kept := pruneHistory(hist, cur, tb)
		if dropped = len(hist) - len(kept); dropped == 0 {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			if len(kept) == 0 {
				p.HDel(ctx, k.CoveragePast(id), field)
			} else {
				p.HSet(ctx, k.CoveragePast(id), field, encodeHistory(kept))
			}
			markCatalog(ctx, p, k, id)
			return nil
		}, nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune history of flow %d table %d: %w", id, t, err)
	}
	return dropped, nil
}

// currentWindow reads one table's current window, nil if it has none.
func currentWindow(ctx context.Context, c redis.Cmdable, key string, table uint32) (*Window, error) {
	v, err := c.HGet(ctx, key, u32(table)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hget %s: %w", key, err)
	}
	var w Window
	if err := json.Unmarshal([]byte(v), &w); err != nil {
		return nil, fmt.Errorf("%s: table %d: %w", key, table, err)
	}
	w.TableID = table
	return &w, nil
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
