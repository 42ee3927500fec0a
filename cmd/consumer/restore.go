package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/sink"
)

// restoreConfig is everything `consumer restore` takes.
type restoreConfig struct {
	conn      connConfig
	Flow      string
	FlowID    uint
	TS        tsFlag
	Out       string
	Force     bool
	Select    backup.SelectionFlags
	TempDir   string
	MaxMemory cli.Size
	Parallel  int
	// Snapshots off reads the log alone (a cross-check, or a way around a
	// damaged snapshot while the log is still whole).
	Snapshots bool
	// FromBucket reads the backup from the bucket alone, without Redis.
	FromBucket bool
	out        output
}

func (c *restoreConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.Var(&c.TS, "ts", "restore as of this TSO, RFC 3339 time (2026-12-01T10:00:00Z) or negative duration ago (-15m) (default: the flow's checkpoint; may not exceed it)")
	f.StringVar(&c.Out, "out", "", "directory to write <table_id>.jsonl into (created 0700 if missing; must be empty unless --force)")
	f.BoolVar(&c.Force, "force", false, "write into a non-empty --out, replacing its <table_id>.jsonl files (links are replaced, never followed)")
	c.Select.RegisterFlags(f)
	f.StringVar(&c.TempDir, "temp-dir", os.TempDir(), "directory for sorted runs while restoring")
	c.MaxMemory = 256 << 20
	f.Var(&c.MaxMemory, "max-memory", "entries buffered in memory before spilling sorted runs to --temp-dir; also the Go soft memory limit unless GOMEMLIMIT is set")
	f.IntVar(&c.Parallel, "parallel", 4, "chunks read at once")
	f.BoolVar(&c.FromBucket, "from-bucket", false, "read the backup from the bucket alone, without Redis: the flow's catalog, the group's checkpoint object and the metas in the bucket (the same output at every ts up to the checkpoint)")
	f.BoolVar(&c.Snapshots, "snapshots", true, "start each table from its newest listed snapshot at or below --ts (false: read the log alone, which fails below the truncation point)")
	c.out.RegisterFlags(f)
}

func runRestore(ctx context.Context, args []string) error {
	fs := newFlagSet("restore")
	var cfg restoreConfig
	cfg.RegisterFlags(fs)
	if err := cfg.conn.parse(fs, args, func() error {
		if cfg.Out == "" {
			return errors.New("--out is required")
		}
		if err := cfg.Select.Validate(); err != nil {
			return err
		}
		_, err := flowLookup(cfg.Flow, cfg.FlowID)
		return err
	}); err != nil {
		return err
	}
	// --max-memory is also the Go soft memory limit, as in `consumer run`
	// (GOMEMLIMIT wins): without one the heap grows to twice the sort
	// buffers (GOGC=100), whatever --max-memory says.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(int64(cfg.MaxMemory))
	}
	b, st, closeBackup, err := cfg.conn.openBackup(ctx, cfg.FromBucket, cfg.Parallel)
	if err != nil {
		return err
	}
	defer closeBackup()
	return restore(ctx, &cfg, st, b)
}

// restoreJSON is `consumer restore --json` (docs/SCRIPTING.md, "JSON
// output").
type restoreJSON struct {
	Flow    flowJSON `json:"flow"`
	AsOf    tsJSON   `json:"as_of"`
	Out     string   `json:"out"`
	Tables  int      `json:"tables"`
	Keys    int64    `json:"keys"`
	Chunks  int      `json:"chunks"`
	Metas   int      `json:"metas"`
	LogB    int64    `json:"log_bytes"`
	Seconds float64  `json:"seconds"`
	// FromSnapshot counts the tables started from a snapshot at Snapshot.
	FromSnapshot int       `json:"from_snapshot"`
	Snapshot     tsJSON    `json:"snapshot"`
	NoValue      int64     `json:"no_value_keys"`
	LeftOut      []leftOut `json:"left_out"`
	Selection    selJSON   `json:"selection"`
}

// selJSON is a restore's selection: the tables asked for ([] for every
// table) and the raw key range, hex ("" for no bound).
type selJSON struct {
	Tables   []int64 `json:"tables"`
	StartKey string  `json:"start_key"`
	EndKey   string  `json:"end_key"`
}

func selectionOf(s backup.Selection) selJSON {
	j := selJSON{Tables: []int64{}, StartKey: hex.EncodeToString(s.StartKey), EndKey: hex.EncodeToString(s.EndKey)}
	for id, ok := range s.Tables {
		if ok {
			j.Tables = append(j.Tables, id)
		}
	}
	slices.Sort(j.Tables)
	return j
}

// restore runs a parsed `consumer restore`: backup.Restore decides what it
// may write, this prints it.
func restore(ctx context.Context, cfg *restoreConfig, st backup.Store, b sink.Bucket) error {
	sel, err := cfg.Select.Selection()
	if err != nil {
		return err
	}
	l, err := flowLookup(cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	_, statErr := os.Lstat(cfg.Out)
	outExisted := statErr == nil
	r := &reader{ts: &cfg.TS, verb: "restoring", noun: "restore", tables: cfg.Select.Tables, out: &cfg.out}
	progress := newProgressLine(os.Stderr)
	var start time.Time // of the read itself, for its MiB/s
	notify := func(e backup.Event) {
		if _, ok := e.(backup.Restoring); ok {
			start = time.Now()
		}
		r.notify(e)
	}
	var last sink.RestoreProgress
	res, err := backup.Restore(ctx, cfg.conn.source(st, b), backup.RestoreRequest{
		Request:   backup.Request{Flow: l, TS: cfg.TS.ts, MaxClockSkew: cfg.conn.MaxClockSkew, Notify: notify},
		Selection: sel, LogOnly: !cfg.Snapshots,
		OutDir: cfg.Out, Force: cfg.Force, TempDir: cfg.TempDir, MaxMemory: int64(cfg.MaxMemory), Parallel: cfg.Parallel,
		Progress: func(p sink.RestoreProgress) {
			last = p
			progress.show("read %d/%d chunks (%.1f MiB of log), %d keys written", p.Chunks, p.ChunksTotal, float64(p.LogBytes)/(1<<20), p.Keys)
		},
	})
	progress.done()
	f, ts, stats := res.Flow, res.TS, res.Stats
	switch {
	case err != nil && cli.Interrupted(ctx):
		return cli.Interruptedf("restore of flow %s (id %d) as of %d (%s) stopped after %d of %d chunks; removed its sort files from --temp-dir and the tables it wrote; %s",
			f, f.ID, ts, tsTime(ts), last.Chunks, last.ChunksTotal, outState(cfg.Out, outExisted))
	case errors.Is(err, sink.ErrOutDirNotEmpty):
		return fmt.Errorf("--out %s is not empty: pass --force to write into it (its <table_id>.jsonl files are replaced)", cfg.Out)
	case err != nil:
		return r.explain(err)
	}
	secs := time.Since(start).Seconds()
	mb := float64(stats.LogBytes) / (1 << 20)
	cfg.out.printf("restored flow %s/%s (id %d) as of %d (%s) into %s\n", f.Catalog, f.Name, f.ID, ts, tsTime(ts), cfg.Out)
	cfg.out.printf("%d tables, %d keys, %d chunks from %d metas, %.1f MiB of log in %.2fs (%.1f MiB/s)\n",
		stats.Tables, stats.Keys, stats.Chunks, res.Metas, mb, secs, mb/max(secs, 1e-9))
	if !sel.Keys().All() {
		cfg.out.printf("only the keys in [%s, %s) were read and written\n", keyBound(sel.StartKey, "first key"), keyBound(sel.EndKey, "last key"))
	}
	if stats.FromSnapshot > 0 {
		cfg.out.printf("%d tables started from the snapshot at %d (%s); only the log after it was read\n", stats.FromSnapshot, stats.SnapshotTS, tsTime(stats.SnapshotTS))
	}
	if stats.NoValue > 0 {
		cfg.out.printf("%d keys left out: their value was prewritten before their table's coverage window began, so the backup does not hold it\n", stats.NoValue)
	}
	return cfg.out.result(restoreJSON{Flow: flowOf(f), AsOf: tsOf(ts), Out: cfg.Out, Tables: stats.Tables, Keys: stats.Keys,
		Chunks: stats.Chunks, Metas: res.Metas, LogB: stats.LogBytes, Seconds: secs,
		FromSnapshot: stats.FromSnapshot, Snapshot: tsOf(stats.SnapshotTS), NoValue: stats.NoValue, LeftOut: nonNil(r.leftOut), Selection: selectionOf(sel)})
}

// keyBound is a bound of a key range as the summary shows it.
func keyBound(k []byte, none string) string {
	if len(k) == 0 {
		return "the " + none
	}
	return hex.EncodeToString(k)
}

// outState says what an interrupted restore left of --out dir; existed is
// whether dir was there before the run.
func outState(dir string, existed bool) string {
	_, err := os.Lstat(dir)
	switch {
	case !existed && errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("--out %s, which this run created, was removed", dir)
	case !existed:
		return fmt.Sprintf("--out %s, which this run created, holds files it did not write and stays", dir)
	}
	return fmt.Sprintf("--out %s is as it was before the run", dir)
}
