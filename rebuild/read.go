package rebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/flowlog/flowlog/sink"
)

// maxMetaBytes bounds one meta object read whole (the cap the writers
// keep far below; docs/FORMAT.md, "Meta objects").
const maxMetaBytes = 64 << 20

// MetaInfo is what recovery keeps of one meta in the bucket: no files,
// only what the Redis state needs.
type MetaInfo struct {
	Path          string
	Version       int
	FlowID        uint32 // the flow of a version 1 meta
	MinResolvedTS uint64
	// Flows are the flows whose metas:<flow_id> lists the meta: its flow
	// (version 1), or every flow a version 2 meta names, with a chunk or
	// a coverage report in it (docs/FORMAT.md, "Meta objects, version 2").
	Flows []uint32
	// Files is how many chunks the meta lists, and Chunked the flows
	// with a chunk among them.
	Files   int
	Chunked []uint32
	// Named are the flows a version 2 meta names, with their names.
	Named      []sink.MetaFlow
	Offsets    []sink.OffsetRange
	Partitions []sink.PartitionState
	Coverage   []sink.CoverageReport
	// Bad is why the meta could not be read; such a meta is left out.
	Bad string
}

// bucketListing is one listing of the prefix: the newest catalog of every
// flow id of the group, and the metas.
type bucketListing struct {
	catalogs map[uint32]sink.CatalogRef
	v1, v2   []string // meta object names
	other    int      // objects of other groups' catalogs
}

// list walks everything under the prefix once.
func list(ctx context.Context, b sink.Bucket, prefix, group string) (bucketListing, error) {
	out := bucketListing{catalogs: map[uint32]sink.CatalogRef{}}
	newest := map[uint32]uint64{}
	dir := strings.TrimSuffix(prefix, "/")
	if dir != "" {
		dir += "/"
	}
	err := b.Iter(ctx, dir, func(name string) error {
		if _, kind, ok := sink.V2Unit(prefix, name); ok {
			if kind == sink.GCMeta {
				out.v2 = append(out.v2, name)
			}
			return nil
		}
		cat, flow, ok := sink.SplitFlowPath(prefix, name)
		if !ok {
			return nil
		}
		base := path.Base(name)
		switch path.Dir(name) + "/" {
		case sink.CatalogDir(prefix, cat, flow):
			g, id, rev, ok := sink.ParseCatalogName(base)
			if !ok {
				return nil
			}
			if g != group {
				out.other++
				return nil
			}
			if _, seen := out.catalogs[id]; !seen || rev >= newest[id] {
				newest[id] = rev
				out.catalogs[id] = sink.CatalogRef{Path: name}
			}
		case sink.FlowDir(prefix, cat, flow) + "/backupmeta/":
			if strings.HasSuffix(base, ".meta") {
				out.v1 = append(out.v1, name)
			}
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("list %s: %w", dir, err)
	}
	for id, ref := range out.catalogs {
		c, err := sink.ReadCatalog(ctx, b, prefix, ref.Path)
		if err != nil {
			return out, err
		}
		out.catalogs[id] = sink.CatalogRef{Path: ref.Path, Catalog: c}
	}
	return out, nil
}

// readMetas reads the metas at names, parallel at a time, keeping of each
// only a MetaInfo. A meta that does not decode, or a v2 meta of another
// group, is returned with Bad set (and left out by the caller).
func readMetas(ctx context.Context, b sink.Bucket, prefix, group string, names []string, parallel int) ([]MetaInfo, error) {
	out := make([]MetaInfo, len(names))
	errs := make([]error, len(names))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(parallel, 1) {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = readMeta(ctx, b, prefix, group, names[i])
			}
		})
	}
	for i := range names {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, errors.Join(errs...)
}

func readMeta(ctx context.Context, b sink.Bucket, prefix, group, name string) (MetaInfo, error) {
	info := MetaInfo{Path: name}
	rc, err := b.Get(ctx, name)
	if errors.Is(err, sink.ErrNotExist) {
		info.Bad = "deleted while listing"
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("read meta %s: %w", name, err)
	}
	raw, err := io.ReadAll(io.LimitReader(rc, maxMetaBytes+1))
	rc.Close()
	if err != nil {
		return info, fmt.Errorf("read meta %s: %w", name, err)
	}
	if len(raw) > maxMetaBytes {
		info.Bad = fmt.Sprintf("larger than %d MiB", maxMetaBytes>>20)
		return info, nil
	}
	m, err := sink.DecodeMeta(raw)
	if err != nil {
		info.Bad = err.Error()
		return info, nil
	}
	info.Version, info.MinResolvedTS, info.Offsets, info.Files = m.Version, m.MinResolvedTS, m.Offsets, len(m.Files)
	switch m.Version {
	case sink.MetaVersion:
		cat, flow, _ := sink.SplitFlowPath(prefix, name)
		if !strings.HasPrefix(m.DataPath, sink.FlowDir(prefix, cat, flow)+"/") || !strings.HasSuffix(name, "-"+u32s(m.FlowID)+"-"+m.CycleID+".meta") {
			info.Bad = "not the meta its name says"
			return info, nil
		}
		info.FlowID = m.FlowID
		if len(m.Files) > 0 {
			info.Flows, info.Chunked = []uint32{m.FlowID}, []uint32{m.FlowID}
		}
	default:
		if m.Group != group {
			info.Bad = fmt.Sprintf("of consumer group %q", m.Group)
			return info, nil
		}
		// A meta of coverage reports only has no data object, and no
		// data_path.
		if (m.DataPath != "" || len(m.Files) > 0) && !strings.HasPrefix(m.DataPath, sink.V2LogDir(prefix)) {
			info.Bad = "its data object lies outside the prefix"
			return info, nil
		}
		for _, f := range m.Flows {
			info.Flows = append(info.Flows, f.FlowID)
		}
		slices.Sort(info.Flows)
		chunked := map[uint32]bool{}
		for i := range m.Files {
			for _, id := range m.Files[i].FlowIDs {
				if !chunked[id] {
					chunked[id] = true
					info.Chunked = append(info.Chunked, id)
				}
			}
		}
		slices.Sort(info.Chunked)
		info.Named, info.Partitions, info.Coverage = m.Flows, m.Partitions, m.Coverage
	}
	return info, nil
}
