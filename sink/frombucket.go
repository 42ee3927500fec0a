package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Reading a backup from the bucket alone (docs/RESTORE.md, "Restoring
// without Redis"). What Redis lists, the bucket says too:
//
//   - the checkpoint: the consumer group's global checkpoint object, written
//     after every checkpoint advance (v2/global_checkpoint/<group>.ts; a
//     flow of layout v1 alone has its own object);
//   - a flow's definition, coverage windows, truncation point and listed
//     snapshots: its catalog, the highest revision of its flow id, written
//     before any object whose absence it explains is deleted;
//   - its metas: every v2 meta of the group that serves the flow, and the v1
//     metas in its directory that carry its id. That is more than Redis
//     lists (cycles of fenced zombies and of crashed consumers, never
//     committed), but those hold only events that committed metas hold as
//     well, or events above the checkpoint: a restore at or below the
//     checkpoint reads the same versions twice at most, and its MVCC read
//     takes each (key, ts) once.

// CatalogRef is a flow id's newest catalog object.
type CatalogRef struct {
	Path    string
	Catalog Catalog
}

// ReadCatalog reads and checks the catalog object name: it must decode
// (DecodeCatalog) and say what its name says (flow directory, group, flow
// id and revision), so that a catalog copied elsewhere is refused.
func ReadCatalog(ctx context.Context, b Bucket, prefix, name string) (Catalog, error) {
	cat, flow, ok := SplitFlowPath(prefix, name)
	group, id, rev, okName := ParseCatalogName(path.Base(name))
	if !ok || !okName || path.Dir(name)+"/" != CatalogDir(prefix, cat, flow) {
		return Catalog{}, fmt.Errorf("catalog %s: not a catalog name under prefix %q", name, prefix)
	}
	raw, err := readSmall(ctx, b, name, MaxCatalogSize)
	if err != nil {
		return Catalog{}, fmt.Errorf("catalog: %w", err)
	}
	c, err := DecodeCatalog(raw)
	if err != nil {
		return Catalog{}, fmt.Errorf("catalog %s: %w", name, err)
	}
	if c.Catalog != cat || c.Name != flow || c.Group != group || c.FlowID != id || c.Rev != rev {
		return Catalog{}, fmt.Errorf("catalog %s holds flow %s/%s (id %d) of group %q at revision %d: not what its name says", name, c.Catalog, c.Name, c.FlowID, c.Group, c.Rev)
	}
	return c, nil
}

// NewestCatalogs lists the catalogs of flow name catalog/name written by
// group and reads the newest revision of each flow id there (several: a
// flow dropped and created again under the same name is a new id).
func NewestCatalogs(ctx context.Context, b Bucket, prefix, group, catalog, name string) (map[uint32]CatalogRef, error) {
	dir := CatalogDir(prefix, catalog, name)
	newest := map[uint32]uint64{}
	names := map[uint32]string{}
	err := b.Iter(ctx, dir, func(n string) error {
		g, id, rev, ok := ParseCatalogName(strings.TrimPrefix(n, dir))
		if ok && g == group && rev >= newest[id] {
			newest[id], names[id] = rev, n
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	out := make(map[uint32]CatalogRef, len(names))
	for id, n := range names {
		c, err := ReadCatalog(ctx, b, prefix, n)
		if err != nil {
			return nil, err
		}
		out[id] = CatalogRef{Path: n, Catalog: c}
	}
	return out, nil
}

// FindFlowName returns the catalog and name of flow id from the bucket:
// from the first v2 meta of group that names it, else from a catalog of
// the id in any flow directory under prefix (a flow of layout v1 alone).
// It fails wrapping ErrNotExist if nothing names the id.
func FindFlowName(ctx context.Context, b Bucket, prefix, group string, id uint32, parallel int) (catalog, name string, err error) {
	var (
		mu    sync.Mutex
		found *MetaFlow
	)
	err = eachV2Meta(ctx, b, prefix, parallel, func(_ string, m *Meta) error {
		if m.Version != MetaVersion2 || m.Group != group {
			return nil
		}
		for _, f := range m.Flows {
			if f.FlowID == id && !f.unnamed() {
				mu.Lock()
				if found == nil {
					found = &f
				}
				mu.Unlock()
				return errFound
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return "", "", err
	}
	if found != nil {
		return found.Catalog, found.Name, nil
	}
	err = eachCatalog(ctx, b, prefix, func(cat, flow, g string, cid uint32) error {
		if g == group && cid == id {
			catalog, name = cat, flow
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return "", "", err
	}
	if name == "" {
		return "", "", fmt.Errorf("flow id %d: no v2 meta of group %q and no catalog names it: %w", id, group, ErrNotExist)
	}
	return catalog, name, nil
}

var errFound = errors.New("found")

// ListedMeta is a meta of a flow found in the bucket, with its
// min_resolved_ts.
type ListedMeta struct {
	Path          string
	MinResolvedTS uint64
}

// FlowMetas lists flow f's metas in the bucket: every v2 meta of group that
// serves f's id, and the v1 metas in f's directory whose name carries the
// id, ordered as Redis orders metas:<flow_id> (by min_resolved_ts as a
// float64 score, then by name). Only each v2 meta's first members are read:
// what a restore then reads of the metas it checks in full.
func FlowMetas(ctx context.Context, b Bucket, f Flow, group string, parallel int) ([]ListedMeta, error) {
	var (
		mu  sync.Mutex
		out []ListedMeta
	)
	err := eachV2Meta(ctx, b, f.Prefix, parallel, func(p string, m *Meta) error {
		if m.Version == MetaVersion2 && m.Group == group && m.Serves(f.ID) {
			mu.Lock()
			out = append(out, ListedMeta{Path: p, MinResolvedTS: m.MinResolvedTS})
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	dir := f.Dir() + "backupmeta/"
	want := strconv.FormatUint(uint64(f.ID), 10)
	err = b.Iter(ctx, dir, func(n string) error {
		base, ok := strings.CutSuffix(strings.TrimPrefix(n, dir), ".meta")
		id, _, okCycle := cycleOf(base)
		ts, _, _ := strings.Cut(base, "-")
		v, err := strconv.ParseUint(ts, 10, 64)
		if ok && okCycle && id == want && len(ts) == 20 && err == nil {
			out = append(out, ListedMeta{Path: n, MinResolvedTS: v})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	slices.SortFunc(out, func(a, b ListedMeta) int {
		if c := cmp.Compare(float64(a.MinResolvedTS), float64(b.MinResolvedTS)); c != 0 {
			return c
		}
		return strings.Compare(a.Path, b.Path)
	})
	return out, nil
}

// eachV2Meta lists v2/meta/ under prefix and calls fn, parallel at most at
// a time, with each meta's members up to its flows (group, flows and
// min_resolved_ts among them; unchecked). A meta that cannot be decoded is
// skipped: nothing lists it. fn returning errFound ends the walk early with
// that error.
func eachV2Meta(ctx context.Context, b Bucket, prefix string, parallel int, fn func(path string, m *Meta) error) error {
	dir := V2MetaDir(prefix)
	var names []string
	if err := b.Iter(ctx, dir, func(n string) error {
		if _, kind, ok := V2Unit(prefix, n); ok && kind == GCMeta {
			names = append(names, n)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	return forEach(ctx, len(names), parallel, func(ctx context.Context, i int) error {
		var hdr *Meta
		_, _, _, err := streamMeta(ctx, b, names[i], metaParts{}, metaVisitor{
			member: func(name string, m *Meta) error {
				if name == "flows" {
					hdr = m
					return errStopMeta
				}
				return nil
			},
			header: func(m *Meta) error { hdr = m; return errStopMeta },
		})
		switch {
		case err != nil && isDataFault(err):
			return nil
		case err != nil:
			return err
		case hdr == nil:
			return nil
		}
		return fn(names[i], hdr)
	})
}

// ReadCheckpoint reads a checkpoint object (8 bytes, DecodeCheckpoint).
func ReadCheckpoint(ctx context.Context, b Bucket, name string) (uint64, error) {
	raw, err := readSmall(ctx, b, name, 64)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: %w", err)
	}
	ts, err := DecodeCheckpoint(raw)
	if err != nil {
		return 0, fmt.Errorf("checkpoint %s: %w", name, err)
	}
	return ts, nil
}

// readSmall reads object name whole, refusing one of more than limit
// bytes.
func readSmall(ctx context.Context, b Bucket, name string, limit int64) ([]byte, error) {
	rc, err := b.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if int64(len(raw)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, limit)
	}
	return raw, nil
}

// FlowOfMeta returns the catalog and name layout v2 meta object path gives
// flow id among its flows (only its first members are read).
func FlowOfMeta(ctx context.Context, b Bucket, path string, id uint32) (catalog, name string, err error) {
	var flows []MetaFlow
	version := 0
	_, _, _, err = streamMeta(ctx, b, path, metaParts{}, metaVisitor{
		member: func(member string, m *Meta) error {
			if member == "flows" {
				flows, version = m.Flows, m.Version
				return errStopMeta
			}
			return nil
		},
		header: func(m *Meta) error { flows, version = m.Flows, m.Version; return errStopMeta },
	})
	if err != nil {
		return "", "", err
	}
	if version != MetaVersion2 {
		return "", "", fmt.Errorf("meta %s: version %d, not a layout v2 meta", path, version)
	}
	for _, f := range flows {
		if f.FlowID == id && !f.unnamed() {
			return f.Catalog, f.Name, nil
		}
	}
	return "", "", fmt.Errorf("meta %s names no flow %d", path, id)
}

// CatalogFlowIDs lists the flow ids that have a catalog of group anywhere
// under prefix (one listing of everything under it), ascending.
func CatalogFlowIDs(ctx context.Context, b Bucket, prefix, group string) ([]uint32, error) {
	seen := map[uint32]bool{}
	err := eachCatalog(ctx, b, prefix, func(_, _, g string, id uint32) error {
		if g == group {
			seen[id] = true
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ids := make([]uint32, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// eachCatalog lists everything under prefix and calls fn with the flow
// directory, group and flow id of every catalog object.
func eachCatalog(ctx context.Context, b Bucket, prefix string, fn func(catalog, flow, group string, id uint32) error) error {
	listPrefix := ""
	if prefix != "" {
		listPrefix = strings.TrimSuffix(prefix, "/") + "/"
	}
	return b.Iter(ctx, listPrefix, func(n string) error {
		cat, flow, ok := SplitFlowPath(prefix, n)
		if !ok || path.Dir(n)+"/" != CatalogDir(prefix, cat, flow) {
			return nil
		}
		if g, id, _, ok := ParseCatalogName(path.Base(n)); ok {
			return fn(cat, flow, g, id)
		}
		return nil
	})
}
