package meta

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// A flow's checkpoint, as every reader takes it (docs/FORMAT.md,
// "Checkpoint rule", "Effective checkpoint"), is its effective checkpoint:
// for a live flow (flow:info exists) the larger of its own flow:state
// checkpoint_ts and the group's global_checkpoint; for a dropped flow the
// value its drop recorded in catalog:rev:<id>, which is the effective one at
// the drop.
//
// Why the global value holds for every live flow: the global checkpoint is
// the min over the apply partitions of the partition checkpoints, and a
// partition's checkpoint is committed in the same transaction as the offsets
// of the records it covers. A cycle's commit is one transaction for every
// flow it serves, and it is a compare-and-set on each partition's offset, so
// a partition's checkpoint never passes a record of a cycle that did not
// commit: every event at or below the global value, of whatever table, is in
// a committed chunk of each flow that routed it. Which tables a flow routed,
// and since when, is what its coverage windows say ("Coverage rule"); the
// checkpoint itself does not depend on the flow. So layout v2's checkpoint
// advance moves global_checkpoint alone, and a flow's own checkpoint_ts is
// a floor that earlier versions, layout v1 and consumer recover write.
//
// That covers each state a flow can be in:
//   - created: its tables have no final window until every partition
//     reported, so the global value claims nothing of them before that;
//   - replaced: the windows of the tables it adds or removes say what it
//     routed; a step that removes tables records the effective value at the
//     DDL, as of when every partition still routed them;
//   - fatal: the cycle that failed holds its partitions' checkpoints where
//     the last commit left them, and the replica stops fetching, so the
//     global value cannot pass the data the flow owes; it is the value the
//     advance of earlier versions wrote to a fatal flow's checkpoint_ts too,
//     since that advance moved every flow the registry held;
//   - resumed: only its status changes;
//   - dropped: its data stop at the drop, so it keeps the value recorded
//     then, and never takes a later global value.
//
// A stored checkpoint_ts past the clock plus --max-clock-skew (only a
// version that took any resolved ts could write one) makes the effective
// value lie past it too: readers refuse it, as they refuse such a
// global_checkpoint, and the first checkpoint advance of each consumer
// session replaces it (AdvanceCheckpoints).

// effectiveCheckpoint is the effective checkpoint of a flow whose
// flow:state holds own and whose group's global_checkpoint is global (0:
// none): for a live flow the larger, for a dropped one own, the value its
// drop recorded.
func effectiveCheckpoint(live bool, own, global uint64) uint64 {
	if !live {
		return own
	}
	return max(own, global)
}

// checkpointCmds are the replies of the reads a flow's effective checkpoint
// takes: its checkpoint_ts and the global checkpoint, queued together so
// that one pipeline or MULTI reads both.
type checkpointCmds struct {
	own, global *redis.StringCmd
}

// queueCheckpoint queues on p the reads of flow id's checkpoint_ts and the
// global checkpoint.
func (k Keys) queueCheckpoint(ctx context.Context, p redis.Cmdable, id FlowID) checkpointCmds {
	return checkpointCmds{
		own:    p.HGet(ctx, k.FlowState(id), "checkpoint_ts"),
		global: p.Get(ctx, k.GlobalCheckpoint()),
	}
}

// effective parses the replies and returns the effective checkpoint of
// flow id (live: flow:info exists), 0 if neither value is stored.
func (c checkpointCmds) effective(k Keys, id FlowID, live bool) (uint64, error) {
	own, err := parseU64(k.FlowState(id)+" checkpoint_ts", c.own)
	if err != nil {
		return 0, err
	}
	global, err := parseU64(k.GlobalCheckpoint(), c.global)
	if err != nil {
		return 0, err
	}
	return effectiveCheckpoint(live, own, global), nil
}

// readCheckpoint reads flow id's effective checkpoint inside tx (its reads
// before the MULTI), for a flow the caller knows to be live.
func (s *Store) readCheckpoint(ctx context.Context, tx *redis.Tx, id FlowID) (uint64, error) {
	var c checkpointCmds
	if _, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		c = s.keys.queueCheckpoint(ctx, p, id)
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("read checkpoint of flow %d: %w", id, err)
	}
	return c.effective(s.keys, id, true)
}
