package pipeline

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// generation is the set of temp files events are appended to now. A freeze
// hands the whole generation to a flush cycle and starts a new one, so a
// frozen file never receives another entry.
type generation struct {
	id    uint64
	root  string
	files map[fileKey]*tempFile
	dirs  map[meta.FlowID]string
	bytes int64
	last  *tempFile // the file of the previous append, for runs of one key
}

func newGeneration(root string, id uint64) *generation {
	return &generation{id: id, root: root, files: map[fileKey]*tempFile{}, dirs: map[meta.FlowID]string{}}
}

// file returns the temp file of key, creating it under
// <root>/<catalog>/<flow>/ on first use.
func (g *generation) file(key fileKey, flow *meta.Flow) (*tempFile, error) {
	if l := g.last; l != nil && l.key == key {
		return l, nil
	}
	if f, ok := g.files[key]; ok {
		g.last = f
		return f, nil
	}
	dir, ok := g.dirs[key.flow]
	if !ok {
		// Catalog and flow names were validated by the DDL applier
		// ([A-Za-z0-9_-]), so they are safe path elements.
		dir = filepath.Join(g.root, flow.Info.CatalogName, flow.Info.FlowName)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create temp dir: %w", err)
		}
		g.dirs[key.flow] = dir
	}
	meta := ""
	if key.isMeta {
		meta = "-meta"
	}
	// The flow id keeps a flow dropped and created again under the same
	// name apart from the old one (DESIGN 4).
	name := fmt.Sprintf("f%d-g%d-p%d-t%d-r%d-%s-%s%s.tmp", key.flow, g.id, key.partition, key.table, key.region,
		sink.CFName(key.cf), sink.OpName(key.op), meta)
	f, err := newTempFile(filepath.Join(dir, name), key, flow)
	if err != nil {
		return nil, err
	}
	g.files[key] = f
	g.last = f
	return f, nil
}

// list returns the generation's files.
func (g *generation) list() []*tempFile {
	out := make([]*tempFile, 0, len(g.files))
	for _, f := range g.files {
		out = append(out, f)
	}
	return out
}

// regionState is what a partition knows of one region.
type regionState struct {
	resolved uint64
	seen     time.Time
}

// partState is the consume loop's view of one assigned apply partition.
type partState struct {
	partition  int32
	lease      meta.Lease
	next       int64  // offset after the last record handled
	cycleFrom  int64  // first offset not yet part of a frozen cycle
	frozenCkpt uint64 // checkpoint handed to the last cycle
	frozenIdle bool   // the last cycle had no live region (ckpt idle)
	regions    map[uint64]*regionState
	hwm        int64
	maxTS      uint64 // highest ts of the records handled (and committed before)
	cov        partCoverage
}

// checkpoint is the min resolved ts over the partition's regions seen within
// ttl, and false when there is none. Regions silent longer than ttl are
// forgotten on the way.
func (p *partState) checkpoint(now time.Time, ttl time.Duration) (uint64, bool) {
	var ck uint64
	ok := false
	for id, r := range p.regions {
		if now.Sub(r.seen) > ttl {
			delete(p.regions, id)
			continue
		}
		if !ok || r.resolved < ck {
			ck, ok = r.resolved, true
		}
	}
	return ck, ok
}
