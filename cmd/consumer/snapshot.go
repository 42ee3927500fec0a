package main

import (
	"context"
	"flag"
	"fmt"
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
	out       output
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
	c.out.RegisterFlags(f)
}

func runSnapshot(ctx context.Context, args []string) error {
	fs := newFlagSet("snapshot")
	var cfg snapshotConfig
	cfg.RegisterFlags(fs)
	st, closeStore, err := cfg.conn.parseOpen(fs, args, func() error {
		_, err := flowLookup(cfg.Flow, cfg.FlowID)
		return err
	})
	if err != nil {
		return err
	}
	defer closeStore()
	// As for restore: --max-memory is also the Go soft memory limit
	// (GOMEMLIMIT wins).
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(cfg.MaxMemory))
	}
	b, err := cfg.conn.openBucket(ctx, true)
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

// snapshotJSON is `consumer snapshot --json` (docs/SCRIPTING.md, "JSON
// output").
type snapshotJSON struct {
	Flow flowJSON `json:"flow"`
	AsOf tsJSON   `json:"as_of"`
	// Existing is the snapshot.meta of the snapshot listed at the ts
	// already, when nothing was written; else MetaPath is the new one's.
	Existing     string    `json:"existing,omitempty"`
	MetaPath     string    `json:"meta_path,omitempty"`
	Tables       int       `json:"tables"`
	Keys         int64     `json:"keys"`
	Objects      int       `json:"objects"`
	Bytes        int64     `json:"bytes"`
	Chunks       int       `json:"chunks"`
	LogB         int64     `json:"log_bytes"`
	Seconds      float64   `json:"seconds"`
	FromSnapshot int       `json:"from_snapshot"`
	Snapshot     tsJSON    `json:"snapshot"`
	NoValue      int64     `json:"no_value_keys"`
	LeftOut      []leftOut `json:"left_out"`
}

// snapshot runs a parsed `consumer snapshot`: backup.Snapshot decides what
// it writes, this prints it and counts it in the metrics.
func snapshot(ctx context.Context, cfg *snapshotConfig, st *meta.Store, b sink.Bucket) error {
	l, err := flowLookup(cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	r := &reader{ts: &cfg.TS, verb: "snapshotting", noun: "snapshot", out: &cfg.out}
	progress := newProgressLine(os.Stderr)
	var start time.Time
	notify := func(e backup.Event) {
		s, ok := e.(backup.Snapshotting)
		if !ok {
			r.notify(e)
			return
		}
		cfg.out.printf("snapshot of flow %s/%s (id %d) as of %d (%s): %d tables, from %d metas\n", s.Flow.Catalog, s.Flow.Name, s.Flow.ID, s.TS, tsTime(s.TS), s.Tables, s.Metas)
		name := s.Flow.String()
		cfg.metrics.objects.WithLabelValues(name)
		cfg.metrics.bytes.WithLabelValues(name)
		cfg.metrics.readBytes.WithLabelValues(name)
		start = time.Now()
	}
	res, err := backup.Snapshot(ctx, cfg.conn.source(st, b), st, backup.SnapshotRequest{
		Request: backup.Request{Flow: l, TS: cfg.TS.ts, MaxClockSkew: cfg.conn.MaxClockSkew, Notify: notify},
		TempDir: cfg.TempDir, MaxMemory: int64(cfg.MaxMemory), Parallel: cfg.Parallel,
		Progress: func(s sink.SnapshotProgress) {
			progress.show("read %d/%d chunks (%.1f MiB of log), %d keys written, %d objects uploaded",
				s.Chunks, s.ChunksTotal, float64(s.LogBytes)/(1<<20), s.Keys, s.Objects)
		},
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
	case err != nil && cli.Interrupted(ctx):
		return cli.Interruptedf("snapshot of flow %s (id %d) as of %d (%s) stopped before it was listed: restores ignore it; "+
			"removed its temp files from --temp-dir; the %d objects it uploaded are unreferenced, and gc deletes them once older than its --grace",
			f, f.ID, ts, tsTime(ts), stats.Objects)
	case err != nil:
		return r.explain(err)
	}
	doc := snapshotJSON{Flow: flowOf(f), AsOf: tsOf(ts), Existing: res.Existing, MetaPath: stats.MetaPath, LeftOut: nonNil(r.leftOut)}
	if res.Existing != "" {
		cfg.out.printf("flow %s/%s (id %d) has a snapshot as of %d (%s) already: %s\n", f.Catalog, f.Name, f.ID, ts, tsTime(ts), res.Existing)
		return cfg.out.result(doc)
	}
	secs := time.Since(start).Seconds()
	mb := float64(stats.LogBytes) / (1 << 20)
	cfg.out.printf("listed snapshot %s\n", stats.MetaPath)
	if err := writeCatalogs(ctx, &cfg.conn, st, b); err != nil {
		return fmt.Errorf("snapshot %s is listed; %w", stats.MetaPath, err)
	}
	cfg.out.printf("%d tables, %d keys, %d objects, %.1f MiB written; read %.1f MiB of log from %d chunks in %.2fs (%.1f MiB/s)\n",
		stats.Tables, stats.Keys, stats.Objects, float64(stats.Bytes)/(1<<20), mb, stats.Chunks, secs, mb/max(secs, 1e-9))
	if stats.FromSnapshot > 0 {
		cfg.out.printf("%d tables started from the snapshot at %d (%s)\n", stats.FromSnapshot, stats.SnapshotTS, tsTime(stats.SnapshotTS))
	}
	if stats.NoValue > 0 {
		cfg.out.printf("%d keys recorded without value: their value was prewritten before their table's coverage window began (a restore leaves them out)\n", stats.NoValue)
	}
	doc.Tables, doc.Keys, doc.Objects, doc.Bytes, doc.Chunks, doc.LogB, doc.Seconds = stats.Tables, stats.Keys, stats.Objects, stats.Bytes, stats.Chunks, stats.LogBytes, secs
	doc.FromSnapshot, doc.Snapshot, doc.NoValue = stats.FromSnapshot, tsOf(stats.SnapshotTS), stats.NoValue
	return cfg.out.result(doc)
}
