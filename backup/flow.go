package backup

import (
	"context"
	"errors"
	"fmt"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Flow is a flow as the read side finds it: by catalog/name while it
// exists, by id once dropped.
type Flow struct {
	ID      meta.FlowID
	Catalog string
	Name    string
	// Dropped is set when the flow has no definition any more: its catalog
	// and name come from its newest meta's path, its checkpoint from the
	// consumer group's global_checkpoint object.
	Dropped bool
}

// String is catalog/name.
func (f Flow) String() string { return f.Catalog + "/" + f.Name }

// Sink is the flow as the sink's readers check its objects, under prefix.
func (f Flow) Sink(prefix string) sink.Flow {
	return sink.Flow{Prefix: prefix, Catalog: f.Catalog, Name: f.Name, ID: f.ID}
}

// Lookup names the flow a request reads: by Name (in Catalog) while it
// exists, else by ID, which finds a dropped flow too.
type Lookup struct {
	Catalog, Name string
	ID            meta.FlowID
}

// Resolve finds the flow l names in src. A dropped flow (no definition any
// more) takes its catalog and name from its newest meta: from the path of a
// layout v1 meta, which must lie under src.Prefix, or from the flows a
// layout v2 meta names. It fails with a *NotFoundError if there is no such
// flow, or no committed backup of a dropped one.
func Resolve(ctx context.Context, src Source, l Lookup) (Flow, error) {
	st := src.Store
	f := Flow{ID: l.ID, Catalog: l.Catalog, Name: l.Name}
	if l.Name != "" {
		id, ok, err := st.FlowIDByName(ctx, l.Catalog, l.Name)
		if err != nil {
			return f, err
		}
		if !ok {
			return f, &NotFoundError{Lookup: l}
		}
		f.ID = id
		return f, nil
	}
	info, ok, err := st.FlowInfo(ctx, f.ID)
	if err != nil {
		return f, err
	}
	if ok {
		f.Catalog, f.Name = info.CatalogName, info.FlowName
		return f, nil
	}
	f.Dropped = true
	refs, err := st.Metas(ctx, f.ID)
	if err != nil {
		return f, err
	}
	if len(refs) == 0 {
		return f, &NotFoundError{Lookup: l}
	}
	newest := refs[len(refs)-1].Path
	if _, _, v2 := sink.V2Unit(src.Prefix, newest); v2 {
		cat, name, err := sink.FlowOfMeta(ctx, src.Bucket, newest, uint32(f.ID))
		if err != nil {
			return f, fmt.Errorf("name of dropped flow %d: %w", f.ID, err)
		}
		f.Catalog, f.Name = cat, name
		return f, nil
	}
	cat, name, ok := sink.SplitFlowPath(src.Prefix, newest)
	if !ok {
		return f, &OutsidePrefixError{ID: f.ID, Path: newest, Prefix: src.Prefix}
	}
	f.Catalog, f.Name = cat, name
	return f, nil
}

// flowCheckpoint returns f's checkpoint: FlowState's while the flow exists
// (the effective checkpoint, docs/FORMAT.md, "Effective checkpoint"), else (dropped flow) the consumer group's checkpoint object: the
// global one of layout v2 if the prefix has it, else the flow's v1 object
// under its catalog/name. A v1 object stops moving at the drop, unless a new
// flow of the same name takes the path over: then it may be later than the
// dropped flow's data, and a restore at it shows the dropped flow's final
// state. The v2 object keeps moving after the drop; what a dropped flow's
// restore may claim past its data is bounded by its windows (see
// restorable), so a later checkpoint only shows its final state too.
func flowCheckpoint(ctx context.Context, src Source, f Flow) (uint64, error) {
	if !f.Dropped {
		s, err := src.Store.FlowState(ctx, f.ID)
		if err != nil {
			return 0, err
		}
		return s.CheckpointTS, nil
	}
	ts, err := sink.ReadCheckpoint(ctx, src.Bucket, sink.CheckpointPathV2(src.Prefix, src.Group))
	if errors.Is(err, sink.ErrNotExist) {
		ts, err = sink.ReadCheckpoint(ctx, src.Bucket, sink.CheckpointPath(src.Prefix, f.Catalog, f.Name, src.Group, f.ID))
	}
	if err != nil {
		return 0, fmt.Errorf("checkpoint of dropped flow %d: %w", f.ID, err)
	}
	return ts, nil
}
