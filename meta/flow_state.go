package meta

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// FlowState is a flow's runtime state, the flow:state:<id> hash.
type FlowState struct {
	Status      string // StatusActive or StatusFatal
	Error       string // reason of the fatal state; empty when active
	LastFlushTS uint64 // TSO of the last committed cycle with data of the flow
	// CheckpointTS is the flow's effective checkpoint (a TSO): the larger of
	// its own checkpoint_ts and the group's global_checkpoint (see
	// checkpoint.go; docs/FORMAT.md, "Checkpoint rule").
	CheckpointTS uint64
}

// FlowState returns the runtime state of flow id, or ErrFlowNotFound if the
// flow has none (it does not exist). Its keys, the flow's flow:info and the
// global checkpoint are read in one MULTI, so the checkpoint is the
// effective one of one moment.
func (s *Store) FlowState(ctx context.Context, id FlowID) (FlowState, error) {
	key := s.keys.FlowState(id)
	var all *redis.MapStringStringCmd
	var flush *redis.StringCmd
	var live *redis.IntCmd
	var ck checkpointCmds
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		all = p.HGetAll(ctx, key)
		flush = p.HGet(ctx, s.keys.LastFlush(), lastFlushField(id))
		live = p.Exists(ctx, s.keys.FlowInfo(id))
		ck = s.keys.queueCheckpoint(ctx, p, id)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return FlowState{}, fmt.Errorf("read state of flow %d: %w", id, err)
	}
	raw := all.Val()
	if len(raw) == 0 {
		return FlowState{}, fmt.Errorf("state of flow %d: %w", id, ErrFlowNotFound)
	}
	st := FlowState{Status: raw["status"], Error: raw["error"]}
	if st.CheckpointTS, err = ck.effective(s.keys, id, live.Val() > 0); err != nil {
		return FlowState{}, err
	}
	if st.LastFlushTS, err = parseLastFlush(s.keys, id, flush, raw); err != nil {
		return FlowState{}, err
	}
	return st, nil
}

// SetFlowFatal marks flow id fatal with reason. It returns ErrFlowNotFound
// if the flow does not exist (so a dropped flow never regains a state key).
func (s *Store) SetFlowFatal(ctx context.Context, id FlowID, reason string) error {
	return s.setState(ctx, "set_flow_fatal", id, func(ctx context.Context, p redis.Pipeliner, key string) {
		p.HSet(ctx, key, "status", StatusFatal, "error", reason)
	})
}

// SetFlowActive marks flow id active and clears its error. It returns
// ErrFlowNotFound if the flow does not exist.
func (s *Store) SetFlowActive(ctx context.Context, id FlowID) error {
	return s.setState(ctx, "set_flow_active", id, func(ctx context.Context, p redis.Pipeliner, key string) {
		p.HSet(ctx, key, "status", StatusActive)
		p.HDel(ctx, key, "error")
	})
}

// SetLastFlush records ts as flow id's last flush. It returns
// ErrFlowNotFound if the flow does not exist.
func (s *Store) SetLastFlush(ctx context.Context, id FlowID, ts uint64) error {
	return s.setState(ctx, "set_last_flush", id, func(ctx context.Context, p redis.Pipeliner, _ string) {
		queueLastFlush(ctx, p, s.keys, []FlowID{id}, ts)
	})
}

// AdvanceCheckpoint sets flow id's checkpoint_ts to ts if ts is larger than
// the stored one, and reports whether it did. The checkpoint never moves
// backwards. It is a no-op (false, nil) if the flow no longer exists.
func (s *Store) AdvanceCheckpoint(ctx context.Context, id FlowID, ts uint64) (bool, error) {
	return s.AdvanceCheckpointBelow(ctx, id, ts, math.MaxUint64)
}

// AdvanceCheckpointBelow is AdvanceCheckpoint for a checkpoint that may not
// exceed ceiling (the consumer's clock plus its clock skew): a stored
// checkpoint_ts above ceiling claims a time that has not come yet, which
// only a version that took any resolved ts could have written, and it is
// replaced by ts, the one backwards move a checkpoint makes.
func (s *Store) AdvanceCheckpointBelow(ctx context.Context, id FlowID, ts, ceiling uint64) (bool, error) {
	ts = min(ts, ceiling)
	infoKey, key := s.keys.FlowInfo(id), s.keys.FlowState(id)
	var advanced bool
	err := s.txn(ctx, "advance_checkpoint", []string{infoKey, key}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		advanced = false
		exists, err := tx.Exists(ctx, infoKey).Result()
		if err != nil {
			return nil, fmt.Errorf("exists %s: %w", infoKey, err)
		}
		if exists == 0 {
			return nil, nil
		}
		v, err := tx.HGet(ctx, key, "checkpoint_ts").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("hget %s: %w", key, err)
		}
		if err == nil {
			cur, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("parse %s checkpoint_ts: %w", key, err)
			}
			if ts <= cur && cur <= ceiling {
				return nil, nil
			}
		}
		advanced = true
		return func(p redis.Pipeliner) error {
			p.HSet(ctx, key, "checkpoint_ts", u64(ts))
			return nil
		}, nil
	})
	if err != nil {
		return false, fmt.Errorf("advance checkpoint of flow %d: %w", id, err)
	}
	return advanced, nil
}

// setState runs write on flow id's state key if the flow exists.
func (s *Store) setState(ctx context.Context, op string, id FlowID, write func(context.Context, redis.Pipeliner, string)) error {
	infoKey, key := s.keys.FlowInfo(id), s.keys.FlowState(id)
	err := s.txn(ctx, op, []string{infoKey}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		exists, err := tx.Exists(ctx, infoKey).Result()
		if err != nil {
			return nil, fmt.Errorf("exists %s: %w", infoKey, err)
		}
		if exists == 0 {
			return nil, ErrFlowNotFound
		}
		return func(p redis.Pipeliner) error {
			write(ctx, p, key)
			return nil
		}, nil
	})
	if err != nil {
		return fmt.Errorf("%s flow %d: %w", op, id, err)
	}
	return nil
}

// GlobalCheckpoint is the string holding the checkpoint of the consumer
// group that owns the prefix (a TSO): the effective checkpoint of every
// live flow is at least it (checkpoint.go), and layout v2's global
// checkpoint object holds it.
func (k Keys) GlobalCheckpoint() string { return k.base + "global_checkpoint" }

// checkpointMoves reports whether a stored checkpoint (v, err as a read of
// it returned) moves to ts: it is absent, below ts, or past ceiling.
func checkpointMoves(v string, err error, ts, ceiling uint64) (bool, error) {
	if errors.Is(err, redis.Nil) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	cur, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return false, err
	}
	return !(ts <= cur && cur <= ceiling), nil
}

// AdvanceCheckpoints is AdvanceCheckpointBelow for every flow of ids that
// still exists and for the global checkpoint, in one transaction: a
// checkpoint advance costs one round of reads and one MULTI, but WATCHes,
// reads and may write two keys of each flow. It returns the flows whose
// checkpoint_ts it moved and the global checkpoint after it (0: none).
// Layout v1 advances so on every advance; layout v2 on the first of a
// consumer session only, which replaces any checkpoint_ts past ceiling, and
// then with AdvanceGlobalCheckpoint.
func (s *Store) AdvanceCheckpoints(ctx context.Context, ids []FlowID, ts, ceiling uint64) (advanced []FlowID, global uint64, err error) {
	ts = min(ts, ceiling)
	k := s.keys
	watch := make([]string, 0, 2*len(ids)+1)
	for _, id := range ids {
		watch = append(watch, k.FlowInfo(id), k.FlowState(id))
	}
	watch = append(watch, k.GlobalCheckpoint())
	err = s.txn(ctx, "advance_checkpoints", watch, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		advanced, global = advanced[:0], 0
		exists := make([]*redis.IntCmd, len(ids))
		cks := make([]*redis.StringCmd, len(ids))
		var gc *redis.StringCmd
		if _, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				exists[i] = p.Exists(ctx, k.FlowInfo(id))
				cks[i] = p.HGet(ctx, k.FlowState(id), "checkpoint_ts")
			}
			gc = p.Get(ctx, k.GlobalCheckpoint())
			return nil
		}); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read checkpoints: %w", err)
		}
		for i, id := range ids {
			if exists[i].Val() == 0 {
				continue
			}
			v, err := cks[i].Result()
			move, err := checkpointMoves(v, err, ts, ceiling)
			if err != nil {
				return nil, fmt.Errorf("%s checkpoint_ts: %w", k.FlowState(id), err)
			}
			if move {
				advanced = append(advanced, id)
			}
		}
		v, err := gc.Result()
		moveGlobal, err := checkpointMoves(v, err, ts, ceiling)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.GlobalCheckpoint(), err)
		}
		global = ts
		if !moveGlobal {
			global, _ = strconv.ParseUint(gc.Val(), 10, 64)
		}
		if len(advanced) == 0 && !moveGlobal {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			for _, id := range advanced {
				p.HSet(ctx, k.FlowState(id), "checkpoint_ts", u64(ts))
			}
			if moveGlobal {
				p.Set(ctx, k.GlobalCheckpoint(), u64(ts), 0)
			}
			return nil
		}, nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("advance checkpoints to %d: %w", ts, err)
	}
	return advanced, global, nil
}

// AdvanceGlobalCheckpoint is the checkpoint advance of layout v2: it sets
// the global checkpoint to ts (at most ceiling) if that is larger than the
// stored one, or if the stored one lies past ceiling, and returns the global
// checkpoint after it. It WATCHes, reads and writes that one key however
// many flows there are: every live flow's effective checkpoint moves with
// it (checkpoint.go), and no flow's checkpoint_ts is written.
func (s *Store) AdvanceGlobalCheckpoint(ctx context.Context, ts, ceiling uint64) (uint64, error) {
	ts = min(ts, ceiling)
	key := s.keys.GlobalCheckpoint()
	var global uint64
	err := s.txn(ctx, "advance_global_checkpoint", []string{key}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		v, err := tx.Get(ctx, key).Result()
		move, err := checkpointMoves(v, err, ts, ceiling)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if !move {
			global, _ = strconv.ParseUint(v, 10, 64)
			return nil, nil
		}
		global = ts
		return func(p redis.Pipeliner) error {
			p.Set(ctx, key, u64(ts), 0)
			return nil
		}, nil
	})
	if err != nil {
		return 0, fmt.Errorf("advance global checkpoint to %d: %w", ts, err)
	}
	return global, nil
}

// GlobalCheckpointTS returns the global checkpoint, and false if none was
// recorded.
func (s *Store) GlobalCheckpointTS(ctx context.Context) (uint64, bool, error) {
	v, ok, err := getString(ctx, s.rdb, s.keys.GlobalCheckpoint())
	if err != nil || !ok {
		return 0, ok, err
	}
	ts, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s = %q: %w", s.keys.GlobalCheckpoint(), v, err)
	}
	return ts, true, nil
}
