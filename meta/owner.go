package meta

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Owner is the string key holding the consumer group that owns the prefix
// (docs/FORMAT.md, "Commit protocol").
func (k Keys) Owner() string { return k.base + "owner" }

// OwnerError is returned by ClaimOwner when another consumer group owns the
// prefix.
type OwnerError struct {
	Owner string // the group recorded under the prefix
	Group string // the group that tried to claim it
}

func (e *OwnerError) Error() string {
	return fmt.Sprintf("owned by consumer group %q, not %q", e.Owner, e.Group)
}

// ErrOwnerLost matches every *OwnerLostError with errors.Is.
var ErrOwnerLost = errors.New("meta: owner key lost")

// OwnerLostError is returned by the writes of a store whose ClaimOwner
// succeeded once the owner key no longer names the claiming group: Redis was
// flushed, restored from an old dump, or the prefix's keys were deleted.
// Writing on would rebuild flows, offsets and metas from nothing over a
// bucket that already holds the backup, so the write is refused; the
// operator rebuilds Redis with `consumer recover` (docs/OPERATING.md,
// "Losing Redis"). errors.Is(err, ErrLeaseLost) is true as well: like a
// lost lease, the cycle is fenced and nothing of it is committed.
type OwnerLostError struct {
	Key   string // the owner key
	Group string // the group that claimed it
	Found string // what the key holds now; "" when it is absent
}

// Error names the key, what it holds and the way out.
func (e *OwnerLostError) Error() string {
	found := "is gone (Redis flushed or the prefix's keys deleted)"
	if e.Found != "" {
		found = fmt.Sprintf("names consumer group %q now", e.Found)
	}
	return fmt.Sprintf("redis state lost: owner key %s of consumer group %q %s: stopped committing; rebuild Redis with `consumer recover`, then restart",
		e.Key, e.Group, found)
}

// Is makes errors.Is(err, ErrOwnerLost) and errors.Is(err, ErrLeaseLost)
// true.
func (e *OwnerLostError) Is(target error) bool {
	return target == ErrOwnerLost || target == ErrLeaseLost
}

// ClaimOwner records group as the owner of the store's prefix if no group
// owns it yet (SETNX), and returns an *OwnerError if another group does.
// Claiming again with the owning group is a no-op. Two groups consuming the
// apply topic under one prefix would each commit offsets and metas for the
// same partitions, so the second one must not start.
//
// Once ClaimOwner succeeded, the store guards the writes a running consumer
// makes (Commit, AcquireLease, ApplyDDL, ClaimDDLReject, AdvanceDDLOffset):
// each WATCHes the owner key and fails with an *OwnerLostError when it no
// longer names group.
func (s *Store) ClaimOwner(ctx context.Context, group string) error {
	if group == "" {
		return errors.New("claim owner: empty group")
	}
	key := s.keys.Owner()
	for range 3 {
		ok, err := s.rdb.SetNX(ctx, key, group, 0).Result()
		if err != nil {
			return fmt.Errorf("claim owner %s: %w", key, err)
		}
		if !ok {
			owner, err := s.rdb.Get(ctx, key).Result()
			if errors.Is(err, redis.Nil) {
				continue // deleted between SETNX and GET: claim again
			}
			if err != nil {
				return fmt.Errorf("read owner %s: %w", key, err)
			}
			if owner != group {
				return &OwnerError{Owner: owner, Group: group}
			}
		}
		s.owner.Store(&group)
		return nil
	}
	return fmt.Errorf("claim owner %s: key keeps disappearing", key)
}

// OwnerOf returns the consumer group recorded under the prefix, and false
// when none is (a Redis that was never used under the prefix, or lost its
// state).
func (s *Store) OwnerOf(ctx context.Context) (string, bool, error) {
	return getString(ctx, s.rdb, s.keys.Owner())
}

// guardKeys returns keys plus the owner key when the store guards its
// writes (after ClaimOwner): the WATCH of the commit, which reads the owner
// key in its own batch of reads (every other transaction is guarded by
// txn itself).
func (s *Store) guardKeys(keys ...string) []string {
	if s.owner.Load() == nil {
		return keys
	}
	return append(keys, s.keys.Owner())
}

// checkOwner is the guard of a write transaction: it reads the owner key
// (WATCHed by txn) and returns an *OwnerLostError unless it
// names the group that claimed it. A store that never claimed passes.
func (s *Store) checkOwner(ctx context.Context, tx redis.Cmdable) error {
	if s.owner.Load() == nil {
		return nil
	}
	found, _, err := getString(ctx, tx, s.keys.Owner())
	if err != nil {
		return err
	}
	return s.ownerResult(found)
}

// ownerResult is checkOwner's verdict on the value read.
func (s *Store) ownerResult(found string) error {
	owner := s.owner.Load()
	if owner == nil || found == *owner {
		return nil
	}
	return &OwnerLostError{Key: s.keys.Owner(), Group: *owner, Found: found}
}
