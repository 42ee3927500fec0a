package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// addFlowFlags registers --flow and --flow-id on f.
func addFlowFlags(f *flag.FlagSet, name *string, id *uint) {
	f.StringVar(name, "flow", "", `flow name in catalog "default", or catalog/name`)
	f.UintVar(id, "flow-id", 0, "flow id, for a dropped flow (its backup stays restorable)")
}

// flowLookup is the flow --flow (flowArg) or --flow-id (idArg) names.
func flowLookup(flowArg string, idArg uint) (backup.Lookup, error) {
	var l backup.Lookup
	switch {
	case flowArg == "" && idArg == 0:
		return l, errors.New("--flow or --flow-id is required")
	case flowArg != "" && idArg != 0:
		return l, errors.New("--flow and --flow-id are exclusive")
	case flowArg != "":
		l.Catalog, l.Name = meta.DefaultCatalog, flowArg
		if cat, name, ok := strings.Cut(flowArg, "/"); ok {
			l.Catalog, l.Name = cat, name
		}
		if !sink.ValidName(l.Catalog) || !sink.ValidName(l.Name) {
			return l, fmt.Errorf("--flow %q: not a valid [catalog/]name", flowArg)
		}
	case idArg > math.MaxUint32:
		return l, fmt.Errorf("--flow-id %d: out of range", idArg)
	default:
		l.ID = meta.FlowID(idArg)
	}
	return l, nil
}

// resolveFlow finds the flow --flow or --flow-id names in src.
func resolveFlow(ctx context.Context, src backup.Source, flowArg string, idArg uint) (backup.Flow, error) {
	l, err := flowLookup(flowArg, idArg)
	if err != nil {
		return backup.Flow{}, err
	}
	f, err := backup.Resolve(ctx, src, l)
	return f, explainLookup(err)
}

// source is the backup as c reaches it.
func (c *connConfig) source(st backup.Store, b sink.Bucket) backup.Source {
	return backup.Source{Store: st, Bucket: b, Prefix: c.GCS.Prefix, Group: c.Group}
}
