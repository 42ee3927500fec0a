package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// snapshotConfig is everything `consumer snapshot` takes.
type snapshotConfig struct {
	conn      connConfig
	Flow      string
	FlowID    uint
	TS        tsFlag
	TempDir   string
	MaxMemory cli.Size
	Parallel  int
	metrics   opMetrics
}

func (c *snapshotConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.Var(&c.TS, "ts", "snapshot as of this TSO, RFC 3339 time or negative duration ago (default: the flow's checkpoint; may not exceed it)")
	f.StringVar(&c.TempDir, "temp-dir", os.TempDir(), "directory for sorted runs and the objects being built")
	c.MaxMemory = 256 << 20
	f.Var(&c.MaxMemory, "max-memory", "entries buffered in memory before spilling sorted runs to --temp-dir; also the Go soft memory limit unless GOMEMLIMIT is set")
	f.IntVar(&c.Parallel, "parallel", 4, "log chunks read at once")
	c.metrics.RegisterFlags(f)
}

func runSnapshot(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consumer snapshot", flag.ContinueOnError)
	var cfg snapshotConfig
	cfg.RegisterFlags(fs)
	st, closeStore, err := cfg.conn.parseOpen(fs, args)
	if err != nil {
		return err
	}
	defer closeStore()
	// As for restore: --max-memory is also the Go soft memory limit
	// (GOMEMLIMIT wins).
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(cfg.MaxMemory))
	}
	b, err := cfg.conn.openBucket(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	cfg.metrics.register("snapshot")
	start := time.Now()
	err = snapshot(ctx, &cfg, st, b)
	if merr := cfg.metrics.finish(start, err); merr != nil && err == nil {
		return merr
	}
	return err
}

// snapshot runs a parsed `consumer snapshot`: backup.Snapshot decides what
// it writes, this prints it and counts it in the metrics.
func snapshot(ctx context.Context, cfg *snapshotConfig, st *meta.Store, b sink.Bucket) error {
	l, err := flowLookup(cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	r := reader{ts: &cfg.TS, verb: "snapshotting", noun: "snapshot"}
	progress := newProgressLine(os.Stderr)
	var start time.Time
	notify := func(e backup.Event) {
		s, ok := e.(backup.Snapshotting)
		if !ok {
			r.notify(e)
			return
		}
		fmt.Printf("snapshot of flow %s/%s (id %d) as of %d (%s): %d tables, from %d metas\n", s.Flow.Catalog, s.Flow.Name, s.Flow.ID, s.TS, tsTime(s.TS), s.Tables, s.Metas)
		name := s.Flow.String()
		cfg.metrics.objects.WithLabelValues(name)
		cfg.metrics.bytes.WithLabelValues(name)
		cfg.metrics.readBytes.WithLabelValues(name)
		start = time.Now()
	}
	res, err := backup.Snapshot(ctx, cfg.conn.source(st, b), st, backup.SnapshotRequest{
		Request: backup.Request{Flow: l, TS: cfg.TS.ts, MaxClockSkew: cfg.conn.MaxClockSkew, Notify: notify},
		TempDir: cfg.TempDir, MaxMemory: int64(cfg.MaxMemory), Parallel: cfg.Parallel, Progress: progress.snapshot,
	})
	progress.done()
	f, ts, stats := res.Flow, res.TS, res.Stats
	if !start.IsZero() {
		name := f.String()
		cfg.metrics.objects.WithLabelValues(name).Add(float64(stats.Objects))
		cfg.metrics.bytes.WithLabelValues(name).Add(float64(stats.Bytes))
		cfg.metrics.readBytes.WithLabelValues(name).Add(float64(stats.LogBytes))
	}
	switch {
	case err != nil:
		return r.explain(err)
	case res.Existing != "":
		fmt.Printf("flow %s/%s (id %d) has a snapshot as of %d (%s) already: %s\n", f.Catalog, f.Name, f.ID, ts, tsTime(ts), res.Existing)
		return nil
	}
	secs := time.Since(start).Seconds()
	mb := float64(stats.LogBytes) / (1 << 20)
	fmt.Printf("listed snapshot %s\n", stats.MetaPath)
	if err := writeCatalogs(ctx, &cfg.conn, st, b); err != nil {
		return fmt.Errorf("snapshot %s is listed; %w", stats.MetaPath, err)
	}
	fmt.Printf("%d tables, %d keys, %d objects, %.1f MiB written; read %.1f MiB of log from %d chunks in %.2fs (%.1f MiB/s)\n",
		stats.Tables, stats.Keys, stats.Objects, float64(stats.Bytes)/(1<<20), mb, stats.Chunks, secs, mb/max(secs, 1e-9))
	if stats.FromSnapshot > 0 {
		fmt.Printf("%d tables started from the snapshot at %d (%s)\n", stats.FromSnapshot, stats.SnapshotTS, tsTime(stats.SnapshotTS))
	}
	if stats.NoValue > 0 {
		fmt.Printf("%d keys recorded without value: their value was prewritten before their table's coverage window began (a restore leaves them out)\n", stats.NoValue)
	}
	return nil
}

// progressLine redraws one line on a terminal; elsewhere it stays silent.
type progressLine struct {
	w    io.Writer
	on   bool
	last time.Time
}

func newProgressLine(f *os.File) *progressLine {
	st, err := f.Stat()
	return &progressLine{w: f, on: err == nil && st.Mode()&os.ModeCharDevice != 0}
}

func (p *progressLine) snapshot(s sink.SnapshotProgress) {
	if !p.on || time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\r\033[Kread %d/%d chunks (%.1f MiB of log), %d keys written, %d objects uploaded",
		s.Chunks, s.ChunksTotal, float64(s.LogBytes)/(1<<20), s.Keys, s.Objects)
}

// done clears the line.
func (p *progressLine) done() {
	if p.on && !p.last.IsZero() {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
