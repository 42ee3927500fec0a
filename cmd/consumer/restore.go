package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/sink"
)

// restoreConfig is everything `consumer restore` takes.
type restoreConfig struct {
	conn      connConfig
	Flow      string
	FlowID    uint
	TS        uint64
	Out       string
	Tables    string
	TempDir   string
	MaxMemory cli.Size
	Parallel  int
}

func (c *restoreConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.Uint64Var(&c.TS, "ts", 0, "restore as of this TSO (default: the flow's checkpoint; may not exceed it)")
	f.StringVar(&c.Out, "out", "", "directory to write <table_id>.jsonl into")
	f.StringVar(&c.Tables, "tables", "", "comma-separated table ids to restore (default: all)")
	f.StringVar(&c.TempDir, "temp-dir", os.TempDir(), "directory for sorted runs while restoring")
	c.MaxMemory = 256 << 20
	f.Var(&c.MaxMemory, "max-memory", "entries buffered in memory before spilling sorted runs to --temp-dir")
	f.IntVar(&c.Parallel, "parallel", 4, "chunks read at once")
}

func (c *restoreConfig) tables() (map[int64]bool, error) {
	if c.Tables == "" {
		return nil, nil
	}
	out := map[int64]bool{}
	for _, s := range strings.Split(c.Tables, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--tables: %q is not a table id", s)
		}
		out[id] = true
	}
	return out, nil
}

func runRestore(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consumer restore", flag.ContinueOnError)
	var cfg restoreConfig
	cfg.RegisterFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := cfg.conn.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	if cfg.Out == "" {
		return fmt.Errorf("--out is required")
	}
	tables, err := cfg.tables()
	if err != nil {
		return err
	}
	st, closeStore, err := cfg.conn.openStore()
	if err != nil {
		return err
	}
	defer closeStore()
	b, err := cfg.conn.openBucket(ctx)
	if err != nil {
		return err
	}
	defer b.Close()

	ref, err := resolveFlow(ctx, st, cfg.conn.GCS.Prefix, cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	ckpt, err := checkpoint(ctx, st, b, &cfg.conn, ref)
	if err != nil {
		return err
	}
	ts := cfg.TS
	switch {
	case ckpt == 0:
		return fmt.Errorf("flow %s/%s (id %d) has no checkpoint yet: nothing is restorable", ref.Catalog, ref.Name, ref.ID)
	case ts == 0:
		ts = ckpt
	case ts > ckpt:
		return fmt.Errorf("--ts %d is past the flow's checkpoint %d (%s): later data may still be incomplete",
			ts, ckpt, tsTime(ckpt))
	}
	start := time.Now()
	stats, err := sink.Restore(ctx, sink.RestoreOptions{
		Bucket: b, MetaPaths: ref.Metas, TS: ts, Tables: tables,
		OutDir: cfg.Out, TempDir: cfg.TempDir, MaxMemory: int64(cfg.MaxMemory), Parallel: cfg.Parallel,
	})
	if err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	mb := float64(stats.LogBytes) / (1 << 20)
	fmt.Printf("restored flow %s/%s (id %d) as of %d (%s) into %s\n", ref.Catalog, ref.Name, ref.ID, ts, tsTime(ts), cfg.Out)
	fmt.Printf("%d tables, %d keys, %d chunks from %d metas, %.1f MiB of log in %.2fs (%.1f MiB/s)\n",
		stats.Tables, stats.Keys, stats.Chunks, len(ref.Metas), mb, secs, mb/max(secs, 1e-9))
	return nil
}
