package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync/atomic"
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
	out      output
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
	c.out.RegisterFlags(f)
}

func runGC(ctx context.Context, args []string) error {
	fs := newFlagSet("gc")
	var cfg gcConfig
	cfg.RegisterFlags(fs)
	st, closeStore, err := cfg.conn.parseOpen(fs, args, func() error {
		if cfg.Grace < 0 {
			return fmt.Errorf("--grace %v: must not be negative", cfg.Grace)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeStore()
	cfg.mem.apply()
	b, err := cfg.conn.openBucket(ctx, !cfg.DryRun)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := refuseLostState(ctx, st, b, cfg.conn); err != nil {
		return err
	}
	cfg.metrics.register("gc")
	start := time.Now()
	err = gc(ctx, &cfg, st, b)
	if merr := cfg.metrics.finish(start, err); merr != nil && err == nil {
		return merr
	}
	return err
}

// gcJSON is `consumer gc --json` (docs/SCRIPTING.md, "JSON output").
type gcJSON struct {
	Bucket        string `json:"bucket"`
	Prefix        string `json:"prefix"`
	DryRun        bool   `json:"dry_run"`
	GraceSeconds  int64  `json:"grace_seconds"`
	ListedObjects int    `json:"listed_objects"`
	ListedBytes   int64  `json:"listed_bytes"`
	// Objects are the unreferenced objects older than the grace: deleted,
	// or with DryRun those that would be.
	Objects     []objectJSON `json:"objects"`
	ObjectBytes int64        `json:"object_bytes"`
	Young       int          `json:"young_objects"`
	YoungBytes  int64        `json:"young_bytes"`
	Kept        int          `json:"kept_objects"`
	Unknown     int          `json:"unknown_flow_objects"`
	// Flows is each flow directory's storage, by catalog/flow.
	Flows        map[string]flowStorageJSON `json:"flows"`
	Warnings     []string                   `json:"warnings"`
	Deleted      int                        `json:"deleted"`
	DeletedBytes int64                      `json:"deleted_bytes"`
	Seconds      float64                    `json:"seconds"`
}

// flowStorageJSON is sink.FlowStorage in gc's JSON.
type flowStorageJSON struct {
	LogBytes      int64 `json:"log_bytes"`
	SnapshotBytes int64 `json:"snapshot_bytes"`
	GarbageBytes  int64 `json:"unreferenced_bytes"`
}

// gc runs a parsed `consumer gc`: sink.PlanGC decides what nothing
// references (backup.GCRefs), this prints it and deletes it.
func gc(ctx context.Context, cfg *gcConfig, st *meta.Store, b sink.Bucket) error {
	start := time.Now()
	var warnings []string
	if cfg.Grace < minSafeGrace {
		warnings = append(warnings, fmt.Sprintf("--grace %v is below %v: a cycle that commits later than that after its upload would lose its objects (see docs/RESTORE.md, \"Retention: truncate and gc\")",
			cfg.Grace, minSafeGrace))
	}
	if !cfg.DryRun {
		if err := writeCatalogs(ctx, &cfg.conn, st, b); err != nil {
			return fmt.Errorf("gc deletes nothing before the catalogs are written: %w", err)
		}
	}
	progress := newProgressLine(os.Stderr)
	watched := watchBucket(b, func(listed, read int64) {
		progress.show("gc: listed %d objects, read %d metas and snapshots", listed, read)
	})
	plan, err := sink.PlanGC(ctx, watched, sink.GCOptions{Prefix: cfg.conn.GCS.Prefix, Group: cfg.conn.Group, Grace: cfg.Grace,
		Parallel: cfg.mem.streams(cfg.Parallel), Refs: backup.GCRefs(st)})
	progress.done()
	switch {
	case err != nil && cli.Interrupted(ctx):
		return cli.Interruptedf("gc stopped while planning, after listing %d objects: nothing was deleted", watched.listed.Load())
	case err != nil:
		return err
	}
	warnings = append(warnings, plan.Warnings...)
	for _, w := range warnings {
		fmt.Fprintf(os.Stderr, "warning: %s\n", w)
	}
	flows := slices.Sorted(maps.Keys(plan.Storage))
	doc := gcJSON{Bucket: cfg.conn.GCS.Bucket, Prefix: cfg.conn.GCS.Prefix, DryRun: cfg.DryRun, GraceSeconds: int64(cfg.Grace.Seconds()),
		ListedObjects: plan.ListedObjects, ListedBytes: plan.ListedBytes, Young: plan.Young, YoungBytes: plan.YoungBytes,
		Kept: plan.Kept, Unknown: plan.Unknown, Flows: map[string]flowStorageJSON{}, Warnings: nonNil(warnings)}
	doc.Objects, doc.ObjectBytes = objectsOf(plan.Delete)
	for _, f := range flows {
		s := plan.Storage[f]
		doc.Flows[f] = flowStorageJSON{s.LogBytes, s.SnapshotBytes, s.GarbageBytes}
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
	cfg.out.printf("gc under gs://%s/%s: listed %d objects (%s) of %d flows; %s delete %d unreferenced objects (%s: %d data, %d meta, %d snapshot, %d catalog) older than %v; "+
		"keeping %d unreferenced objects (%s) younger than that, %d checkpoint or foreign objects and %d objects of flow ids this Redis never had or of other consumer groups\n",
		cfg.conn.GCS.Bucket, cfg.conn.GCS.Prefix, plan.ListedObjects, humanBytes(plan.ListedBytes), len(flows), verb,
		len(plan.Delete), humanBytes(plan.DeleteBytes), byKind[sink.GCData], byKind[sink.GCMeta], byKind[sink.GCSnapshot], byKind[sink.GCCatalog], cfg.Grace,
		plan.Young, humanBytes(plan.YoungBytes), plan.Kept, plan.Unknown)
	for _, f := range flows {
		s := plan.Storage[f]
		cfg.out.printf("  %s: log %s, snapshots %s, unreferenced %s\n", f, humanBytes(s.LogBytes), humanBytes(s.SnapshotBytes), humanBytes(s.GarbageBytes))
	}
	if cfg.DryRun {
		for _, o := range plan.Delete {
			cfg.out.printf("would delete %s (%d bytes, %s, created %s)\n", o.Name, o.Size, o.Kind, o.Created.UTC().Format(time.RFC3339))
		}
		doc.Seconds = time.Since(start).Seconds()
		return cfg.out.result(doc)
	}
	var deleted atomic.Int64
	n, bytes, err := sink.DeleteObjects(ctx, b, plan.Delete, cfg.Parallel, func(o sink.GCObject) {
		cfg.metrics.objects.WithLabelValues(o.Flow).Inc()
		cfg.metrics.bytes.WithLabelValues(o.Flow).Add(float64(o.Size))
		progress.show("gc: deleted %d of %d objects", deleted.Add(1), len(plan.Delete))
	})
	progress.done()
	doc.Deleted, doc.DeletedBytes, doc.Seconds = n, bytes, time.Since(start).Seconds()
	if err != nil && cli.Interrupted(ctx) {
		return cli.Interruptedf("gc stopped after deleting %d of %d unreferenced objects (%s); the next gc deletes the rest", n, len(plan.Delete), humanBytes(bytes))
	}
	cfg.out.printf("gc deleted %d objects (%s) in %s\n", n, humanBytes(bytes), time.Since(start).Round(time.Millisecond))
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	return cfg.out.result(doc)
}
