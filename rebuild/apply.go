package rebuild

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/flowlog/flowlog/meta"
)

// State translates the plan into the Redis state it writes.
func (p *Plan) State() (meta.Recovered, error) {
	r := meta.Recovered{Group: p.Group, FlowSeq: meta.FlowID(p.FlowSeq)}
	if p.CheckpointPath != "" {
		r.GlobalCheckpoint = p.Checkpoint
	}
	for _, c := range p.Catalogs {
		f := meta.RecoveredFlow{ID: meta.FlowID(c.FlowID), Dropped: c.Dropped, TruncatedBefore: c.TruncatedBefore,
			CoverageSeq: c.CoverageSeq, Windows: map[uint32]meta.Window{}, CheckpointTS: c.CheckpointTS}
		switch ts, ok := p.FlowCheckpoints[c.FlowID]; {
		case c.Dropped && c.CheckpointTS != 0:
			// A dropped flow keeps the checkpoint its drop recorded: its
			// data stop there (docs/FORMAT.md, "Redis keys", catalog:rev).
		case p.CheckpointPath != "":
			f.CheckpointTS = p.Checkpoint
		case ok:
			f.CheckpointTS = ts
		}
		if len(c.Info) > 0 && string(c.Info) != "null" && string(c.Info) != "{}" {
			if err := json.Unmarshal(c.Info, &f.Info); err != nil {
				return r, fmt.Errorf("catalog of flow %d: info: %w", c.FlowID, err)
			}
			f.Routes = map[uint32]meta.Route{}
			for k, raw := range c.Routes {
				part, err := strconv.ParseUint(k, 10, 32)
				if err != nil {
					return r, fmt.Errorf("catalog of flow %d: route %q: %w", c.FlowID, k, err)
				}
				var rt meta.Route
				if err := json.Unmarshal(raw, &rt); err != nil {
					return r, fmt.Errorf("catalog of flow %d: route %q: %w", c.FlowID, k, err)
				}
				f.Routes[uint32(part)] = rt
			}
		}
		for _, w := range c.Windows {
			f.Windows[w.TableID] = meta.Window{TableID: w.TableID, Since: w.Since, Until: w.Until}
		}
		for _, w := range c.History {
			f.History = append(f.History, meta.Window{TableID: w.TableID, Since: w.Since, Until: w.Until})
		}
		for _, e := range c.Pending {
			f.Pending = append(f.Pending, meta.PendingStep{Seq: e.Seq, Added: e.Added, Removed: e.Removed, Ckpt: e.Ckpt})
		}
		f.CatalogRev = c.Rev
		if c.DDL != nil {
			f.DDL = &meta.DDLPosition{Topic: c.DDL.Topic, Partition: c.DDL.Partition, NextOffset: c.DDL.Next}
		}
		for _, sn := range c.Snapshots {
			f.Snapshots = append(f.Snapshots, meta.SnapshotRef{FlowID: f.ID, TS: sn.TS, Path: sn.Path})
		}
		r.Flows = append(r.Flows, f)
	}
	for _, id := range sortedKeys(p.Listed) {
		for _, m := range p.Listed[id] {
			r.Metas = append(r.Metas, meta.MetaRef{FlowID: meta.FlowID(id), Path: m.Path, MinResolvedTS: m.MinResolvedTS})
		}
	}
	for _, pp := range p.Parts {
		if pp.Offset < 0 {
			continue
		}
		pc := meta.PartitionCommit{Topic: pp.Topic, Partition: pp.Partition.Partition, NextOffset: pp.Offset, MaxTS: pp.MaxTS}
		if st := pp.State; st != nil {
			pc.Checkpoint, pc.HasCheckpoint, pc.Idle = st.Checkpoint, st.HasCheckpoint, st.Idle
			pc.Regions = map[uint64]uint64{}
			for k, ts := range st.Regions {
				rg, err := strconv.ParseUint(k, 10, 64)
				if err != nil {
					return r, fmt.Errorf("partition %s: region %q: %w", pp.Partition, k, err)
				}
				pc.Regions[rg] = ts
			}
		}
		r.Partitions = append(r.Partitions, pc)
	}
	for _, c := range p.Reports {
		r.Coverage = append(r.Coverage, meta.CoverageReport{FlowID: meta.FlowID(c.FlowID), Seq: c.Seq, Topic: c.Topic,
			Partition: c.Partition, Upto: c.Upto,
			Since: meta.CoverageValue{TS: c.Since.TS, Idle: c.Since.Idle}, Until: meta.CoverageValue{TS: c.Until.TS, Idle: c.Until.Idle}})
	}
	for _, d := range p.DDL {
		r.DDL = append(r.DDL, meta.DDLPosition{Topic: p.DDLTopic, Partition: d.Partition, NextOffset: d.Next})
	}
	return r, nil
}

// Apply writes the plan's state under the store's prefix (meta.Store.
// WriteRecovered: one MULTI, the owner key last).
func (p *Plan) Apply(ctx context.Context, s *meta.Store) error {
	r, err := p.State()
	if err != nil {
		return err
	}
	return s.WriteRecovered(ctx, r)
}
