package backup

import (
	"context"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Store is what the read side reads of a flow's metadata: *meta.Store, in
// Redis, implements it. Every method only reads. A store that finds the same
// facts in the bucket alone may implement it too; what each method must
// return is stated on it.
type Store interface {
	// FlowIDByName returns the id of the live flow catalog/name, and false
	// if there is none.
	FlowIDByName(ctx context.Context, catalog, name string) (meta.FlowID, bool, error)
	// FlowInfo returns a live flow's definition, and false once it is
	// dropped.
	FlowInfo(ctx context.Context, id meta.FlowID) (meta.FlowInfo, bool, error)
	// FlowState returns a live flow's state; its CheckpointTS is the flow's
	// checkpoint (in Redis its effective checkpoint, docs/FORMAT.md,
	// "Effective checkpoint").
	FlowState(ctx context.Context, id meta.FlowID) (meta.FlowState, error)
	// Metas returns the flow's committed metas in resolved-ts order. The
	// list only grows, but for a truncate, which removes metas at or below
	// a snapshot and records the truncation point in the same transaction.
	Metas(ctx context.Context, id meta.FlowID) ([]meta.MetaRef, error)
	// Windows returns the flow's coverage windows: the current one per
	// table and the older ones, oldest first.
	Windows(ctx context.Context, id meta.FlowID) (map[uint32]meta.Window, []meta.Window, error)
	// PendingAdded returns the tables whose coverage window the flow's
	// pending steps are still establishing; it only explains why a table
	// is left out, so a store without them returns none.
	PendingAdded(ctx context.Context, id meta.FlowID) (map[uint32]bool, error)
	// PendingRemoved returns, for each table a pending step of the flow
	// removes, the flow's checkpoint when the first such step was applied
	// (meta.Store.PendingRemoved): the table's open window is complete
	// only up to it until the step is final.
	PendingRemoved(ctx context.Context, id meta.FlowID) (map[uint32]uint64, error)
	// Snapshots returns the flow's listed snapshots, oldest first.
	Snapshots(ctx context.Context, id meta.FlowID) ([]meta.SnapshotRef, error)
	// TruncatedBefore returns the flow's truncation point, and false if its
	// log was never truncated.
	TruncatedBefore(ctx context.Context, id meta.FlowID) (uint64, bool, error)
}

// Source is a backup as the read side finds it: the metadata, the bucket,
// and the names that place a flow's objects in the bucket.
type Source struct {
	Store  Store
	Bucket sink.Bucket
	// Prefix is the bucket prefix the flows' directories lie under.
	Prefix string
	// Group is the consumer group whose global_checkpoint object holds a
	// dropped flow's checkpoint.
	Group string
}

// MetaPaths returns the paths of flow id's committed metas, in resolved-ts
// order.
func MetaPaths(ctx context.Context, st Store, id meta.FlowID) ([]string, error) {
	refs, err := st.Metas(ctx, id)
	if err != nil {
		return nil, err
	}
	paths := make([]string, len(refs))
	for i, m := range refs {
		paths[i] = m.Path
	}
	return paths, nil
}

// SnapshotRefs returns flow id's listed snapshots as the sink takes them.
func SnapshotRefs(ctx context.Context, st Store, id meta.FlowID) ([]sink.SnapshotRef, error) {
	refs, err := st.Snapshots(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]sink.SnapshotRef, 0, len(refs))
	for _, r := range refs {
		out = append(out, sink.SnapshotRef{TS: r.TS, Path: r.Path})
	}
	return out, nil
}
