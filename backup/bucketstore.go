package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// BucketStore is a Store that reads the bucket alone, no Redis at all
// (--from-bucket; docs/RESTORE.md, "Restoring without Redis"): a flow's
// definition, coverage windows, pending entries, snapshots and truncation
// point come from its catalog, the newest revision of its flow id; its
// checkpoint from the consumer group's global checkpoint object; its metas
// from a listing of the group's v2 metas that serve it and of its v1 metas.
//
// Every call reads the bucket afresh, so the order in which the read side
// calls a Store is the order in which the bucket is read, and that order is
// what makes the answer right, as with Redis: the checkpoint object is
// written only after every catalog that changed before it (a catalog is
// never older than the checkpoint read before it), and truncate and gc
// write a flow's catalog before they delete any object (a listing that
// misses a deleted meta is followed by a catalog read that knows why).
type BucketStore struct {
	Bucket sink.Bucket
	Prefix string // the bucket prefix (--gcs-prefix)
	Group  string // the consumer group whose objects are read
	// Parallel is how many metas are read at once while listing (default 8).
	Parallel int

	mu    sync.Mutex
	names map[meta.FlowID][2]string // catalog and name of the flow ids met
}

func (s *BucketStore) parallel() int {
	if s.Parallel <= 0 {
		return 8
	}
	return s.Parallel
}

// FlowIDByName implements Store: the flow id under catalog/name whose newest
// catalog is not a dropped flow's.
func (s *BucketStore) FlowIDByName(ctx context.Context, catalog, name string) (meta.FlowID, bool, error) {
	cats, err := sink.NewestCatalogs(ctx, s.Bucket, s.Prefix, s.Group, catalog, name)
	if err != nil {
		return 0, false, err
	}
	var live []uint32
	for id, c := range cats {
		s.remember(meta.FlowID(id), catalog, name)
		if !c.Catalog.Dropped {
			live = append(live, id)
		}
	}
	if len(live) == 0 {
		return 0, false, nil
	}
	// Only one flow of a name lives at a time; should catalogs say
	// otherwise, the newest id is the one created last.
	return meta.FlowID(slices.Max(live)), true, nil
}

func (s *BucketStore) remember(id meta.FlowID, catalog, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names == nil {
		s.names = map[meta.FlowID][2]string{}
	}
	s.names[id] = [2]string{catalog, name}
}

// catalog returns flow id's newest catalog, and false if the bucket has
// none. The flow's name comes from an earlier lookup, else from the bucket
// (sink.FindFlowName).
func (s *BucketStore) catalog(ctx context.Context, id meta.FlowID) (sink.Catalog, bool, error) {
	s.mu.Lock()
	n, ok := s.names[id]
	s.mu.Unlock()
	if !ok {
		cat, name, err := sink.FindFlowName(ctx, s.Bucket, s.Prefix, s.Group, uint32(id), s.parallel())
		if errors.Is(err, sink.ErrNotExist) {
			return sink.Catalog{}, false, nil
		}
		if err != nil {
			return sink.Catalog{}, false, err
		}
		s.remember(id, cat, name)
		n = [2]string{cat, name}
	}
	cats, err := sink.NewestCatalogs(ctx, s.Bucket, s.Prefix, s.Group, n[0], n[1])
	if err != nil {
		return sink.Catalog{}, false, err
	}
	c, ok := cats[uint32(id)]
	return c.Catalog, ok, nil
}

// mustCatalog is catalog for a flow that must have one.
func (s *BucketStore) mustCatalog(ctx context.Context, id meta.FlowID) (sink.Catalog, error) {
	c, ok, err := s.catalog(ctx, id)
	if err == nil && !ok {
		err = fmt.Errorf("flow id %d: the bucket holds no catalog of group %q for it: %w", id, s.Group, ErrNoCatalog)
	}
	return c, err
}

// ErrNoCatalog is a flow the bucket has no catalog of: without one, nothing
// says which of its events are complete, so it cannot be read without
// Redis. A consumer of layout v2 writes every flow's catalog, those of
// flows backed up in layout v1 included, once it has started.
var ErrNoCatalog = errors.New("no catalog")

// FlowInfo implements Store.
func (s *BucketStore) FlowInfo(ctx context.Context, id meta.FlowID) (meta.FlowInfo, bool, error) {
	c, ok, err := s.catalog(ctx, id)
	if err != nil || !ok || c.Dropped {
		return meta.FlowInfo{}, false, err
	}
	var info meta.FlowInfo
	if err := json.Unmarshal(c.Info, &info); err != nil {
		return meta.FlowInfo{}, false, fmt.Errorf("catalog of flow %d: info: %w", id, err)
	}
	return info, true, nil
}

// FlowState implements Store: the checkpoint is the group's global
// checkpoint object, or, for a flow backed up in layout v1 alone with no
// such object under the prefix, the flow's own v1 checkpoint object.
func (s *BucketStore) FlowState(ctx context.Context, id meta.FlowID) (meta.FlowState, error) {
	ts, err := sink.ReadCheckpoint(ctx, s.Bucket, sink.CheckpointPathV2(s.Prefix, s.Group))
	if errors.Is(err, sink.ErrNotExist) {
		c, cerr := s.mustCatalog(ctx, id)
		if cerr != nil {
			return meta.FlowState{}, cerr
		}
		ts, err = sink.ReadCheckpoint(ctx, s.Bucket, sink.CheckpointPath(s.Prefix, c.Catalog, c.Name, s.Group, id))
	}
	if err != nil {
		return meta.FlowState{}, err
	}
	return meta.FlowState{Status: meta.StatusActive, CheckpointTS: ts}, nil
}

// Metas implements Store: the bucket's metas of the flow, committed or not
// (see the type's comment).
func (s *BucketStore) Metas(ctx context.Context, id meta.FlowID) ([]meta.MetaRef, error) {
	c, err := s.mustCatalog(ctx, id)
	if err != nil {
		return nil, err
	}
	f := sink.Flow{Prefix: s.Prefix, Catalog: c.Catalog, Name: c.Name, ID: uint32(id)}
	ms, err := sink.FlowMetas(ctx, s.Bucket, f, s.Group, s.parallel())
	if err != nil {
		return nil, err
	}
	out := make([]meta.MetaRef, len(ms))
	for i, m := range ms {
		out[i] = meta.MetaRef{FlowID: id, Path: m.Path, MinResolvedTS: m.MinResolvedTS}
	}
	return out, nil
}

// Windows implements Store.
func (s *BucketStore) Windows(ctx context.Context, id meta.FlowID) (map[uint32]meta.Window, []meta.Window, error) {
	c, err := s.mustCatalog(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	cur := make(map[uint32]meta.Window, len(c.Windows))
	for _, w := range c.Windows {
		cur[w.TableID] = meta.Window{TableID: w.TableID, Since: w.Since, Until: w.Until}
	}
	hist := make([]meta.Window, 0, len(c.History))
	for _, w := range c.History {
		hist = append(hist, meta.Window{TableID: w.TableID, Since: w.Since, Until: w.Until})
	}
	return cur, hist, nil
}

// PendingAdded implements Store: the tables the pending steps of the
// flow's catalog add.
func (s *BucketStore) PendingAdded(ctx context.Context, id meta.FlowID) (map[uint32]bool, error) {
	c, err := s.mustCatalog(ctx, id)
	if err != nil {
		return nil, err
	}
	out := map[uint32]bool{}
	for _, p := range c.Pending {
		for _, t := range p.Added {
			out[t] = true
		}
	}
	return out, nil
}

// PendingRemoved implements Store: the tables the pending steps of the
// flow's catalog remove, each with the smallest checkpoint of those steps.
func (s *BucketStore) PendingRemoved(ctx context.Context, id meta.FlowID) (map[uint32]uint64, error) {
	c, err := s.mustCatalog(ctx, id)
	if err != nil {
		return nil, err
	}
	out := map[uint32]uint64{}
	for _, p := range c.Pending {
		for _, t := range p.Removed {
			if ck, ok := out[t]; !ok || p.Ckpt < ck {
				out[t] = p.Ckpt
			}
		}
	}
	return out, nil
}

// Snapshots implements Store.
func (s *BucketStore) Snapshots(ctx context.Context, id meta.FlowID) ([]meta.SnapshotRef, error) {
	c, err := s.mustCatalog(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]meta.SnapshotRef, len(c.Snapshots))
	for i, sn := range c.Snapshots {
		out[i] = meta.SnapshotRef{FlowID: id, TS: sn.TS, Path: sn.Path}
	}
	return out, nil
}

// TruncatedBefore implements Store.
func (s *BucketStore) TruncatedBefore(ctx context.Context, id meta.FlowID) (uint64, bool, error) {
	c, err := s.mustCatalog(ctx, id)
	if err != nil {
		return 0, false, err
	}
	return c.TruncatedBefore, c.TruncatedBefore > 0, nil
}

var _ Store = (*BucketStore)(nil)

// FlowIDs lists every flow id the bucket holds a catalog of.
func (s *BucketStore) FlowIDs(ctx context.Context) ([]meta.FlowID, error) {
	ids, err := sink.CatalogFlowIDs(ctx, s.Bucket, s.Prefix, s.Group)
	if err != nil {
		return nil, err
	}
	out := make([]meta.FlowID, len(ids))
	for i, id := range ids {
		out[i] = meta.FlowID(id)
	}
	return out, nil
}
