package sink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// flowObjects are the objects under a flow's directory, split into the
// global checkpoint objects, the catalogs (catalog/, which describe the
// backup: never unreferenced) and the rest.
type flowObjects struct {
	checkpoints []string
	catalogs    int
	others      []string
}

func listFlowObjects(ctx context.Context, b Bucket, f Flow) (flowObjects, error) {
	var objs flowObjects
	dir := f.Dir()
	ckptDir, catDir := dir+"global_checkpoint/", CatalogDir(f.Prefix, f.Catalog, f.Name)
	err := b.Iter(ctx, dir, func(name string) error {
		switch {
		case strings.HasPrefix(name, ckptDir):
			objs.checkpoints = append(objs.checkpoints, name)
		case strings.HasPrefix(name, catDir):
			objs.catalogs++
		default:
			objs.others = append(objs.others, name)
		}
		return nil
	})
	if err != nil {
		return objs, fmt.Errorf("list %s: %w", dir, err)
	}
	return objs, nil
}

// countUnreferenced counts (into r) the objects among names that neither a
// meta of o.MetaPaths nor a listed meta or snapshot of another flow id
// references (a snapshot's objects by its directory, as gc protects them);
// referenced holds the former and their data objects. A meta object of
// another flow id (a dropped flow of the same name) is looked up in that
// id's listed metas, once per id.
func countUnreferenced(ctx context.Context, o VerifyOptions, names []string, referenced map[string]bool, r *VerifyReport) error {
	listed := map[uint32]map[string]bool{}
	snaps := map[uint32]map[string]bool{}
	var garbage []string
	for _, name := range names {
		if referenced[name] {
			continue
		}
		if dir, id, ok := snapshotDir(name); ok && id != o.Flow.ID && o.ListedSnapshots != nil {
			set, ok := snaps[id]
			if !ok {
				paths, err := o.ListedSnapshots(ctx, id)
				if err != nil {
					return fmt.Errorf("snapshots of flow %d: %w", id, err)
				}
				set = map[string]bool{}
				for _, p := range paths {
					set[p] = true
				}
				snaps[id] = set
			}
			if !set[dir+"snapshot.meta"] {
				garbage = append(garbage, name)
			}
			continue
		}
		if !strings.HasSuffix(name, ".meta") || o.ListedMetas == nil {
			garbage = append(garbage, name)
			continue
		}
		m, _, _, err := streamMeta(ctx, o.Bucket, name, metaParts{}, metaVisitor{header: func(*Meta) error { return errStopMeta }})
		if err != nil {
			if isDataFault(err) {
				garbage = append(garbage, name) // unreadable: nobody's
				continue
			}
			return err
		}
		if m.FlowID == o.Flow.ID {
			garbage = append(garbage, name) // ours, but not listed
			continue
		}
		set, ok := listed[m.FlowID]
		if !ok {
			paths, err := o.ListedMetas(ctx, m.FlowID)
			if err != nil {
				return fmt.Errorf("metas of flow %d: %w", m.FlowID, err)
			}
			set = map[string]bool{}
			for _, p := range paths {
				set[p] = true
			}
			listed[m.FlowID] = set
		}
		if !set[name] {
			garbage = append(garbage, name)
			continue
		}
		referenced[name] = true
		if m.DataPath != "" {
			referenced[m.DataPath] = true
		}
	}
	for _, name := range garbage {
		if referenced[name] { // a data object of another flow's meta seen later
			continue
		}
		size, err := o.Bucket.Size(ctx, name)
		if errors.Is(err, ErrNotExist) {
			continue // deleted meanwhile
		}
		if err != nil {
			return err
		}
		r.Unreferenced++
		r.UnreferencedBytes += size
	}
	return nil
}

// snapshotDir returns the snapshot directory ("<...>/snapshot/<ts>-<id>/")
// an object name lies in, and the flow id of that directory.
func snapshotDir(name string) (dir string, id uint32, ok bool) {
	i := strings.LastIndex(name, "/snapshot/")
	if i < 0 {
		return "", 0, false
	}
	d, _, ok := strings.Cut(name[i+len("/snapshot/"):], "/")
	if !ok {
		return "", 0, false
	}
	_, idPart, ok := strings.Cut(d, "-")
	if !ok {
		return "", 0, false
	}
	n, err := strconv.ParseUint(idPart, 10, 32)
	if err != nil {
		return "", 0, false
	}
	return name[:i+len("/snapshot/")+len(d)+1], uint32(n), true
}
