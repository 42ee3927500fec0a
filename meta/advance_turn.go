package meta

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// AdvanceTurn is the string naming the member whose turn it is to advance
// the global checkpoint, set with a TTL.
//
// Any replica may compute the global checkpoint and advance the flows to
// it: the value is the min of the committed partition checkpoints, whoever
// reads them, and every advance only moves checkpoints forward. So the
// turn decides nothing about correctness, only how often the work is done.
// Without it every replica did it after each of its commits: a read of
// every partition's ckpt and a transaction over every flow, N replicas
// times a second, each advance retrying on the others'. With it, one
// member does it per TTL, the others read the one global value.
func (k Keys) AdvanceTurn() string { return k.base + "advance:turn" }

// TakeAdvanceTurn reports whether member may advance the checkpoint now:
// the turn was free and member took it for ttl, or member holds it
// already. A member that holds it keeps it until it expires, so once it
// does the next committing member takes over: a replica that stops
// holds the turn for ttl at most.
func (s *Store) TakeAdvanceTurn(ctx context.Context, member string, ttl time.Duration) (bool, error) {
	key := s.keys.AdvanceTurn()
	var took *redis.BoolCmd
	var holder *redis.StringCmd
	// Only the owner key is watched: watching the turn too would make the
	// replicas' takes retry on one another, and SET NX decides between
	// them already.
	err := s.writeGuarded(ctx, "take_advance_turn", func(p redis.Pipeliner) error {
		took = p.SetNX(ctx, key, member, ttl)
		holder = p.Get(ctx, key)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("take the advance turn %s: %w", key, err)
	}
	return took.Val() || holder.Val() == member, nil
}
