package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// gcConfig is everything `consumer gc` takes.
type gcConfig struct {
	conn     connConfig
	metrics  opMetrics
	mem      opMemory
	Grace    time.Duration
	DryRun   bool
	Parallel int
}

// minSafeGrace is the grace below which gc warns: it must exceed the
// longest time between a cycle's upload and its commit (docs/RESTORE.md,
// "Retention: truncate and gc").
const minSafeGrace = 30 * time.Minute

func (c *gcConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	c.metrics.RegisterFlags(f)
	c.mem.RegisterFlags(f)
	f.DurationVar(&c.Grace, "grace", time.Hour, "never delete an object younger than this; keep it above the consumers' --max-commit-age and the longest snapshot run")
	f.BoolVar(&c.DryRun, "dry-run", false, "list what would be deleted, delete nothing")
	f.IntVar(&c.Parallel, "parallel", 16, "metas read and objects deleted at once")
}

func runGC(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consumer gc", flag.ContinueOnError)
	var cfg gcConfig
	cfg.RegisterFlags(fs)
	st, closeStore, err := cfg.conn.parseOpen(fs, args)
	if err != nil {
		return err
	}
	defer closeStore()
	if cfg.Grace < 0 {
		return cli.Usagef("--grace %v: must not be negative", cfg.Grace)
	}
	cfg.mem.apply()
	b, err := cfg.conn.openBucket(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	cfg.metrics.register("gc")
	start := time.Now()
	err = gc(ctx, &cfg, st, b)
	if merr := cfg.metrics.finish(start, err); merr != nil && err == nil {
		return merr
	}
	return err
}

// gc runs a parsed `consumer gc`: sink.PlanGC decides what nothing
// references (backup.GCRefs), this prints it and deletes it.
func gc(ctx context.Context, cfg *gcConfig, st *meta.Store, b sink.Bucket) error {
	start := time.Now()
	if cfg.Grace < minSafeGrace {
		fmt.Printf("warning: --grace %v is below %v: a cycle that commits later than that after its upload would lose its objects (see docs/RESTORE.md, \"Retention: truncate and gc\")\n",
			cfg.Grace, minSafeGrace)
	}
	if !cfg.DryRun {
		if err := writeCatalogs(ctx, &cfg.conn, st, b); err != nil {
			return fmt.Errorf("gc deletes nothing before the catalogs are written: %w", err)
		}
	}
	plan, err := sink.PlanGC(ctx, b, sink.GCOptions{Prefix: cfg.conn.GCS.Prefix, Group: cfg.conn.Group, Grace: cfg.Grace,
		Parallel: cfg.mem.streams(cfg.Parallel), Refs: backup.GCRefs(st)})
	if err != nil {
		return err
	}
	for _, w := range plan.Warnings {
		fmt.Printf("warning: %s\n", w)
	}
	flows := slices.Sorted(maps.Keys(plan.Storage))
	for _, f := range flows {
		s := plan.Storage[f]
		cfg.metrics.logBytes.WithLabelValues(f).Set(float64(s.LogBytes))
		cfg.metrics.snapBytes.WithLabelValues(f).Set(float64(s.SnapshotBytes))
		cfg.metrics.garbage.WithLabelValues(f).Set(float64(s.GarbageBytes))
		cfg.metrics.objects.WithLabelValues(f)
		cfg.metrics.bytes.WithLabelValues(f)
	}
	byKind := map[string]int{}
	for _, o := range plan.Delete {
		byKind[o.Kind]++
	}
	verb := "will"
	if cfg.DryRun {
		verb = "would"
	}
	fmt.Printf("gc under gs://%s/%s: listed %d objects (%s) of %d flows; %s delete %d unreferenced objects (%s: %d data, %d meta, %d snapshot, %d catalog) older than %v; "+
		"keeping %d unreferenced objects (%s) younger than that, %d checkpoint or foreign objects and %d objects of flow ids this Redis never had or of other consumer groups\n",
		cfg.conn.GCS.Bucket, cfg.conn.GCS.Prefix, plan.ListedObjects, humanBytes(plan.ListedBytes), len(flows), verb,
		len(plan.Delete), humanBytes(plan.DeleteBytes), byKind[sink.GCData], byKind[sink.GCMeta], byKind[sink.GCSnapshot], byKind[sink.GCCatalog], cfg.Grace,
		plan.Young, humanBytes(plan.YoungBytes), plan.Kept, plan.Unknown)
	for _, f := range flows {
		s := plan.Storage[f]
		fmt.Printf("  %s: log %s, snapshots %s, unreferenced %s\n", f, humanBytes(s.LogBytes), humanBytes(s.SnapshotBytes), humanBytes(s.GarbageBytes))
	}
	if cfg.DryRun {
		for _, o := range plan.Delete {
			fmt.Printf("would delete %s (%d bytes, %s, created %s)\n", o.Name, o.Size, o.Kind, o.Created.UTC().Format(time.RFC3339))
		}
		return nil
	}
	n, bytes, err := sink.DeleteObjects(ctx, b, plan.Delete, cfg.Parallel, func(o sink.GCObject) {
		cfg.metrics.objects.WithLabelValues(o.Flow).Inc()
		cfg.metrics.bytes.WithLabelValues(o.Flow).Add(float64(o.Size))
	})
	fmt.Printf("gc deleted %d objects (%s) in %s\n", n, humanBytes(bytes), time.Since(start).Round(time.Millisecond))
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	return nil
}
