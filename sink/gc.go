package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Garbage collection (docs/FORMAT.md, "Garbage collection rule"): delete
// the objects under the prefix that
// no listed meta or snapshot references.
//
// Why it never deletes an object a restore needs: PlanGC lists the objects
// first and only then reads the references, through GCOptions.Refs. Metas
// and snapshots are listed in Redis only after their objects are uploaded,
// so an object listed before the references were read is either referenced
// in that read or was not referenced when it was read. It becomes referenced
// later only if its cycle (or snapshot) commits after the read, and such a
// commit is of objects uploaded before the listing; the grace period keeps
// every object younger than it, and the consumer never commits a cycle
// whose objects are older than its --max-commit-age, which must be shorter
// than the grace (docs/RESTORE.md, "Retention: truncate and gc"). Objects are judged per unit, the
// data and meta object of one cycle or the objects of one snapshot
// directory: a unit is deleted only if none of its objects is referenced
// and all are older than the grace, so a cycle or snapshot still being
// uploaded is kept whole. global_checkpoint objects and objects that are not
// flowlog's are never deleted.
//
// Layout v2 (docs/FORMAT.md, "Layout v2"): a cycle's data object and meta
// under v2/ are one unit (V2Unit), shared by the flows the cycle served; it
// is kept while any flow id's metas list its meta, so a truncate of one
// flow never takes what another flow still reads. An unreferenced unit
// whose meta names another consumer group belongs to another deployment
// and is left alone. Catalogs are never rewritten: the newest revision of
// each flow id is kept, older ones are garbage once older than the grace.

// GCRefs are the objects Redis references, read after the listing.
type GCRefs struct {
	Metas     []string // every listed meta path, of every flow id
	Snapshots []string // every listed snapshot.meta path, of every flow id
	// KnownIDs are the flow ids Redis has or had; objects of any other id
	// are left alone (another deployment on the prefix). Nil: no check.
	KnownIDs map[uint32]bool
}

// GCOptions configure PlanGC.
type GCOptions struct {
	Prefix string // the bucket prefix (--gcs-prefix)
	// Group is the consumer group: unreferenced layout v2 units of
	// another group and catalogs another group wrote are left alone. Empty:
	// no check.
	Group    string
	Grace    time.Duration // never delete an object younger than this
	Now      func() time.Time
	Parallel int // metas and snapshot metas read at once
	// Refs reads the references; PlanGC calls it after the listing.
	Refs func(ctx context.Context) (GCRefs, error)
}

// Object kinds in a GC plan.
const (
	GCData     = "data"
	GCMeta     = "meta"
	GCSnapshot = "snapshot"
	GCCatalog  = "catalog"
)

// GCShared is the Flow (and FlowStorage key) of layout v2 objects, which
// belong to the cycles of every flow rather than to one flow directory.
const GCShared = "v2"

// GCObject is one object PlanGC would delete.
type GCObject struct {
	ObjectInfo
	Flow string // catalog/flow of its path, or GCShared
	Kind string // GCData, GCMeta, GCSnapshot or GCCatalog
}

// FlowStorage is a flow directory's bytes (or layout v2's, GCShared) as one
// gc run saw them.
type FlowStorage struct {
	LogBytes      int64 // referenced data and meta objects, and current catalogs
	SnapshotBytes int64 // objects of listed snapshots
	GarbageBytes  int64 // unreferenced objects (deleted or still in their grace)
}

// GCPlan is what one gc run found.
type GCPlan struct {
	ListedObjects int
	ListedBytes   int64
	Delete        []GCObject
	DeleteBytes   int64
	// Young counts unreferenced objects kept because their unit is younger
	// than the grace.
	Young      int
	YoungBytes int64
	// Kept counts objects gc never deletes: global_checkpoint objects and
	// objects that are not in flowlog's layout.
	Kept int
	// Unknown counts objects of flow ids Redis never had and of other
	// consumer groups, left alone.
	Unknown  int
	Storage  map[string]*FlowStorage // by catalog/flow, and GCShared
	Warnings []string
}

// gcEntry is one listed object with what its name says.
type gcEntry struct {
	ObjectInfo
	flow  string // catalog/flow, or GCShared
	kind  string // GCData, GCMeta, GCSnapshot, GCCatalog, or "" (never deleted)
	unit  string // cycle, snapshot directory or catalog
	id    uint32 // flow id the name carries (none in layout v2's)
	v2    bool
	group string // of a catalog
	rev   uint64 // of a catalog
}

// classify names an object by its path under prefix.
func classify(prefix string, o ObjectInfo) gcEntry {
	e := gcEntry{ObjectInfo: o}
	if unit, kind, ok := V2Unit(prefix, o.Name); ok {
		e.flow, e.kind, e.unit, e.v2 = GCShared, kind, "v2/"+unit, true
		return e
	}
	cat, flow, ok := SplitFlowPath(prefix, o.Name)
	if !ok {
		return e
	}
	e.flow = cat + "/" + flow
	dir := FlowDir(prefix, cat, flow) + "/"
	rest := strings.TrimPrefix(o.Name, dir)
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 2 && parts[0] == "backupmeta" && strings.HasSuffix(parts[1], ".meta"):
		if id, cycle, ok := cycleOf(strings.TrimSuffix(parts[1], ".meta")); ok {
			e.kind, e.unit, e.id = GCMeta, dir+"cycle/"+id+"/"+cycle, parseID(id)
		}
	case len(parts) == 3 && len(parts[0]) == 8 && len(parts[1]) == 2 && strings.HasSuffix(parts[2], ".log"):
		if id, cycle, ok := cycleOf(strings.TrimSuffix(parts[2], ".log")); ok {
			e.kind, e.unit, e.id = GCData, dir+"cycle/"+id+"/"+cycle, parseID(id)
		}
	case len(parts) == 3 && parts[0] == "snapshot" && parts[1] != "" && parts[2] != "":
		if _, id, ok := strings.Cut(parts[1], "-"); ok {
			e.kind, e.unit, e.id = GCSnapshot, dir+"snapshot/"+parts[1]+"/", parseID(id)
		}
	case len(parts) == 2 && parts[0] == "catalog":
		if group, id, rev, ok := ParseCatalogName(parts[1]); ok {
			e.kind, e.unit, e.id, e.group, e.rev = GCCatalog, o.Name, id, group, rev
		}
	}
	return e
}

// parseID parses a flow id; one that does not parse is 0, never a flow id.
func parseID(s string) uint32 {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0
	}
	return uint32(n)
}

// cycleOf splits "<ts>-<flow_id>-<cycle_id>" into flow id and cycle id.
func cycleOf(base string) (id, cycle string, ok bool) {
	p := strings.SplitN(base, "-", 3)
	if len(p) != 3 || p[1] == "" || p[2] == "" || strings.Trim(p[0]+p[1], "0123456789") != "" {
		return "", "", false
	}
	return p[1], p[2], true
}

// PlanGC lists the objects under opts.Prefix, then reads the references,
// and returns what a gc run deletes. It deletes nothing.
func PlanGC(ctx context.Context, b Bucket, opts GCOptions) (GCPlan, error) {
	l, ok := b.(Lister)
	if !ok {
		return GCPlan{}, errors.New("gc: the bucket cannot list creation times")
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	listPrefix := ""
	if opts.Prefix != "" {
		listPrefix = strings.TrimSuffix(opts.Prefix, "/") + "/"
	}
	listedAt := now()
	var entries []gcEntry
	plan := GCPlan{Storage: map[string]*FlowStorage{}}
	err := l.List(ctx, listPrefix, func(o ObjectInfo) error {
		entries = append(entries, classify(opts.Prefix, o))
		plan.ListedObjects++
		plan.ListedBytes += o.Size
		return nil
	})
	if err != nil {
		return GCPlan{}, fmt.Errorf("gc: list: %w", err)
	}
	// Only now read what is referenced (see the comment at the top).
	refs, err := opts.Refs(ctx)
	if err != nil {
		return GCPlan{}, fmt.Errorf("gc: read references: %w", err)
	}
	keep, keepDirs, warnings := references(ctx, b, opts.Prefix, refs, opts.Parallel)
	plan.Warnings = warnings
	newest := newestCatalogs(entries)

	type unit struct {
		newest time.Time
		items  []gcEntry
	}
	units := map[string]*unit{}
	var order []string
	for _, e := range entries {
		if e.flow != "" && plan.Storage[e.flow] == nil {
			plan.Storage[e.flow] = &FlowStorage{}
		}
		st := plan.Storage[e.flow]
		if e.kind == "" {
			plan.Kept++
			continue
		}
		if refs.KnownIDs != nil && !e.v2 && !refs.KnownIDs[e.id] || e.kind == GCCatalog && opts.Group != "" && e.group != opts.Group {
			plan.Unknown++
			continue
		}
		if e.kind == GCCatalog && newest[catalogKey{e.flow, e.group, e.id}] == e.rev {
			keep[e.Name] = true // the flow id's catalog
		}
		held := keep[e.Name] || keepDirs[e.unit]
		switch {
		case held && e.kind == GCSnapshot:
			st.SnapshotBytes += e.Size
		case held:
			st.LogBytes += e.Size
		default:
			st.GarbageBytes += e.Size
		}
		u := units[e.unit]
		if u == nil {
			u = &unit{}
			units[e.unit] = u
			order = append(order, e.unit)
		}
		if e.Created.After(u.newest) {
			u.newest = e.Created
		}
		u.items = append(u.items, e)
	}
	for _, name := range order {
		u := units[name]
		for _, e := range u.items {
			switch {
			case keep[e.Name] || keepDirs[e.unit]:
				// Referenced, or in a referenced unit: a listed meta keeps
				// its cycle's data object by name too, a listed snapshot
				// its whole directory.
			case listedAt.Sub(u.newest) < opts.Grace:
				plan.Young++
				plan.YoungBytes += e.Size
			default:
				plan.Delete = append(plan.Delete, GCObject{ObjectInfo: e.ObjectInfo, Flow: e.flow, Kind: e.kind})
				plan.DeleteBytes += e.Size
			}
		}
	}
	if opts.Group != "" {
		if err := plan.spareOtherGroups(ctx, b, opts.Prefix, opts.Group, opts.Parallel); err != nil {
			return GCPlan{}, err
		}
	}
	return plan, nil
}

// catalogKey names a flow id's catalogs: the flow directory, the group
// that wrote them and the flow id.
type catalogKey struct {
	flow, group string
	id          uint32
}

// newestCatalogs returns the highest revision listed of each flow id's
// catalog.
func newestCatalogs(entries []gcEntry) map[catalogKey]uint64 {
	newest := map[catalogKey]uint64{}
	for _, e := range entries {
		if k := (catalogKey{e.flow, e.group, e.id}); e.kind == GCCatalog && e.rev > newest[k] {
			newest[k] = e.rev
		}
	}
	return newest
}

// spareOtherGroups takes out of the plan the layout v2 units whose meta
// names a consumer group other than group: another deployment's cycles
// under the same prefix, never listed in this Redis. A meta that cannot be
// read says nothing of its group: its unit stays in the plan.
func (p *GCPlan) spareOtherGroups(ctx context.Context, b Bucket, prefix, group string, parallel int) error {
	var metas []int
	for i, o := range p.Delete {
		if o.Flow == GCShared && o.Kind == GCMeta {
			metas = append(metas, i)
		}
	}
	other := make([]bool, len(metas))
	err := forEach(ctx, len(metas), parallel, func(ctx context.Context, k int) error {
		m, _, _, err := streamMeta(ctx, b, p.Delete[metas[k]].Name, metaParts{}, metaVisitor{header: func(*Meta) error { return errStopMeta }})
		switch {
		case err == nil:
			other[k] = m.Group != group
		case !isDataFault(err):
			return fmt.Errorf("gc: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	spared := map[string]bool{}
	for k, i := range metas {
		if other[k] {
			unit, _, _ := V2Unit(prefix, p.Delete[i].Name)
			spared[unit] = true
		}
	}
	if len(spared) == 0 {
		return nil
	}
	kept := p.Delete[:0]
	for _, o := range p.Delete {
		if unit, _, ok := V2Unit(prefix, o.Name); ok && spared[unit] {
			p.Unknown++
			p.DeleteBytes -= o.Size
			p.Storage[GCShared].GarbageBytes -= o.Size
			continue
		}
		kept = append(kept, o)
	}
	p.Delete = kept
	return nil
}

// references returns the referenced object names and units (cycles and
// snapshot directories). A listed v1 meta is read up to its data_path; one
// that cannot be read is a warning: its cycle stays protected by name, and
// verify reports the damage.
func references(ctx context.Context, b Bucket, prefix string, refs GCRefs, parallel int) (keep, keepDirs map[string]bool, warnings []string) {
	keep, keepDirs = map[string]bool{}, map[string]bool{}
	var mu sync.Mutex
	warn := func(format string, args ...any) {
		mu.Lock()
		warnings = append(warnings, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	hold := func(name string) {
		mu.Lock()
		keep[name] = true
		if e := classify(prefix, ObjectInfo{Name: name}); e.kind != "" {
			keepDirs[e.unit] = true
		}
		mu.Unlock()
	}
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	run := func(fn func()) {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn()
		}()
	}
	seen := make(map[string]bool, len(refs.Metas))
	for _, p := range refs.Metas {
		if seen[p] {
			continue // a v2 meta listed by several flows
		}
		seen[p] = true
		hold(p)
		if _, _, ok := V2Unit(prefix, p); ok {
			continue // its unit, data object included, is held by name
		}
		run(func() {
			m, _, _, err := streamMeta(ctx, b, p, metaParts{}, metaVisitor{header: func(*Meta) error { return errStopMeta }})
			if err != nil {
				warn("listed meta %s: %v", p, err)
				return
			}
			if m.DataPath != "" {
				hold(m.DataPath)
			}
		})
	}
	// A listed snapshot keeps its directory, which holds all its objects
	// (a snapshot.meta naming an object elsewhere is refused by every
	// reader): its snapshot.meta, which may be large, is not read.
	for _, p := range refs.Snapshots {
		hold(p)
	}
	wg.Wait()
	return keep, keepDirs, warnings
}

// LoadSnapshotMeta reads and decodes the snapshot.meta object name.
func LoadSnapshotMeta(ctx context.Context, b Bucket, name string) (SnapshotMeta, error) {
	rc, err := b.Get(ctx, name)
	if err != nil {
		return SnapshotMeta{}, err
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, maxMetaSize+1))
	if err != nil {
		return SnapshotMeta{}, fmt.Errorf("read %s: %w", name, err)
	}
	if len(raw) > maxMetaSize {
		return SnapshotMeta{}, fmt.Errorf("%s: larger than %d MiB", name, maxMetaSize>>20)
	}
	return DecodeSnapshotMeta(raw)
}

// DeleteObjects deletes objs, parallel at most at a time, calling done (if
// not nil, from any goroutine) after each deletion. It returns how many
// objects and bytes it deleted and the errors joined.
func DeleteObjects(ctx context.Context, b Bucket, objs []GCObject, parallel int, done func(GCObject)) (n int, bytes int64, err error) {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, max(parallel, 1))
	for _, o := range objs {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := b.Delete(ctx, o.Name)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			n++
			bytes += o.Size
			if done != nil {
				done(o)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return n, bytes, errors.Join(errs...)
}
