package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flowlog/flowlog/event"
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
	Tables    string
	TempDir   string
	MaxMemory cli.Size
	Parallel  int
}

func (c *restoreConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.Var(&c.TS, "ts", "restore as of this TSO, RFC 3339 time (2026-12-01T10:00:00Z) or negative duration ago (-15m) (default: the flow's checkpoint; may not exceed it)")
	f.StringVar(&c.Out, "out", "", "directory to write <table_id>.jsonl into (created 0700 if missing; must be empty unless --force)")
	f.BoolVar(&c.Force, "force", false, "write into a non-empty --out, replacing its <table_id>.jsonl files (links are replaced, never followed)")
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
	st, closeStore, err := cfg.conn.parseOpen(fs, args)
	if err != nil {
		return err
	}
	defer closeStore()
	if cfg.Out == "" {
		return cli.Usagef("--out is required")
	}
	b, err := cfg.conn.openBucket(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	return restore(ctx, &cfg, st, b)
}

// restore runs a parsed `consumer restore`. It reads the checkpoint before
// it lists the metas: metas only grow, so the list holds every cycle the
// checkpoint covers, even if a cycle commits and the checkpoint moves in
// between.
func restore(ctx context.Context, cfg *restoreConfig, st flowStore, b sink.Bucket) error {
	tables, err := cfg.tables()
	if err != nil {
		return err
	}
	ref, err := resolveFlow(ctx, st, cfg.conn.GCS.Prefix, cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	ckpt, err := checkpoint(ctx, st, b, &cfg.conn, ref)
	// A dropped flow whose windows are all final and closed is restorable
	// up to their ends whatever its checkpoint says: a window is final only
	// once every apply partition reported its bound, and each report is
	// committed with the data before it. The checkpoint object may have
	// stopped before the windows began (dropped before an advance passed
	// their since), lie past them (a replica that had not seen the drop),
	// or be missing (never written).
	var end uint64
	closed := false
	if ref.Dropped {
		var werr error
		if end, closed, werr = lastWindowEnd(ctx, st, ref.ID); werr != nil {
			return werr
		}
	}
	switch {
	case closed && err != nil:
		fmt.Fprintf(os.Stderr, "flow %s/%s (id %d) was dropped and its checkpoint is unreadable (%v); its coverage windows are final, so it is restorable up to their end\n",
			ref.Catalog, ref.Name, ref.ID, err)
		ckpt, err = 0, nil
	case err != nil:
		return err
	}
	bound := ckpt
	if closed {
		bound = max(ckpt, end)
	}
	ts := cfg.TS.ts
	switch {
	case bound == 0:
		return fmt.Errorf("flow %s/%s (id %d) has no checkpoint yet: nothing is restorable", ref.Catalog, ref.Name, ref.ID)
	case ts == 0 && closed:
		// A dropped flow's windows all ended: restore as of the last end,
		// not its checkpoint, which may lie before or past them.
		ts = end
		if end != ckpt {
			fmt.Printf("flow %s/%s (id %d) was dropped: restoring as of the end of its last coverage window, %d (%s)\n",
				ref.Catalog, ref.Name, ref.ID, end, tsTime(end))
		}
	case ts == 0:
		ts = ckpt
	case ts > bound:
		return fmt.Errorf("--ts %s is past the flow's checkpoint %d (%s): later data may still be incomplete",
			cfg.TS.describe(), bound, tsTime(bound))
	}
	if err := listMetas(ctx, st, &ref); err != nil {
		return err
	}
	if cfg.TS.form != "" {
		fmt.Printf("--ts %s\n", cfg.TS.describe())
	}
	windows, err := restorableTables(ctx, st, ref, tables, ts)
	if err != nil {
		return err
	}
	start := time.Now()
	stats, err := sink.Restore(ctx, sink.RestoreOptions{
		Bucket: b, Flow: ref.sinkFlow(cfg.conn.GCS.Prefix), MetaPaths: ref.Metas, TS: ts, Tables: tables, Windows: windows,
		OutDir: cfg.Out, Force: cfg.Force, TempDir: cfg.TempDir, MaxMemory: int64(cfg.MaxMemory), Parallel: cfg.Parallel,
	})
	var nd *sink.NoDataError
	switch {
	case errors.Is(err, sink.ErrOutDirNotEmpty):
		return fmt.Errorf("--out %s is not empty: pass --force to write into it (its <table_id>.jsonl files are replaced)", cfg.Out)
	case errors.As(err, &nd) && nd.First == 0:
		return fmt.Errorf("flow %s/%s (id %d) has no backed-up write record%s: nothing to restore", ref.Catalog, ref.Name, ref.ID, tablesNote(cfg.Tables))
	case errors.As(err, &nd):
		return fmt.Errorf("--ts %d (%s) is before the first backed-up write record%s of flow %s/%s at %d (%s): nothing to restore",
			ts, tsTime(ts), tablesNote(cfg.Tables), ref.Catalog, ref.Name, nd.First, tsTime(nd.First))
	case err != nil:
		return err
	}
	secs := time.Since(start).Seconds()
	mb := float64(stats.LogBytes) / (1 << 20)
	fmt.Printf("restored flow %s/%s (id %d) as of %d (%s) into %s\n", ref.Catalog, ref.Name, ref.ID, ts, tsTime(ts), cfg.Out)
	fmt.Printf("%d tables, %d keys, %d chunks from %d metas, %.1f MiB of log in %.2fs (%.1f MiB/s)\n",
		stats.Tables, stats.Keys, stats.Chunks, len(ref.Metas), mb, secs, mb/max(secs, 1e-9))
	if stats.NoValue > 0 {
		fmt.Printf("%d keys left out: their value was prewritten before their table's coverage window began, so the backup does not hold it\n", stats.NoValue)
	}
	return nil
}

func tablesNote(tables string) string {
	if tables == "" {
		return ""
	}
	return " of tables " + tables
}

// tsFlag is --ts: a TSO, an RFC 3339 time, or a negative duration counted
// back from when the flag is parsed. A time becomes the last TSO of its
// millisecond, so that a restore as of a time includes what committed at
// that time.
type tsFlag struct {
	arg  string
	form string // "" for a TSO, else "time" or "duration"
	ts   uint64
}

func (f *tsFlag) String() string { return f.arg }

func (f *tsFlag) Set(s string) error {
	ts, form, err := parseTS(s, time.Now())
	if err != nil {
		return err
	}
	*f = tsFlag{arg: s, form: form, ts: ts}
	return nil
}

// describe renders the flag and, for a time or duration, the TSO it became.
func (f *tsFlag) describe() string {
	if f.form == "" {
		return f.arg
	}
	return fmt.Sprintf("%s is TSO %d (%s)", f.arg, f.ts, tsTime(f.ts))
}

const tsForms = "want a TSO (431656320867237891), an RFC 3339 time (2026-12-01T10:00:00Z) or a negative duration (-15m)"

// parseTS reads a --ts value as of now.
func parseTS(s string, now time.Time) (ts uint64, form string, err error) {
	if s == "" {
		return 0, "", fmt.Errorf("empty: %s", tsForms)
	}
	if s[0] >= '0' && s[0] <= '9' && !strings.ContainsAny(s, "-:T") {
		ts, err := strconv.ParseUint(s, 10, 64)
		if err != nil || ts == 0 {
			return 0, "", fmt.Errorf("%q: not a TSO: %s", s, tsForms)
		}
		return ts, "", nil
	}
	var t time.Time
	if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, "", fmt.Errorf("%q: %s", s, tsForms)
		}
		if d >= 0 {
			return 0, "", fmt.Errorf("%q: a duration must be negative, a time ago (-15m)", s)
		}
		t, form = now.Add(d), "duration"
	} else {
		t, err = time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, "", fmt.Errorf("%q: %s", s, tsForms)
		}
		form = "time"
	}
	ms := t.UnixMilli()
	if ms <= 0 || ms >= 1<<46 {
		return 0, "", fmt.Errorf("%q: %s is outside the range of a TSO", s, t.UTC().Format(time.RFC3339))
	}
	return event.ComposeTS(ms, 1<<18-1), form, nil
}
