package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// connConfig is how every consumer command reaches Kafka, Redis and GCS.
type connConfig struct {
	Kafka kafkaconf.Config
	Redis meta.Config
	GCS   gcs.Config
	Group string
}

// RegisterFlags registers the connection flags on f.
func (c *connConfig) RegisterFlags(f *flag.FlagSet) {
	c.Kafka.RegisterFlags(f)
	c.Redis.RegisterFlags(f)
	c.GCS.RegisterFlags(f)
	f.StringVar(&c.Group, "group", "flowlog", "Kafka consumer group; also names the global_checkpoint object")
}

// Validate reports every problem, one per line.
func (c *connConfig) Validate() error {
	var errs []error
	errs = append(errs, c.Kafka.Validate(), c.Redis.Validate(), c.GCS.Validate())
	if c.Group == "" {
		errs = append(errs, errors.New("--group: must not be empty"))
	}
	return errors.Join(errs...)
}

// openStore connects to Redis. The store has no metrics registry: operator
// commands are short-lived.
// parseOpen parses args into fs (where c's flags are registered), validates
// c and opens the metadata store: the start of every operator command.
func (c *connConfig) parseOpen(fs *flag.FlagSet, args []string) (*meta.Store, func(), error) {
	if err := cli.Parse(fs, args); err != nil {
		return nil, nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c.openStore()
}

func (c *connConfig) openStore() (*meta.Store, func(), error) {
	rdb, err := c.Redis.NewClient()
	if err != nil {
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	return meta.NewStore(rdb, c.Redis.Prefix, nil), func() { rdb.Close() }, nil
}

// openBucket connects to the GCS bucket.
func (c *connConfig) openBucket(ctx context.Context) (sink.Bucket, error) {
	b, err := gcs.New(ctx, c.GCS)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// flowRef is a flow as an operator command names it: by catalog/name while
// it exists, or by id once dropped.
type flowRef struct {
	ID      meta.FlowID
	Catalog string
	Name    string
	Dropped bool
	Metas   []string // committed meta paths, in resolved-ts order (listMetas)
}

// sinkFlow is the flow as the sink's readers check its metas.
func (r flowRef) sinkFlow(prefix string) sink.Flow {
	return sink.Flow{Prefix: prefix, Catalog: r.Catalog, Name: r.Name, ID: uint32(r.ID)}
}

// flowStore is what the operator commands read of a flow in Redis
// (*meta.Store).
type flowStore interface {
	FlowIDByName(ctx context.Context, catalog, name string) (meta.FlowID, bool, error)
	FlowInfo(ctx context.Context, id meta.FlowID) (meta.FlowInfo, bool, error)
	FlowState(ctx context.Context, id meta.FlowID) (meta.FlowState, error)
	Metas(ctx context.Context, id meta.FlowID) ([]meta.MetaRef, error)
	Windows(ctx context.Context, id meta.FlowID) (map[uint32]meta.Window, []meta.Window, error)
	PendingCoverage(ctx context.Context) ([]meta.PendingFlow, error)
}

// listMetas sets ref.Metas to the flow's committed meta paths. A restore
// calls it after reading the checkpoint: metas only grow, so a list taken
// later holds every cycle the checkpoint covers.
func listMetas(ctx context.Context, st flowStore, ref *flowRef) error {
	refs, err := st.Metas(ctx, ref.ID)
	if err != nil {
		return err
	}
	ref.Metas = ref.Metas[:0]
	for _, m := range refs {
		ref.Metas = append(ref.Metas, m.Path)
	}
	return nil
}

// addFlowFlags registers --flow and --flow-id on f.
func addFlowFlags(f *flag.FlagSet, name *string, id *uint) {
	f.StringVar(name, "flow", "", `flow name in catalog "default", or catalog/name`)
	f.UintVar(id, "flow-id", 0, "flow id, for a dropped flow (its backup stays restorable)")
}

// resolveFlow finds the flow named by --flow or --flow-id; callers list its
// metas with listMetas. A dropped flow (no flow:info any more) takes its
// catalog and name from its newest meta's object path.
func resolveFlow(ctx context.Context, st flowStore, prefix, flowArg string, idArg uint) (flowRef, error) {
	var ref flowRef
	switch {
	case flowArg == "" && idArg == 0:
		return ref, errors.New("--flow or --flow-id is required")
	case flowArg != "" && idArg != 0:
		return ref, errors.New("--flow and --flow-id are exclusive")
	case flowArg != "":
		ref.Catalog, ref.Name = meta.DefaultCatalog, flowArg
		if cat, name, ok := strings.Cut(flowArg, "/"); ok {
			ref.Catalog, ref.Name = cat, name
		}
		if !sink.ValidName(ref.Catalog) || !sink.ValidName(ref.Name) {
			return ref, fmt.Errorf("--flow %q: not a valid [catalog/]name", flowArg)
		}
		id, ok, err := st.FlowIDByName(ctx, ref.Catalog, ref.Name)
		if err != nil {
			return ref, err
		}
		if !ok {
			return ref, fmt.Errorf("no flow %s/%s (use --flow-id for a dropped flow)", ref.Catalog, ref.Name)
		}
		ref.ID = id
	default:
		if idArg > math.MaxUint32 {
			return ref, fmt.Errorf("--flow-id %d: out of range", idArg)
		}
		ref.ID = meta.FlowID(idArg)
		info, ok, err := st.FlowInfo(ctx, ref.ID)
		if err != nil {
			return ref, err
		}
		if ok {
			ref.Catalog, ref.Name = info.CatalogName, info.FlowName
		} else {
			ref.Dropped = true
		}
	}
	if ref.Dropped {
		refs, err := st.Metas(ctx, ref.ID)
		if err != nil {
			return ref, err
		}
		if len(refs) == 0 {
			return ref, fmt.Errorf("flow %d: no such flow and no committed backup", ref.ID)
		}
		cat, name, ok := sink.SplitFlowPath(prefix, refs[len(refs)-1].Path)
		if !ok {
			return ref, fmt.Errorf("flow %d: meta path %s is not under --gcs-prefix %q", ref.ID, refs[len(refs)-1].Path, prefix)
		}
		ref.Catalog, ref.Name = cat, name
	}
	return ref, nil
}

// checkpoint returns the flow's global checkpoint: flow:state's while the
// flow exists, else (dropped flow) the global_checkpoint object of the
// consumer group under the flow's catalog/name. For a dropped flow that
// object stops moving at the drop, unless a new flow of the same name takes
// the path over: then it may be later than the dropped flow's data, and a
// restore at it shows the dropped flow's final state.
func checkpoint(ctx context.Context, st flowStore, b sink.Bucket, c *connConfig, ref flowRef) (uint64, error) {
	if !ref.Dropped {
		s, err := st.FlowState(ctx, ref.ID)
		if err != nil {
			return 0, err
		}
		return s.CheckpointTS, nil
	}
	name := sink.CheckpointPath(c.GCS.Prefix, ref.Catalog, ref.Name, c.Group, ref.ID)
	rc, err := b.Get(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("checkpoint of dropped flow %d: %w", ref.ID, err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, 64))
	if err != nil {
		return 0, fmt.Errorf("checkpoint of dropped flow %d: %w", ref.ID, err)
	}
	return sink.DecodeCheckpoint(raw)
}
