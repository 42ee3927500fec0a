package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// FlowSummary is what a status page shows of one flow's backup catalog:
// its current coverage windows (Windows is nil when the flow has more than
// the caller's maximum; WindowCount is always set), its newest listed
// snapshot and its truncation point (0: none).
type FlowSummary struct {
	Windows         map[uint32]Window
	WindowCount     int
	SnapshotTS      uint64
	TruncatedBefore uint64
}

// FlowSummaries reads the summary of every flow of ids in two pipelined
// round trips, whatever the number of flows: the windows of a flow with
// more than maxWindows tables are counted, not read, so that a status page
// of a flow of 100,000 tables costs what one of a few tables does.
func (s *Store) FlowSummaries(ctx context.Context, ids []FlowID, maxWindows int) (map[FlowID]FlowSummary, error) {
	k := s.keys
	if len(ids) == 0 {
		return map[FlowID]FlowSummary{}, nil
	}
	lens := make([]*redis.IntCmd, len(ids))
	snaps := make([]*redis.StringSliceCmd, len(ids))
	truncs := make([]*redis.StringCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			lens[i] = p.HLen(ctx, k.Coverage(id))
			snaps[i] = p.ZRevRange(ctx, k.Snapshots(id), 0, 0)
			truncs[i] = p.Get(ctx, k.TruncatedBefore(id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read flow summaries: %w", err)
	}
	out := make(map[FlowID]FlowSummary, len(ids))
	var small []FlowID
	for i, id := range ids {
		var fs FlowSummary
		fs.WindowCount = int(lens[i].Val())
		if m := snaps[i].Val(); len(m) > 0 {
			if ts, _, err := SnapshotPathTS(m[0]); err == nil {
				fs.SnapshotTS = ts
			}
		}
		if v, err := truncs[i].Result(); err == nil {
			if fs.TruncatedBefore, err = strconv.ParseUint(v, 10, 64); err != nil {
				return nil, fmt.Errorf("parse %s = %q: %w", k.TruncatedBefore(id), v, err)
			}
		}
		out[id] = fs
		if fs.WindowCount > 0 && fs.WindowCount <= maxWindows {
			small = append(small, id)
		}
	}
	if len(small) == 0 {
		return out, nil
	}
	all := make([]*redis.MapStringStringCmd, len(small))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range small {
			all[i] = p.HGetAll(ctx, k.Coverage(id))
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read coverage windows: %w", err)
	}
	for i, id := range small {
		fs := out[id]
		fs.Windows = make(map[uint32]Window, len(all[i].Val()))
		for f, v := range all[i].Val() {
			t, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%s: table %q: %w", k.Coverage(id), f, err)
			}
			var w Window
			if err := json.Unmarshal([]byte(v), &w); err != nil {
				return nil, fmt.Errorf("%s: table %d: %w", k.Coverage(id), t, err)
			}
			w.TableID = uint32(t)
			fs.Windows[uint32(t)] = w
		}
		out[id] = fs
	}
	return out, nil
}
