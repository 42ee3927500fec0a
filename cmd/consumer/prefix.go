package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/rebuild"
	"github.com/flowlog/flowlog/sink"
)

// claimPrefix records group as the owner of the Redis prefix, or refuses to
// start when another group owns it (docs/FORMAT.md, "Commit protocol"): two
// groups under one prefix would both commit offsets and metas of the same
// partitions. It also refuses an empty Redis (no owner key) over a bucket
// prefix that already holds a backup: Redis lost its state (or is not the
// backup's), and starting would take flow ids, offsets and coverage over
// from nothing; `consumer recover` rebuilds it first (docs/OPERATING.md,
// "Losing Redis").
func claimPrefix(ctx context.Context, store *meta.Store, bucket sink.Bucket, c connConfig) error {
	prefix, group := c.Redis.Prefix, c.Group
	_, owned, err := store.OwnerOf(ctx)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if !owned {
		name, err := rebuild.FindBackup(ctx, bucket, c.GCS.Prefix)
		if err != nil {
			return fmt.Errorf("gcs: looking for an existing backup: %w", err)
		}
		if name != "" {
			return fmt.Errorf("%w: Redis holds no state under --redis-prefix %q, but the bucket holds a backup under --gcs-prefix %q (%s): "+
				"run `consumer recover` to rebuild Redis from the bucket, then start again (docs/OPERATING.md, \"Losing Redis\")",
				errRedisLost, prefix, c.GCS.Prefix, name)
		}
	}
	err = store.ClaimOwner(ctx, group)
	var oe *meta.OwnerError
	switch {
	case errors.As(err, &oe):
		return ownerRefusal(prefix, oe.Owner, oe.Group)
	case err != nil:
		return fmt.Errorf("redis: %w", err)
	}
	return nil
}

// checkPrefixOwner refuses a Redis prefix that another consumer group
// owns, before the bucket or Kafka is used (claimPrefix checks it again
// as it claims).
func checkPrefixOwner(ctx context.Context, store *meta.Store, c connConfig) error {
	owner, owned, err := store.OwnerOf(ctx)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if owned && owner != c.Group {
		return ownerRefusal(c.Redis.Prefix, owner, c.Group)
	}
	return nil
}

// ownerRefusal is the error of a run whose --redis-prefix owner, another
// consumer group, is not its --group.
func ownerRefusal(prefix, owner, group string) error {
	return fmt.Errorf("--redis-prefix %q belongs to consumer group %q, not --group %q: use --group %s or another --redis-prefix",
		prefix, owner, group, owner)
}

// errRedisLost starts the refusal of a run whose Redis lost the backup's
// state.
var errRedisLost = errors.New("refusing to start")

// refuseLostState refuses an operator command that deletes by what Redis
// references (gc) when Redis holds no key at all under the prefix while
// the bucket holds a backup: Redis lost its state, and every object would
// look unreferenced. `consumer recover` rebuilds it first.
func refuseLostState(ctx context.Context, st *meta.Store, bucket sink.Bucket, c connConfig) error {
	// The owner key is there whenever a consumer ran under the prefix: one
	// GET, and no SCAN of a shared Redis.
	_, owned, err := st.OwnerOf(ctx)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if owned {
		return nil
	}
	n, _, err := st.PrefixKeys(ctx, 1)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	if n > 0 {
		return nil
	}
	name, err := rebuild.FindBackup(ctx, bucket, c.GCS.Prefix)
	if err != nil {
		return fmt.Errorf("gcs: looking for an existing backup: %w", err)
	}
	if name == "" {
		return nil
	}
	return fmt.Errorf("%w: Redis holds no key under --redis-prefix %q, but the bucket holds a backup under --gcs-prefix %q (%s), "+
		"which would all look unreferenced: run `consumer recover` to rebuild Redis from the bucket first (docs/OPERATING.md, \"Losing Redis\")",
		errRedisLost, c.Redis.Prefix, c.GCS.Prefix, name)
}
