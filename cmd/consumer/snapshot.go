package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/flowlog/flowlog/event"
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
	f.Var(&c.MaxMemory, "max-memory", "entries buffered in memory before spilling sorted runs to --temp-dir")
	f.IntVar(&c.Parallel, "parallel", 4, "log chunks read at once")
	c.metrics.RegisterFlags(f)
}

// snapStore is what snapshot and restore read and write of a flow's
// snapshots in Redis (*meta.Store).
type snapStore interface {
	flowStore
	Snapshots(ctx context.Context, id meta.FlowID) ([]meta.SnapshotRef, error)
	TruncatedBefore(ctx context.Context, id meta.FlowID) (uint64, bool, error)
	AddSnapshot(ctx context.Context, id meta.FlowID, path string) error
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
	b, err := cfg.conn.openBucket(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	cfg.metrics.init("snapshot")
	start := time.Now()
	err = snapshot(ctx, &cfg, st, b)
	if merr := cfg.metrics.finish(start, err); merr != nil && err == nil {
		return merr
	}
	return err
}

// snapshot runs a parsed `consumer snapshot`: the objects first, then one
// MULTI that lists the snapshot. Like restore, it reads the checkpoint
// before it lists the metas.
func snapshot(ctx context.Context, cfg *snapshotConfig, st snapStore, b sink.Bucket) error {
	ref, err := resolveFlow(ctx, st, cfg.conn.GCS.Prefix, cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	ts, err := pickTS(ctx, st, b, &cfg.conn, ref, &cfg.TS, "snapshotting")
	if err != nil {
		return err
	}
	if err := listMetas(ctx, st, &ref); err != nil {
		return err
	}
	snaps, err := listSnapshots(ctx, st, ref.ID)
	if err != nil {
		return err
	}
	// After the lists: truncate removes metas and records the point in one
	// MULTI, so this read knows of every truncation the lists reflect.
	truncated, err := checkTruncated(ctx, st, ref, ts)
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if s.TS == ts {
			fmt.Printf("flow %s/%s (id %d) has a snapshot as of %d (%s) already: %s\n", ref.Catalog, ref.Name, ref.ID, ts, tsTime(ts), s.Path)
			return nil
		}
	}
	if cfg.TS.form != "" {
		fmt.Printf("--ts %s\n", cfg.TS.describe())
	}
	capped, err := restorableTables(ctx, st, ref, nil, ts)
	if err != nil {
		return err
	}
	cur, hist, err := st.Windows(ctx, ref.ID)
	if err != nil {
		return err
	}
	windows := map[int64]sink.SnapshotWindow{}
	for id := range capped {
		if w, ok := meta.WindowAt(cur, hist, uint32(id), ts); ok {
			windows[id] = sink.SnapshotWindow{Since: w.Since, Until: w.Until}
		}
	}
	fmt.Printf("snapshot of flow %s/%s (id %d) as of %d (%s): %d tables, from %d metas\n", ref.Catalog, ref.Name, ref.ID, ts, tsTime(ts), len(windows), len(ref.Metas))
	name := ref.Catalog + "/" + ref.Name
	cfg.metrics.objects.WithLabelValues(name)
	cfg.metrics.bytes.WithLabelValues(name)
	cfg.metrics.readBytes.WithLabelValues(name)
	progress := newProgressLine(os.Stderr)
	start := time.Now()
	stats, err := sink.Snapshot(ctx, sink.SnapshotOptions{
		Bucket: b, Flow: ref.sinkFlow(cfg.conn.GCS.Prefix), MetaPaths: ref.Metas, Snapshots: snaps, TruncatedBefore: truncated,
		TS: ts, Windows: windows, TempDir: cfg.TempDir, MaxMemory: int64(cfg.MaxMemory), Parallel: cfg.Parallel,
		Progress: progress.snapshot,
	})
	progress.done()
	if err == nil {
		err = st.AddSnapshot(ctx, ref.ID, stats.MetaPath)
	}
	cfg.metrics.objects.WithLabelValues(name).Add(float64(stats.Objects))
	cfg.metrics.bytes.WithLabelValues(name).Add(float64(stats.Bytes))
	cfg.metrics.readBytes.WithLabelValues(name).Add(float64(stats.LogBytes))
	if err != nil {
		return snapshotErr(err, ref)
	}
	secs := time.Since(start).Seconds()
	mb := float64(stats.LogBytes) / (1 << 20)
	fmt.Printf("listed snapshot %s\n", stats.MetaPath)
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

// snapshotErr turns the sink's typed errors into operator messages.
func snapshotErr(err error, ref flowRef) error {
	var nd *sink.NoDataError
	switch {
	case errors.As(err, &nd) && nd.First == 0:
		return fmt.Errorf("flow %s/%s (id %d) has no backed-up write record: nothing to snapshot", ref.Catalog, ref.Name, ref.ID)
	case errors.As(err, &nd):
		return fmt.Errorf("--ts %d (%s) is before the first backed-up write record of flow %s/%s at %d (%s): nothing to snapshot",
			nd.TS, tsTime(nd.TS), ref.Catalog, ref.Name, nd.First, tsTime(nd.First))
	}
	return err
}

// pickTS is the ts a restore or snapshot uses: --ts, checked against the
// checkpoint, or the checkpoint (for a dropped flow at most the end of its
// last window).
// verb names the command's work in a message ("restoring").
func pickTS(ctx context.Context, st flowStore, b sink.Bucket, conn *connConfig, ref flowRef, arg *tsFlag, verb string) (uint64, error) {
	ckpt, err := checkpoint(ctx, st, b, conn, ref)
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
			return 0, werr
		}
	}
	switch {
	case closed && err != nil:
		fmt.Fprintf(os.Stderr, "flow %s/%s (id %d) was dropped and its checkpoint is unreadable (%v); its coverage windows are final, so it is restorable up to their end\n",
			ref.Catalog, ref.Name, ref.ID, err)
		ckpt = 0
	case err != nil:
		return 0, err
	}
	bound := ckpt
	if closed {
		bound = max(ckpt, end)
	}
	now := time.Now()
	future := event.MaxTS(now, conn.MaxClockSkew)
	ts := arg.ts
	switch {
	case ts > future:
		return 0, &FutureError{What: "--ts " + arg.describe(), TS: ts, Ahead: event.Ahead(ts, now), Skew: conn.MaxClockSkew}
	case bound > future:
		// Only a ts no clock could honestly give moves a checkpoint there
		// (stored by a version that took any ts, until a consumer of this
		// one advances it again): what it claims is unproven at any ts,
		// since the regions that held it back may have been ignored.
		return 0, &FutureError{What: fmt.Sprintf("the checkpoint of flow %s/%s (id %d)", ref.Catalog, ref.Name, ref.ID),
			TS: bound, Ahead: event.Ahead(bound, now), Skew: conn.MaxClockSkew}
	case bound == 0:
		return 0, fmt.Errorf("flow %s/%s (id %d) has no checkpoint yet: nothing is restorable", ref.Catalog, ref.Name, ref.ID)
	case ts == 0 && closed:
		// A dropped flow's windows all ended: as of the last end, not its
		// checkpoint, which may lie before or past them.
		ts = end
		if end != ckpt {
			fmt.Printf("flow %s/%s (id %d) was dropped: %s as of the end of its last coverage window, %d (%s)\n",
				ref.Catalog, ref.Name, ref.ID, verb, end, tsTime(end))
		}
	case ts == 0:
		ts = ckpt
	case ts > bound:
		return 0, fmt.Errorf("--ts %s is past the flow's checkpoint %d (%s): later data may still be incomplete",
			arg.describe(), bound, tsTime(bound))
	}
	return ts, nil
}

// FutureError is a ts that lies further ahead of this machine's clock than
// --max-clock-skew: a restore or snapshot at it would claim data that cannot
// exist yet.
type FutureError struct {
	What  string // what carries the ts: "--ts ...", "the checkpoint of ..."
	TS    uint64
	Ahead time.Duration
	Skew  time.Duration
}

func (e *FutureError) Error() string {
	return fmt.Sprintf("%s is %d (%s), %v ahead of this machine's clock, more than --max-clock-skew %v: refused, nothing past the clock can be backed up yet (a producer clock far ahead, or a corrupted heartbeat; see docs/OPERATING.md, \"Time is bounded\")",
		e.What, e.TS, tsTime(e.TS), e.Ahead.Round(time.Second), e.Skew)
}

// checkTruncated returns the flow's truncation point (0 if none) and
// refuses a ts below it.
func checkTruncated(ctx context.Context, st snapStore, ref flowRef, ts uint64) (uint64, error) {
	tb, ok, err := st.TruncatedBefore(ctx, ref.ID)
	if err != nil || !ok {
		return 0, err
	}
	if ts < tb {
		return 0, fmt.Errorf("--ts %d (%s) is before the truncation point of flow %s/%s (id %d): the log before it was removed; the oldest restorable ts is %d (%s)",
			ts, tsTime(ts), ref.Catalog, ref.Name, ref.ID, tb, tsTime(tb))
	}
	return tb, nil
}

// listSnapshots returns the flow's listed snapshots as the sink takes them.
func listSnapshots(ctx context.Context, st snapStore, id meta.FlowID) ([]sink.SnapshotRef, error) {
	refs, err := st.Snapshots(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]sink.SnapshotRef, 0, len(refs))
	for _, r := range refs {
		out = append(out, sink.SnapshotRef{TS: r.TS, Path: r.Path})
	}
	return out, nil
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
