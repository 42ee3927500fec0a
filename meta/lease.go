package meta

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Lease is one consumer's hold on an apply partition: the lease:<topic>:<p>
// hash names the member and the epoch it took the lease at. Epochs only
// grow, so a lease taken later always has a larger epoch than any before it.
type Lease struct {
	Topic     string
	Partition int32
	Member    string
	Epoch     int64
}

// ErrLeaseLost matches every *LeaseLostError with errors.Is: a commit was
// refused because another member took one of its partitions.
var ErrLeaseLost = errors.New("meta: lease lost")

// LeaseLostError reports the lease a commit held and who holds the partition
// now (HolderMember "" when nobody does).
type LeaseLostError struct {
	Lease        Lease
	HolderMember string
	HolderEpoch  int64
}

// Error names the partition, the lease held and the current holder.
func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("meta: lease lost on %s/%d: held by member %q epoch %d, now member %q epoch %d",
		e.Lease.Topic, e.Lease.Partition, e.Lease.Member, e.Lease.Epoch, e.HolderMember, e.HolderEpoch)
}

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// AcquireLease takes the lease of an apply partition for member, in one
// MULTI that increments the epoch and sets the member, and returns it. Any
// earlier holder's next Commit fails with a *LeaseLostError. Taking a lease
// never fails because of another holder: the consumer group decides who owns
// a partition, the lease only fences the previous owner's commits.
//
// A store that claimed the prefix (ClaimOwner) takes the lease only while
// the owner key names its group (*OwnerLostError otherwise), so a consumer
// of a flushed Redis does not start partitions over from nothing.
func (s *Store) AcquireLease(ctx context.Context, topic string, partition int32, member string) (Lease, error) {
	key := s.keys.Lease(topic, partition)
	var epoch *redis.IntCmd
	take := func(p redis.Pipeliner) error {
		epoch = p.HIncrBy(ctx, key, "epoch", 1)
		p.HSet(ctx, key, "member", member)
		return nil
	}
	err := s.writeGuarded(ctx, "acquire_lease", take)
	if err != nil {
		return Lease{}, fmt.Errorf("acquire lease %s/%d: %w", topic, partition, err)
	}
	return Lease{Topic: topic, Partition: partition, Member: member, Epoch: epoch.Val()}, nil
}

// LeaseHolder returns the current holder of an apply partition's lease, and
// false if no member holds it. The epoch is set even when no member does
// (after a release).
func (s *Store) LeaseHolder(ctx context.Context, topic string, partition int32) (Lease, bool, error) {
	member, epoch, err := readLease(ctx, s.rdb, s.keys.Lease(topic, partition))
	if err != nil {
		return Lease{}, false, err
	}
	return Lease{Topic: topic, Partition: partition, Member: member, Epoch: epoch}, member != "", nil
}

// ReleaseLease gives up l if it is still the current lease: the member is
// removed and the epoch kept, so later leases still get larger epochs.
// Releasing a lease that was taken over is a no-op.
func (s *Store) ReleaseLease(ctx context.Context, l Lease) error {
	key := s.keys.Lease(l.Topic, l.Partition)
	err := s.txn(ctx, "release_lease", []string{key}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		member, epoch, err := readLease(ctx, tx, key)
		if err != nil {
			return nil, err
		}
		if member != l.Member || epoch != l.Epoch {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			p.HDel(ctx, key, "member")
			return nil
		}, nil
	})
	if err != nil {
		return fmt.Errorf("release lease %s/%d: %w", l.Topic, l.Partition, err)
	}
	return nil
}

// readLease reads a lease hash; absent fields read as "" and 0.
func readLease(ctx context.Context, c redis.Cmdable, key string) (string, int64, error) {
	return parseLease(key, c.HMGet(ctx, key, "member", "epoch"))
}

// parseLease is the member and epoch an HMGET of a lease hash's member and
// epoch read; absent fields read as "" and 0.
func parseLease(key string, cmd *redis.SliceCmd) (string, int64, error) {
	vals, err := cmd.Result()
	if err != nil {
		return "", 0, fmt.Errorf("hmget %s: %w", key, err)
	}
	member, _ := vals[0].(string)
	var epoch int64
	if s, ok := vals[1].(string); ok {
		if epoch, err = strconv.ParseInt(s, 10, 64); err != nil {
			return "", 0, fmt.Errorf("parse %s epoch %q: %w", key, s, err)
		}
	}
	return member, epoch, nil
}
