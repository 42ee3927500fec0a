package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Truncater runs a truncate's transaction: *meta.Store's Truncate, which
// calls plan on the lists it reads and again whenever they change before
// it commits.
type Truncater interface {
	Truncate(ctx context.Context, id meta.FlowID, snap meta.SnapshotRef, plan meta.TruncatePlan) (meta.TruncateDrop, error)
}

// TruncatePlan is what a truncate of a flow removes: the metas at or below
// a listed snapshot that no later read needs, and the older snapshots.
// PlanTruncate makes it from the lists as they are; Commit makes it again
// inside the transaction, from the lists as they are there.
type TruncatePlan struct {
	Flow     Flow
	Snapshot meta.SnapshotRef // the snapshot the log is truncated at
	// Metas are the metas to remove, Listed how many were listed and Kept
	// how many stay. KeptOld counts, by reason, the metas at or below the
	// snapshot that stay anyway (sink.PlanTruncate).
	Metas   []sink.MetaSummary
	Listed  int
	Kept    int
	KeptOld map[string]int
	// Snapshots are the listed snapshots older than Snapshot, to remove.
	Snapshots []meta.SnapshotRef

	src      Source
	cache    *metaCache
	parallel int
	keptData map[string]bool // data objects of the metas that stay
}

// PlanTruncate plans the truncate of f's log before the newest listed
// snapshot at or below until, reading up to parallel metas at once. It
// fails with a *NoSnapshotError if there is none, a *TruncatedPastError if
// the log is truncated past it already, and an *IncompleteSnapshotError if
// the snapshot does not hold every table whose window holds its ts: only
// then is a restore at or above it whole without the log before it.
func PlanTruncate(ctx context.Context, src Source, f Flow, until uint64, parallel int) (*TruncatePlan, error) {
	snaps, err := src.Store.Snapshots(ctx, f.ID)
	if err != nil {
		return nil, err
	}
	i := sort.Search(len(snaps), func(i int) bool { return snaps[i].TS > until })
	if i == 0 {
		e := &NoSnapshotError{Flow: f, Until: until}
		if len(snaps) > 0 {
			e.Oldest = snaps[0].TS
		}
		return nil, e
	}
	snap := snaps[i-1]
	if tb, ok, err := src.Store.TruncatedBefore(ctx, f.ID); err != nil {
		return nil, err
	} else if ok && tb > snap.TS {
		return nil, &TruncatedPastError{Flow: f, TruncatedBefore: tb, Snapshot: snap.TS}
	}
	if err := snapshotCovers(ctx, src, f, snap); err != nil {
		return nil, err
	}
	p := &TruncatePlan{Flow: f, Snapshot: snap, src: src, parallel: parallel, cache: &metaCache{m: map[string]sink.MetaSummary{}}}
	metas, err := src.Store.Metas(ctx, f.ID)
	if err != nil {
		return nil, err
	}
	// Listed again: the snapshot list above was read before the checks.
	if snaps, err = src.Store.Snapshots(ctx, f.ID); err != nil {
		return nil, err
	}
	if _, err := p.plan(ctx, metas, snaps); err != nil {
		return nil, err
	}
	return p, nil
}

// plan makes p what a truncate removes from metas and snaps, and returns it
// as the transaction takes it. It is the transaction's meta.TruncatePlan:
// it reads only objects (summaries of the metas, which never change,
// cached).
func (p *TruncatePlan) plan(ctx context.Context, metas []meta.MetaRef, snaps []meta.SnapshotRef) (meta.TruncateDrop, error) {
	paths := make([]string, len(metas))
	for i, m := range metas {
		paths[i] = m.Path
	}
	sums, err := p.cache.read(ctx, p.src.Bucket, p.Flow.Sink(p.src.Prefix), paths, p.Snapshot.TS, p.parallel)
	if err != nil {
		return meta.TruncateDrop{}, err
	}
	drop, keptOld := sink.PlanTruncate(sums, p.Snapshot.TS)
	p.Metas, p.Snapshots = nil, nil
	p.Listed, p.Kept, p.KeptOld, p.keptData = len(metas), len(sums)-len(drop), keptOld, map[string]bool{}
	var out meta.TruncateDrop
	dropped := make(map[int]bool, len(drop))
	for _, i := range drop {
		p.Metas = append(p.Metas, sums[i])
		out.Metas = append(out.Metas, sums[i].Path)
		dropped[i] = true
	}
	for i, m := range sums {
		if !dropped[i] {
			p.keptData[m.DataPath] = true // never deleted, even if a dropped meta names it too
		}
	}
	for _, s := range snaps {
		if s.TS < p.Snapshot.TS {
			p.Snapshots = append(p.Snapshots, s)
			out.Snapshots = append(out.Snapshots, s.Path)
		}
	}
	return out, nil
}

// Objects returns the objects a truncate by p deletes once its transaction
// removed their references, and warnings for what it leaves to gc. They are
// only objects no other flow can reference:
//
//   - of each layout v1 meta removed, the meta and its data object (unless
//     a meta that stays names it too). A layout v2 meta and its data object
//     serve every flow of their cycle: they stay, and gc deletes them once
//     no flow lists the meta;
//   - of each snapshot removed, the objects its snapshot.meta names, read
//     and checked as restore reads it (sink.ReadSnapshotMeta: the flow's
//     snapshot at its ts, every object in the snapshot's directory), and
//     the snapshot.meta itself. A snapshot.meta that fails the check is
//     named in a warning and none of its objects is deleted.
//
// A dry run prints exactly this list, and the run deletes exactly the part
// of it its transaction unreferenced.
func (p *TruncatePlan) Objects(ctx context.Context) ([]sink.GCObject, []string) {
	flow := p.Flow.String()
	var objs []sink.GCObject
	var warnings []string
	for _, m := range p.Metas {
		if m.Version != sink.MetaVersion {
			continue
		}
		objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: m.Path, Size: m.Size}, Flow: flow, Kind: sink.GCMeta})
		if m.DataPath != "" && !p.keptData[m.DataPath] {
			objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: m.DataPath, Size: m.DataSize}, Flow: flow, Kind: sink.GCData})
		}
	}
	for _, s := range p.Snapshots {
		sm, err := sink.ReadSnapshotMeta(ctx, p.src.Bucket, p.Flow.Sink(p.src.Prefix), sink.SnapshotRef{TS: s.TS, Path: s.Path})
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("snapshot %s: %v (its objects are left to gc)", s.Path, err))
			continue
		}
		for _, t := range sm.Tables {
			var n int64
			if len(t.Chunks) > 0 {
				last := t.Chunks[len(t.Chunks)-1]
				n = last.Offset + last.Length
			}
			objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: t.DataPath, Size: n}, Flow: flow, Kind: sink.GCSnapshot})
		}
		// The snapshot.meta's own size, which no reference records.
		size, err := p.src.Bucket.Size(ctx, s.Path)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("snapshot %s: size: %v", s.Path, err))
		}
		objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: s.Path, Size: size}, Flow: flow, Kind: sink.GCSnapshot})
	}
	return objs, warnings
}

// Tables returns the ids of the tables whose log p removes, sorted.
func (p *TruncatePlan) Tables() []int64 {
	var out []int64
	for _, m := range p.Metas {
		out = append(out, m.Tables...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Committed is what a truncate's transaction removed from Redis.
type Committed struct {
	Removed meta.TruncateDrop
	// Objects are the objects of what was removed: nothing references them
	// any more, so they are to be deleted (sink.DeleteObjects); a crash
	// before that leaves them to gc.
	Objects []sink.GCObject
}

// Commit runs the truncate's transaction with t: it plans again on the
// lists the transaction reads (p becomes that plan), then removes the metas
// and older snapshots and records the truncation point in one MULTI. It
// fails with a *TruncatedPastError if another truncate went past the
// snapshot first.
func (p *TruncatePlan) Commit(ctx context.Context, t Truncater) (Committed, error) {
	done, err := t.Truncate(ctx, p.Flow.ID, p.Snapshot, p.plan)
	if err != nil {
		if errors.Is(err, meta.ErrTruncatedPast) {
			tb, _, _ := p.src.Store.TruncatedBefore(ctx, p.Flow.ID)
			return Committed{}, &TruncatedPastError{Flow: p.Flow, TruncatedBefore: tb, Snapshot: p.Snapshot.TS}
		}
		return Committed{}, err
	}
	objs, _ := p.Objects(ctx)
	isRemoved := p.removedBy(done)
	objs = slices.DeleteFunc(objs, func(o sink.GCObject) bool { return !isRemoved(o) })
	return Committed{Removed: done, Objects: objs}, nil
}

// removedBy returns whether an object of p belongs to a meta or snapshot
// that done removed from Redis.
func (p *TruncatePlan) removedBy(done meta.TruncateDrop) func(sink.GCObject) bool {
	gone := make(map[string]bool, len(done.Metas))
	for _, m := range done.Metas {
		gone[m] = true
	}
	owner := make(map[string]string, 2*len(p.Metas)) // object -> its meta
	for _, m := range p.Metas {
		owner[m.Path] = m.Path
		owner[m.DataPath] = m.Path
	}
	return func(o sink.GCObject) bool {
		if m, ok := owner[o.Name]; ok {
			return gone[m]
		}
		for _, s := range done.Snapshots {
			if strings.HasPrefix(o.Name, strings.TrimSuffix(s, "snapshot.meta")) {
				return true
			}
		}
		return false
	}
}

// snapshotCovers checks that snap holds every table whose coverage window
// holds its ts, cut from that window: only then is a restore at or above
// the ts whole without the log before it. A table being removed whose open
// window holds the ts counts too (its window may well end past the ts).
func snapshotCovers(ctx context.Context, src Source, f Flow, snap meta.SnapshotRef) error {
	sm, err := sink.ReadSnapshotMeta(ctx, src.Bucket, f.Sink(src.Prefix), sink.SnapshotRef{TS: snap.TS, Path: snap.Path})
	if err != nil {
		return fmt.Errorf("snapshot at %d: %w", snap.TS, err)
	}
	windows, err := Windows(ctx, src.Store, f.ID)
	if err != nil {
		return err
	}
	var missing []meta.Window
	for _, w := range windows {
		if !w.Holds(snap.TS) {
			continue
		}
		i := slices.IndexFunc(sm.Tables, func(t sink.SnapshotTable) bool { return t.TableID == int64(w.TableID) && t.Since == w.Since })
		if i < 0 {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		return &IncompleteSnapshotError{Snapshot: snap.TS, Missing: missing}
	}
	return nil
}

// metaCache keeps the summaries of the metas read by earlier attempts of
// the truncate transaction: meta objects never change.
type metaCache struct {
	mu sync.Mutex
	m  map[string]sink.MetaSummary
}

func (c *metaCache) read(ctx context.Context, b sink.Bucket, flow sink.Flow, paths []string, ts uint64, parallel int) ([]sink.MetaSummary, error) {
	c.mu.Lock()
	var missing []string
	for _, p := range paths {
		if _, ok := c.m[p]; !ok {
			missing = append(missing, p)
		}
	}
	c.mu.Unlock()
	got, err := sink.ReadMetaSummaries(ctx, b, flow, missing, ts, parallel)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range got {
		c.m[m.Path] = m
	}
	out := make([]sink.MetaSummary, len(paths))
	for i, p := range paths {
		out[i] = c.m[p]
	}
	return out, nil
}
