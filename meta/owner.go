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

// ClaimOwner records group as the owner of the store's prefix if no group
// owns it yet (SETNX), and returns an *OwnerError if another group does.
// Claiming again with the owning group is a no-op. Two groups consuming the
// apply topic under one prefix would each commit offsets and metas for the
// same partitions, so the second one must not start.
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
		if ok {
			return nil
		}
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
		return nil
	}
	return fmt.Errorf("claim owner %s: key keeps disappearing", key)
}
