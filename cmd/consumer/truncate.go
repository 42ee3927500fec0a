package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
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
}

func (c *truncateConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	c.metrics.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.Var(&c.Until, "until", "truncate the log before the newest listed snapshot at or below this TSO, RFC 3339 time or negative duration (required)")
	f.BoolVar(&c.DryRun, "dry-run", false, "print what would be removed and deleted, change nothing")
	f.IntVar(&c.Parallel, "parallel", 16, "metas read and objects deleted at once")
}

func runTruncate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consumer truncate", flag.ContinueOnError)
	var cfg truncateConfig
	cfg.RegisterFlags(fs)
	st, closeStore, err := cfg.conn.parseOpen(fs, args)
	if err != nil {
		return err
	}
	defer closeStore()
	if cfg.Until.ts == 0 {
		return cli.Usagef("--until is required")
	}
	b, err := cfg.conn.openBucket(ctx)
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

// truncate runs a parsed `consumer truncate`: backup plans it and checks
// it loses nothing; this prints the plan, then commits it, then deletes the
// objects nothing references any more.
func truncate(ctx context.Context, cfg *truncateConfig, st *meta.Store, b sink.Bucket) error {
	start := time.Now()
	ref, err := cfg.conn.resolveFlow(ctx, st, cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	name := ref.String()
	cfg.metrics.objects.WithLabelValues(name)
	cfg.metrics.bytes.WithLabelValues(name)
	plan, err := backup.PlanTruncate(ctx, cfg.conn.source(st, b), ref, cfg.Until.ts, cfg.Parallel)
	if err != nil {
		return explainTruncate(err, &cfg.Until)
	}
	snap := plan.Snapshot
	objs, warnings := plan.Objects(ctx)
	verb := "will"
	if cfg.DryRun {
		verb = "would"
	}
	fmt.Printf("truncate flow %s (id %d) before snapshot %d (%s): %s remove %d of %d metas and %d older snapshots, then delete %s\n",
		name, ref.ID, snap.TS, tsTime(snap.TS), verb, len(plan.Metas), plan.Listed, len(plan.Snapshots), objectsSummary(objs, plan.Tables()))
	printKept(plan)
	for _, w := range warnings {
		fmt.Printf("warning: %s\n", w)
	}
	if cfg.DryRun {
		for _, o := range objs {
			fmt.Printf("would delete %s (%d bytes)\n", o.Name, o.Size)
		}
		return nil
	}

	done, err := plan.Commit(ctx, st)
	if err != nil {
		return explainTruncate(err, &cfg.Until)
	}
	if done.Removed.HistoryErr != nil {
		fmt.Fprintf(os.Stderr, "pruning the coverage history below the truncation point stopped short (the next truncate prunes the rest): %v\n", done.Removed.HistoryErr)
	}
	fmt.Printf("recorded truncated_before = %d; removed %d metas and %d snapshots from Redis; deleting %s\n",
		snap.TS, len(done.Removed.Metas), len(done.Removed.Snapshots), objectsSummary(done.Objects, plan.Tables()))
	n, bytes, derr := sink.DeleteObjects(ctx, b, done.Objects, cfg.Parallel, func(o sink.GCObject) {
		cfg.metrics.objects.WithLabelValues(name).Inc()
		cfg.metrics.bytes.WithLabelValues(name).Add(float64(o.Size))
	})
	fmt.Printf("truncated flow %s (id %d) before %d: deleted %d objects (%s) in %s; %d metas stay listed\n",
		name, ref.ID, snap.TS, n, humanBytes(bytes), time.Since(start).Round(time.Millisecond), plan.Kept)
	if derr != nil {
		return fmt.Errorf("deleting the truncated objects (the rest are unreferenced now; run gc): %w", derr)
	}
	return nil
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

func printKept(p *backup.TruncatePlan) {
	for reason, n := range p.KeptOld {
		fmt.Printf("keeping %d metas at or below the snapshot: %s\n", n, reason)
	}
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
