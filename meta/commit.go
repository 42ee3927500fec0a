package meta

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// PartitionCommit is what a flush cycle commits for one apply partition.
type PartitionCommit struct {
	Topic      string
	Partition  int32
	NextOffset int64 // offset:<topic>:<partition>
	// Checkpoint is the min resolved ts of the partition's live regions,
	// written to ckpt:<topic>:<partition> when HasCheckpoint is set.
	Checkpoint    uint64
	HasCheckpoint bool
	// Idle marks a partition whose regions have all dropped out (silent
	// for --region-ttl): ckpt:<topic>:<partition> becomes CkptIdle and the
	// partition is left out of the global checkpoint until a region of it
	// speaks again (docs/FORMAT.md, "Checkpoint rule"). Ignored when
	// HasCheckpoint is set.
	Idle bool
	// MaxTS, when not 0, is written to maxts:<topic>:<partition>: the
	// highest commit ts of the partition's records below NextOffset.
	MaxTS uint64
	// Regions, when not nil, replaces regions:<topic>:<partition>: the last
	// resolved ts of every live region of the partition, so that the next
	// owner's checkpoint also waits for regions it has not heard from yet.
	Regions map[uint64]uint64
	// CheckFrom makes the commit a compare-and-set on the offset: it is
	// refused as fenced (*OffsetMovedError) unless
	// offset:<topic>:<partition> holds From, the offset the cycle's range
	// starts at (the replica's last commit, or what it read on
	// assignment), or is absent where From is -1 (the partition started
	// from Kafka's committed offset or --start-offset). A stored value
	// equal to NextOffset passes too: this commit went through before
	// (a retry after a lost EXEC reply). The consumer always sets it.
	CheckFrom bool
	From      int64
}

// MetaRef is one committed meta object of a flow, a member of
// metas:<flow_id>.
type MetaRef struct {
	FlowID FlowID
	Path   string // full object name of the meta JSON
	// MinResolvedTS is the meta's min_resolved_ts. It is stored as the
	// sorted set score, a float64, so values past 2^53 (every real TSO) come
	// back rounded: order by score then path, and take exact values from
	// the meta object itself.
	MinResolvedTS uint64
}

// Commit is one flush cycle's commit (docs/FORMAT.md, "Commit protocol").
type Commit struct {
	// Leases are the leases the committing member holds; every one is
	// checked. Each PartitionCommit must have its lease here.
	Leases     []Lease
	Partitions []PartitionCommit
	Metas      []MetaRef
	// Coverage are partition reports for pending coverage entries; each
	// partition's lease must be in Leases. A report already made for the
	// same entry and partition is kept (first wins).
	Coverage []CoverageReport
	// LastFlushTS is written as last_flush_ts (the LastFlush hash) of
	// every flow of Flows that still exists (a dropped flow's state is not
	// recreated).
	LastFlushTS uint64
	Flows       []FlowID
}

// Commit makes a flush cycle durable, or refuses it entirely.
//
// Why a zombie cannot commit: the commit is one transaction that WATCHes
// every lease key of c.Leases, reads them, and returns a *LeaseLostError
// (writing nothing) if any is no longer held by the same member at the same
// epoch. It also WATCHes and compares each partition's offset key
// (PartitionCommit.CheckFrom): a commit whose offsets Redis no longer holds
// as this replica left them (lost writes) is fenced the same way
// (*OffsetMovedError), so it can never skip the records in between. AcquireLease by a new owner changes the lease hash, so it either
// happens before the read (the check fails) or between the read and EXEC
// (the EXEC fails, the retry reads the new lease and the check fails). The
// offsets, checkpoints, manifest entries and flow states are queued in the
// same MULTI, so either all of a cycle is committed or none of it, and its
// objects stay unreferenced.
//
// A store that claimed the prefix (ClaimOwner) also WATCHes the owner key
// and reads it in the same round trip as the leases: a Redis that lost its
// state (FLUSHALL) refuses the commit with an *OwnerLostError instead of
// taking offsets and metas as if the prefix were new.
//
// Which of c.Flows still exist is read from the flows set, WATCHed as one
// key whatever the number of flows: a create, a drop and recover write it
// in the MULTI that writes or deletes flow:info, so membership is
// existence, and a replace (SADD of a member already there) leaves it
// untouched, so the DDLs that change no flow's existence make no commit in
// flight retry (docs/FORMAT.md, "The commit transaction").
//
// Metas are added even for flows that were dropped meanwhile: a dropped
// flow's backup stays restorable by id. ZADD of a path already listed only
// rewrites its score, so a retried commit does not list a meta twice.
func (s *Store) Commit(ctx context.Context, c Commit) error {
	k := s.keys
	held := make(map[string]Lease, len(c.Leases))
	watch := make([]string, 0, len(c.Leases)+len(c.Flows))
	for _, l := range c.Leases {
		key := k.Lease(l.Topic, l.Partition)
		held[key] = l
		watch = append(watch, key)
	}
	for _, p := range c.Partitions {
		if _, ok := held[k.Lease(p.Topic, p.Partition)]; !ok {
			return fmt.Errorf("commit: partition %s/%d has no lease in the commit", p.Topic, p.Partition)
		}
	}
	for _, r := range c.Coverage {
		if _, ok := held[k.Lease(r.Topic, r.Partition)]; !ok {
			return fmt.Errorf("commit: coverage report of partition %s/%d has no lease in the commit", r.Topic, r.Partition)
		}
	}
	for _, p := range c.Partitions {
		if p.CheckFrom {
			watch = append(watch, k.Offset(p.Topic, p.Partition))
		}
	}
	if len(c.Flows) > 0 {
		watch = append(watch, k.Flows())
	}
	watch = s.guardKeys(watch...)
	err := s.txn(ctx, "commit", watch, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		live, err := s.commitReads(ctx, tx, &c)
		if err != nil {
			return nil, err
		}
		return func(p redis.Pipeliner) error {
			for _, pc := range c.Partitions {
				queuePartition(ctx, p, k, pc)
			}
			for _, r := range c.Coverage {
				queueReport(ctx, p, k, r)
			}
			for _, m := range c.Metas {
				p.ZAdd(ctx, k.Metas(m.FlowID), redis.Z{Score: float64(m.MinResolvedTS), Member: m.Path})
			}
			queueLastFlush(ctx, p, k, live, c.LastFlushTS)
			return nil
		}, nil
	})
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// queuePartition queues what a commit writes for one partition.
func queuePartition(ctx context.Context, p redis.Pipeliner, k Keys, pc PartitionCommit) {
	p.Set(ctx, k.Offset(pc.Topic, pc.Partition), strconv.FormatInt(pc.NextOffset, 10), 0)
	if pc.MaxTS > 0 {
		p.Set(ctx, k.MaxTS(pc.Topic, pc.Partition), u64(pc.MaxTS), 0)
	}
	switch {
	case pc.HasCheckpoint:
		p.Set(ctx, k.Ckpt(pc.Topic, pc.Partition), u64(pc.Checkpoint), 0)
	case pc.Idle:
		p.Set(ctx, k.Ckpt(pc.Topic, pc.Partition), CkptIdle, 0)
	}
	if pc.Regions != nil {
		rk := k.Regions(pc.Topic, pc.Partition)
		p.Del(ctx, rk)
		if len(pc.Regions) > 0 {
			vals := make([]any, 0, 2*len(pc.Regions))
			for r, ts := range pc.Regions {
				vals = append(vals, u64(r), u64(ts))
			}
			p.HSet(ctx, rk, vals...)
		}
	}
}

// queueReport queues a coverage report (first report wins).
func queueReport(ctx context.Context, p redis.Pipeliner, k Keys, r CoverageReport) {
	p.HSetNX(ctx, k.CoverageParts(r.FlowID), partField(r.Seq, r.Topic, r.Partition), r.value())
}

// OffsetMovedError reports a commit refused because a partition's stored
// offset is not where the cycle started: Redis lost acknowledged writes (an
// unsynced AOF tail, a failover to a lagging replica) or someone else wrote
// it. Committing would skip or repeat records, so the commit is fenced:
// errors.Is(err, ErrLeaseLost) is true, the session ends, and the partition
// is read again from the stored offset.
type OffsetMovedError struct {
	Topic     string
	Partition int32
	From      int64 // where the cycle started; -1: absent
	Stored    int64 // offset:<topic>:<partition> now; -1: absent
}

// Error names the partition and both offsets.
func (e *OffsetMovedError) Error() string {
	str := func(o int64) string {
		if o < 0 {
			return "<absent>"
		}
		return strconv.FormatInt(o, 10)
	}
	return fmt.Sprintf("meta: offset of %s/%d moved under the commit: the cycle started at %s, Redis holds %s (lost writes?)",
		e.Topic, e.Partition, str(e.From), str(e.Stored))
}

// Is makes errors.Is(err, ErrLeaseLost) true: the commit is fenced.
func (e *OffsetMovedError) Is(target error) bool { return target == ErrLeaseLost }

// Offset returns the committed next offset of an apply partition, and false
// if none was committed.
func (s *Store) Offset(ctx context.Context, topic string, partition int32) (int64, bool, error) {
	return getOffset(ctx, s.rdb, s.keys.Offset(topic, partition))
}

// CkptIdle is the value of ckpt:<topic>:<partition> while every region of
// the partition has dropped out: it holds the checkpoint at nothing.
const CkptIdle = "idle"

// PartitionCheckpoints returns the committed checkpoint of each of
// partitions that has one, and the partitions whose ckpt is CkptIdle (left
// out of the global checkpoint); partitions with neither are in neither
// map.
func (s *Store) PartitionCheckpoints(ctx context.Context, topic string, partitions []int32) (map[int32]uint64, map[int32]bool, error) {
	out := make(map[int32]uint64, len(partitions))
	idle := map[int32]bool{}
	if len(partitions) == 0 {
		return out, idle, nil
	}
	keys := make([]string, len(partitions))
	for i, p := range partitions {
		keys[i] = s.keys.Ckpt(topic, p)
	}
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("mget checkpoints of %s: %w", topic, err)
	}
	for i, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue
		}
		if str == CkptIdle {
			idle[partitions[i]] = true
			continue
		}
		ts, err := strconv.ParseUint(str, 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("parse %s = %q: %w", keys[i], str, err)
		}
		out[partitions[i]] = ts
	}
	return out, idle, nil
}

// Metas returns the committed meta objects of flow id, ordered by
// min_resolved_ts (as the float64 score) then path. MinResolvedTS is the
// rounded score; see MetaRef.
func (s *Store) Metas(ctx context.Context, id FlowID) ([]MetaRef, error) {
	return metasOf(ctx, s.rdb, s.keys.Metas(id), id)
}
