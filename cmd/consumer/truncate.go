package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// truncateConfig is everything `consumer truncate` takes.
type truncateConfig struct {
	conn     connConfig
	metrics  opMetrics
	Flow     string
	FlowID   uint
	Until    tsFlag
	DryRun   bool
	Parallel int
	out      output
}

func (c *truncateConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	c.metrics.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.Var(&c.Until, "until", "truncate the log before the newest listed snapshot at or below this TSO, RFC 3339 time or negative duration (required)")
	f.BoolVar(&c.DryRun, "dry-run", false, "print what would be removed and deleted, change nothing")
	f.IntVar(&c.Parallel, "parallel", 16, "metas read and objects deleted at once")
	c.out.RegisterFlags(f)
}

func runTruncate(ctx context.Context, args []string) error {
	fs := newFlagSet("truncate")
	var cfg truncateConfig
	cfg.RegisterFlags(fs)
	st, closeStore, err := cfg.conn.parseOpen(fs, args, func() error {
		if cfg.Until.ts == 0 {
			return errors.New("--until is required")
		}
		_, err := flowLookup(cfg.Flow, cfg.FlowID)
		return err
	})
	if err != nil {
		return err
	}
	defer closeStore()
	b, err := cfg.conn.openBucket(ctx, !cfg.DryRun)
	if err != nil {
		return err
	}
	defer b.Close()
	cfg.metrics.register("truncate")
	start := time.Now()
	err = truncate(ctx, &cfg, st, b)
	if merr := cfg.metrics.finish(start, err); merr != nil && err == nil {
		return merr
	}
	return err
}

// truncateJSON is `consumer truncate --json` (docs/SCRIPTING.md, "JSON
// output").
type truncateJSON struct {
	Flow     flowJSON `json:"flow"`
	DryRun   bool     `json:"dry_run"`
	Snapshot tsJSON   `json:"snapshot"`
	// MetasListed were listed; MetasRemoved are (or would be) removed,
	// MetasKept stay, KeptBelow counts those at or below the snapshot kept,
	// by reason.
	MetasListed      int            `json:"metas_listed"`
	MetasRemoved     int            `json:"metas_removed"`
	MetasKept        int            `json:"metas_kept"`
	KeptBelow        map[string]int `json:"kept_below_snapshot"`
	SnapshotsRemoved int            `json:"snapshots_removed"`
	Tables           []int64        `json:"tables"`
	Objects          []objectJSON   `json:"objects"`
	ObjectBytes      int64          `json:"object_bytes"`
	Warnings         []string       `json:"warnings"`
	Deleted          int            `json:"deleted"`
	DeletedBytes     int64          `json:"deleted_bytes"`
	Seconds          float64        `json:"seconds"`
}

// objectJSON is one object a plan deletes.
type objectJSON struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Kind    string `json:"kind"`
	Flow    string `json:"flow"`
	Created string `json:"created,omitempty"`
}

func objectsOf(objs []sink.GCObject) ([]objectJSON, int64) {
	out := make([]objectJSON, len(objs)) // [] when empty
	var n int64
	for i, o := range objs {
		out[i] = objectJSON{Name: o.Name, Size: o.Size, Kind: o.Kind, Flow: o.Flow}
		if !o.Created.IsZero() {
			out[i].Created = o.Created.UTC().Format(time.RFC3339)
		}
		n += o.Size
	}
	return out, n
}

// truncate runs a parsed `consumer truncate`: backup plans it and checks
// it loses nothing; this prints the plan, then commits it, then deletes the
// objects nothing references any more.
func truncate(ctx context.Context, cfg *truncateConfig, st *meta.Store, b sink.Bucket) error {
	start := time.Now()
	ref, err := resolveFlow(ctx, cfg.conn.source(st, b), cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	name := ref.String()
	cfg.metrics.objects.WithLabelValues(name)
	cfg.metrics.bytes.WithLabelValues(name)
	progress := newProgressLine(os.Stderr)
	watched := watchBucket(b, func(_, read int64) { progress.show("planning the truncate of flow %s: %d objects read", name, read) })
	plan, err := backup.PlanTruncate(ctx, cfg.conn.source(st, watched), ref, cfg.Until.ts, cfg.Parallel)
	progress.done()
	switch {
	case err != nil && cli.Interrupted(ctx):
		return cli.Interruptedf("truncate of flow %s (id %d) stopped while planning: nothing was changed", name, ref.ID)
	case err != nil:
		return explainTruncate(err, &cfg.Until)
	}
	snap := plan.Snapshot
	objs, warnings := plan.Objects(ctx)
	verb := "will"
	if cfg.DryRun {
		verb = "would"
	}
	doc := truncateJSON{Flow: flowOf(ref), DryRun: cfg.DryRun, Snapshot: tsOf(snap.TS), MetasListed: plan.Listed, MetasRemoved: len(plan.Metas),
		MetasKept: plan.Kept, KeptBelow: map[string]int{}, SnapshotsRemoved: len(plan.Snapshots), Tables: nonNil(plan.Tables()), Warnings: nonNil(warnings)}
	maps.Copy(doc.KeptBelow, plan.KeptOld)
	doc.Objects, doc.ObjectBytes = objectsOf(objs)
	cfg.out.printf("truncate flow %s (id %d) before snapshot %d (%s): %s remove %d of %d metas and %d older snapshots, then delete %s\n",
		name, ref.ID, snap.TS, tsTime(snap.TS), verb, len(plan.Metas), plan.Listed, len(plan.Snapshots), objectsSummary(objs, plan.Tables()))
	for reason, n := range plan.KeptOld {
		cfg.out.printf("keeping %d metas at or below the snapshot: %s\n", n, reason)
	}
	for _, w := range warnings {
		fmt.Fprintf(os.Stderr, "warning: %s\n", w)
	}
	if cfg.DryRun {
		for _, o := range objs {
			cfg.out.printf("would delete %s (%d bytes)\n", o.Name, o.Size)
		}
		doc.Seconds = time.Since(start).Seconds()
		return cfg.out.result(doc)
	}
	if cli.Interrupted(ctx) {
		return cli.Interruptedf("truncate of flow %s (id %d) stopped before its commit: nothing was changed", name, ref.ID)
	}
	done, err := plan.Commit(ctx, st)
	switch {
	case err != nil && cli.Interrupted(ctx):
		return cli.Interruptedf("truncate of flow %s (id %d) stopped at its commit: nothing was changed unless 'consumer flows' shows truncated_before %d; "+
			"run the truncate again, or gc for its objects", name, ref.ID, snap.TS)
	case err != nil:
		return explainTruncate(err, &cfg.Until)
	}
	if done.Removed.HistoryErr != nil {
		fmt.Fprintf(os.Stderr, "warning: pruning the coverage history below the truncation point stopped short (the next truncate prunes the rest): %v\n", done.Removed.HistoryErr)
	}
	if err := writeCatalogs(ctx, &cfg.conn, st, b); err != nil {
		return fmt.Errorf("truncate is recorded in Redis, nothing deleted (gc deletes the objects once the catalogs are written): %w", err)
	}
	cfg.out.printf("recorded truncated_before = %d; removed %d metas and %d snapshots from Redis; deleting %s\n",
		snap.TS, len(done.Removed.Metas), len(done.Removed.Snapshots), objectsSummary(done.Objects, plan.Tables()))
	var deleted atomic.Int64
	n, bytes, derr := sink.DeleteObjects(ctx, b, done.Objects, cfg.Parallel, func(o sink.GCObject) {
		cfg.metrics.objects.WithLabelValues(name).Inc()
		cfg.metrics.bytes.WithLabelValues(name).Add(float64(o.Size))
		progress.show("deleted %d of %d truncated objects of flow %s", deleted.Add(1), len(done.Objects), name)
	})
	progress.done()
	doc.Objects, doc.ObjectBytes = objectsOf(done.Objects)
	doc.MetasRemoved, doc.SnapshotsRemoved = len(done.Removed.Metas), len(done.Removed.Snapshots)
	doc.Deleted, doc.DeletedBytes, doc.Seconds = n, bytes, time.Since(start).Seconds()
	if derr != nil && cli.Interrupted(ctx) {
		return cli.Interruptedf("truncate of flow %s (id %d) is committed (truncated_before %d) but stopped deleting after %d of %d objects (%s): "+
			"the rest are unreferenced now and gc deletes them", name, ref.ID, snap.TS, n, len(done.Objects), humanBytes(bytes))
	}
	cfg.out.printf("truncated flow %s (id %d) before %d: deleted %d objects (%s) in %s; %d metas stay listed\n",
		name, ref.ID, snap.TS, n, humanBytes(bytes), time.Since(start).Round(time.Millisecond), plan.Kept)
	if derr != nil {
		return fmt.Errorf("deleting the truncated objects (the rest are unreferenced now; run gc): %w", derr)
	}
	return cfg.out.result(doc)
}

// explainTruncate words a truncate's refusals; until is --until.
func explainTruncate(err error, until *tsFlag) error {
	var (
		ns *backup.NoSnapshotError
		tp *backup.TruncatedPastError
	)
	switch {
	case errors.As(err, &ns):
		msg := "it has none"
		if ns.Oldest != 0 {
			msg = fmt.Sprintf("its oldest is at %d (%s)", ns.Oldest, tsTime(ns.Oldest))
		}
		return fmt.Errorf("flow %s/%s (id %d) has no listed snapshot at or below --until %s (%s): take one with 'consumer snapshot' first",
			ns.Flow.Catalog, ns.Flow.Name, ns.Flow.ID, until.describe(), msg)
	case errors.As(err, &tp):
		return fmt.Errorf("flow %s (id %d) is already truncated before %d (%s), past the snapshot at %d: nothing to do",
			tp.Flow, tp.Flow.ID, tp.TruncatedBefore, tsTime(tp.TruncatedBefore), tp.Snapshot)
	}
	return err
}

// objectsSummary renders "N objects (B) of tables t1,t2".
func objectsSummary(objs []sink.GCObject, tables []int64) string {
	var n int64
	for _, o := range objs {
		n += o.Size
	}
	s := fmt.Sprintf("%d objects (%s)", len(objs), humanBytes(n))
	if len(tables) > 0 {
		ts := make([]string, len(tables))
		for i, t := range tables {
			ts[i] = fmt.Sprint(t)
		}
		s += " of tables " + strings.Join(ts, ",")
	}
	return s
}

// humanBytes renders n bytes with a binary unit.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
