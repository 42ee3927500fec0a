package meta

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// LastFlush is the hash flow id -> last_flush_ts: the TSO of the last
// committed cycle that held data of the flow.
//
// Every commit writes it for the flows of its cycle, so it lives apart from
// flow:state:<flow_id>, which the checkpoint advance WATCHes: written there,
// each of N replicas' commits made every advance in flight retry, and at a
// few hundred replicas one of them rarely got through. One hash also makes
// it one HSET per commit, not one per flow.
func (k Keys) LastFlush() string { return k.base + "last_flush" }

// lastFlushField is the flow's field in the LastFlush hash.
func lastFlushField(id FlowID) string { return u32(id) }

// queueLastFlush queues writing ts as last_flush_ts of ids (one command).
func queueLastFlush(ctx context.Context, p redis.Pipeliner, k Keys, ids []FlowID, ts uint64) {
	if len(ids) == 0 {
		return
	}
	v := u64(ts)
	args := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		args = append(args, lastFlushField(id), v)
	}
	p.HSet(ctx, k.LastFlush(), args...)
}

// parseLastFlush is the flow's last_flush_ts: the LastFlush field when
// present, else the last_flush_ts field of flow:state that versions before
// the LastFlush hash wrote (legacy, never written now), else 0.
func parseLastFlush(k Keys, id FlowID, field *redis.StringCmd, legacy map[string]string) (uint64, error) {
	key, v := k.LastFlush(), field.Val()
	if field.Err() != nil {
		key, v = k.FlowState(id), legacy["last_flush_ts"]
	}
	if v == "" {
		return 0, nil
	}
	ts, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s last flush of flow %d %q: %w", key, id, v, err)
	}
	return ts, nil
}
