package meta

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// commitReads reads on the commit's WATCHed connection what it decides on,
// in one round trip however many partitions and flows the cycle has: the
// owner key (when the store guards its writes), every lease, the offset of
// every partition with CheckFrom, and which flows of c.Flows exist (one
// SMISMEMBER of the flows set, Redis 6.2 or later). It returns a *LeaseLostError for the first lease no longer
// held by the same member at the same epoch (after an *OwnerLostError if
// the prefix's state is gone), else an *OffsetMovedError for
// the first offset that is neither where its cycle started nor already
// where it ends, else the ids of c.Flows that the flows set holds.
//
// Reading them together instead of one by one changes nothing the commit
// relies on: the keys are WATCHed before the reads, so a change to any of
// them before EXEC fails the EXEC whatever order the reads came in.
func (s *Store) commitReads(ctx context.Context, tx *redis.Tx, c *Commit) ([]FlowID, error) {
	k := s.keys
	var owner *redis.StringCmd
	leases := make([]*redis.SliceCmd, len(c.Leases))
	offsets := make([]*redis.StringCmd, len(c.Partitions))
	var flows *redis.BoolSliceCmd
	_, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		if s.owner.Load() != nil {
			owner = p.Get(ctx, k.Owner())
		}
		for i, l := range c.Leases {
			leases[i] = p.HMGet(ctx, k.Lease(l.Topic, l.Partition), "member", "epoch")
		}
		for i, pc := range c.Partitions {
			if pc.CheckFrom {
				offsets[i] = p.Get(ctx, k.Offset(pc.Topic, pc.Partition))
			}
		}
		if len(c.Flows) > 0 {
			ids := make([]any, len(c.Flows))
			for i, id := range c.Flows {
				ids[i] = u32(id)
			}
			flows = p.SMIsMember(ctx, k.Flows(), ids...)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read leases, offsets and flows: %w", err)
	}
	if owner != nil {
		found, err := owner.Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("get %s: %w", k.Owner(), err)
		}
		if err := s.ownerResult(found); err != nil {
			return nil, err
		}
	}
	for i, l := range c.Leases {
		member, epoch, err := parseLease(k.Lease(l.Topic, l.Partition), leases[i])
		if err != nil {
			return nil, err
		}
		if member != l.Member || epoch != l.Epoch {
			return nil, &LeaseLostError{Lease: l, HolderMember: member, HolderEpoch: epoch}
		}
	}
	for i, pc := range c.Partitions {
		if !pc.CheckFrom {
			continue
		}
		stored, err := parseOffset(k.Offset(pc.Topic, pc.Partition), offsets[i])
		if err != nil {
			return nil, err
		}
		if stored == pc.From || stored >= 0 && stored == pc.NextOffset {
			continue
		}
		return nil, &OffsetMovedError{Topic: pc.Topic, Partition: pc.Partition, From: pc.From, Stored: stored}
	}
	if flows == nil {
		return nil, nil
	}
	member, err := flows.Result()
	if err != nil {
		return nil, fmt.Errorf("smismember %s: %w", k.Flows(), err)
	}
	var live []FlowID
	for i, id := range c.Flows {
		if member[i] {
			live = append(live, id)
		}
	}
	return live, nil
}

// parseOffset is the offset a pipelined GET of key read, -1 if absent.
func parseOffset(key string, cmd *redis.StringCmd) (int64, error) {
	v, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get %s: %w", key, err)
	}
	off, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s = %q: %w", key, v, err)
	}
	return off, nil
}
