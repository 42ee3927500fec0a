package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

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
	cfg.metrics.init("truncate")
	start := time.Now()
	err = truncate(ctx, &cfg, st, b)
	if merr := cfg.metrics.finish(start, err); merr != nil && err == nil {
		return merr
	}
	return err
}

// truncatePlan is what one truncate removes, for the summaries.
type truncatePlan struct {
	snap      meta.SnapshotRef
	metas     []sink.LoggedMeta // to drop
	keptOld   map[string]int    // metas at or below the snapshot kept anyway, by reason
	kept      int               // metas that stay listed
	keptData  map[string]bool   // data objects of the metas that stay
	snapshots []meta.SnapshotRef
}

// objects returns the objects of the plan's metas and snapshots, the
// snapshots' objects read from their snapshot.meta (one that cannot be read
// is left to gc).
func (p *truncatePlan) objects(ctx context.Context, b sink.Bucket, flow string) ([]sink.GCObject, []string) {
	var objs []sink.GCObject
	var warnings []string
	for _, m := range p.metas {
		objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: m.Path, Size: m.Size}, Flow: flow, Kind: sink.GCMeta})
		if m.Meta.DataPath != "" && !p.keptData[m.Meta.DataPath] {
			objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: m.Meta.DataPath, Size: m.DataSize()}, Flow: flow, Kind: sink.GCData})
		}
	}
	for _, s := range p.snapshots {
		sm, err := sink.LoadSnapshotMeta(ctx, b, s.Path)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("snapshot %s: %v (its objects are left to gc)", s.Path, err))
			continue
		}
		for _, t := range sm.Tables {
			var n int64
			if len(t.Chunks) > 0 {
				last := t.Chunks[len(t.Chunks)-1]
				n = last.Offset + last.Length
			}
			objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: t.DataPath, Size: n}, Flow: flow, Kind: sink.GCSnapshot})
		}
		objs = append(objs, sink.GCObject{ObjectInfo: sink.ObjectInfo{Name: s.Path}, Flow: flow, Kind: sink.GCSnapshot})
	}
	return objs, warnings
}

// truncate runs a parsed `consumer truncate`: choose the snapshot, check it
// covers every table window that holds its ts, plan, print the plan, then
// the Redis MULTI, then the deletes.
func truncate(ctx context.Context, cfg *truncateConfig, st *meta.Store, b sink.Bucket) error {
	start := time.Now()
	ref, err := resolveFlow(ctx, st, cfg.conn.GCS.Prefix, cfg.Flow, cfg.FlowID)
	if err != nil {
		return err
	}
	name := ref.Catalog + "/" + ref.Name
	cfg.metrics.objects.WithLabelValues(name)
	cfg.metrics.bytes.WithLabelValues(name)
	snap, err := chooseSnapshot(ctx, st, ref, cfg.Until)
	if err != nil {
		return err
	}
	if tb, ok, err := st.TruncatedBefore(ctx, ref.ID); err != nil {
		return err
	} else if ok && tb > snap.TS {
		return truncatedPast(name, ref.ID, tb, snap.TS)
	}
	if err := snapshotCovers(ctx, st, b, ref, snap); err != nil {
		return err
	}
	flow := ref.sinkFlow(cfg.conn.GCS.Prefix)
	cache := &metaCache{m: map[string]sink.LoggedMeta{}}
	var plan truncatePlan
	planFn := func(ctx context.Context, metas []meta.MetaRef, snaps []meta.SnapshotRef) (meta.TruncateDrop, error) {
		paths := make([]string, len(metas))
		for i, m := range metas {
			paths[i] = m.Path
		}
		logged, err := cache.read(ctx, b, flow, paths, cfg.Parallel)
		if err != nil {
			return meta.TruncateDrop{}, err
		}
		drop, keptOld := sink.PlanTruncate(logged, snap.TS)
		plan = truncatePlan{snap: snap, keptOld: keptOld, kept: len(logged) - len(drop), keptData: map[string]bool{}}
		var out meta.TruncateDrop
		dropped := make(map[int]bool, len(drop))
		for _, i := range drop {
			plan.metas = append(plan.metas, logged[i])
			out.Metas = append(out.Metas, logged[i].Path)
			dropped[i] = true
		}
		for i, m := range logged {
			if !dropped[i] {
				plan.keptData[m.Meta.DataPath] = true // never deleted, even if a dropped meta names it too
			}
		}
		for _, s := range snaps {
			if s.TS < snap.TS {
				plan.snapshots = append(plan.snapshots, s)
				out.Snapshots = append(out.Snapshots, s.Path)
			}
		}
		return out, nil
	}

	// The plan first, from what is listed now; the transaction plans again
	// on what it reads.
	metas, err := st.Metas(ctx, ref.ID)
	if err != nil {
		return err
	}
	snaps, err := st.Snapshots(ctx, ref.ID)
	if err != nil {
		return err
	}
	if _, err := planFn(ctx, metas, snaps); err != nil {
		return err
	}
	objs, warnings := plan.objects(ctx, b, name)
	verb := "will"
	if cfg.DryRun {
		verb = "would"
	}
	fmt.Printf("truncate flow %s (id %d) before snapshot %d (%s): %s remove %d of %d metas and %d older snapshots, then delete %s\n",
		name, ref.ID, snap.TS, tsTime(snap.TS), verb, len(plan.metas), len(metas), len(plan.snapshots), objectsSummary(objs, planTables(plan.metas)))
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

	done, err := st.Truncate(ctx, ref.ID, snap, planFn)
	if err != nil {
		if errors.Is(err, meta.ErrTruncatedPast) {
			tb, _, _ := st.TruncatedBefore(ctx, ref.ID)
			return truncatedPast(name, ref.ID, tb, snap.TS)
		}
		return err
	}
	if done.HistoryErr != nil {
		fmt.Fprintf(os.Stderr, "pruning the coverage history below the truncation point stopped short (the next truncate prunes the rest): %v\n", done.HistoryErr)
	}
	// The transaction's own plan is what was removed from Redis.
	objs, _ = plan.objects(ctx, b, name)
	isRemoved := removedBy(done, plan)
	objs = slices.DeleteFunc(objs, func(o sink.GCObject) bool { return !isRemoved(o) })
	fmt.Printf("recorded truncated_before = %d; removed %d metas and %d snapshots from Redis; deleting %s\n",
		snap.TS, len(done.Metas), len(done.Snapshots), objectsSummary(objs, planTables(plan.metas)))
	n, bytes, derr := sink.DeleteObjects(ctx, b, objs, cfg.Parallel, func(o sink.GCObject) {
		cfg.metrics.objects.WithLabelValues(name).Inc()
		cfg.metrics.bytes.WithLabelValues(name).Add(float64(o.Size))
	})
	fmt.Printf("truncated flow %s (id %d) before %d: deleted %d objects (%s) in %s; %d metas stay listed\n",
		name, ref.ID, snap.TS, n, humanBytes(bytes), time.Since(start).Round(time.Millisecond), plan.kept)
	if derr != nil {
		return fmt.Errorf("deleting the truncated objects (the rest are unreferenced now; run gc): %w", derr)
	}
	return nil
}

func truncatedPast(flow string, id meta.FlowID, tb, snap uint64) error {
	return fmt.Errorf("flow %s (id %d) is already truncated before %d (%s), past the snapshot at %d: nothing to do", flow, id, tb, tsTime(tb), snap)
}

// removedBy returns whether an object of plan belongs to a meta or snapshot
// that done removed from Redis.
func removedBy(done meta.TruncateDrop, plan truncatePlan) func(sink.GCObject) bool {
	gone := make(map[string]bool, len(done.Metas))
	for _, p := range done.Metas {
		gone[p] = true
	}
	owner := make(map[string]string, 2*len(plan.metas)) // object -> its meta
	for _, m := range plan.metas {
		owner[m.Path] = m.Path
		owner[m.Meta.DataPath] = m.Path
	}
	return func(o sink.GCObject) bool {
		if m, ok := owner[o.Name]; ok {
			return gone[m]
		}
		for _, s := range done.Snapshots {
			if strings.HasPrefix(o.Name, strings.TrimSuffix(s, "snapshot.meta")) {
				return true
			}
		}
		return false
	}
}

// chooseSnapshot returns the newest listed snapshot at or below --until.
func chooseSnapshot(ctx context.Context, st *meta.Store, ref flowRef, until tsFlag) (meta.SnapshotRef, error) {
	snaps, err := st.Snapshots(ctx, ref.ID)
	if err != nil {
		return meta.SnapshotRef{}, err
	}
	i := sort.Search(len(snaps), func(i int) bool { return snaps[i].TS > until.ts })
	if i == 0 {
		msg := "it has none"
		if len(snaps) > 0 {
			msg = fmt.Sprintf("its oldest is at %d (%s)", snaps[0].TS, tsTime(snaps[0].TS))
		}
		return meta.SnapshotRef{}, fmt.Errorf("flow %s/%s (id %d) has no listed snapshot at or below --until %s (%s): take one with 'consumer snapshot' first",
			ref.Catalog, ref.Name, ref.ID, until.describe(), msg)
	}
	return snaps[i-1], nil
}

// snapshotCovers checks that snap holds every table whose coverage window
// holds its ts, cut from that window: only then is a restore at or above
// the ts whole without the log before it.
func snapshotCovers(ctx context.Context, st *meta.Store, b sink.Bucket, ref flowRef, snap meta.SnapshotRef) error {
	sm, err := sink.LoadSnapshotMeta(ctx, b, snap.Path)
	if err != nil {
		return fmt.Errorf("snapshot at %d: %w", snap.TS, err)
	}
	if sm.TS != snap.TS || sm.FlowID != uint32(ref.ID) {
		return fmt.Errorf("snapshot %s is of flow id %d at %d, not flow id %d at %d", snap.Path, sm.FlowID, sm.TS, ref.ID, snap.TS)
	}
	windows, err := flowWindows(ctx, st, ref.ID)
	if err != nil {
		return err
	}
	var missing []string
	for _, w := range windows {
		if !w.Holds(snap.TS) {
			continue
		}
		i := slices.IndexFunc(sm.Tables, func(t sink.SnapshotTable) bool { return t.TableID == int64(w.TableID) && t.Since == w.Since })
		if i < 0 {
			missing = append(missing, fmt.Sprintf("%d (window since %d)", w.TableID, w.Since))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("snapshot at %d does not hold table(s) %s whose coverage window holds its ts: truncating would lose them; take a new snapshot",
			snap.TS, strings.Join(missing, ", "))
	}
	return nil
}

// metaCache keeps the metas read by earlier attempts of the truncate
// transaction: meta objects never change.
type metaCache struct {
	mu sync.Mutex
	m  map[string]sink.LoggedMeta
}

func (c *metaCache) read(ctx context.Context, b sink.Bucket, flow sink.Flow, paths []string, parallel int) ([]sink.LoggedMeta, error) {
	c.mu.Lock()
	var missing []string
	for _, p := range paths {
		if _, ok := c.m[p]; !ok {
			missing = append(missing, p)
		}
	}
	c.mu.Unlock()
	got, err := sink.ReadMetas(ctx, b, flow, missing, parallel)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range got {
		c.m[m.Path] = m
	}
	out := make([]sink.LoggedMeta, len(paths))
	for i, p := range paths {
		out[i] = c.m[p]
	}
	return out, nil
}

func planTables(metas []sink.LoggedMeta) []int64 {
	var out []int64
	for _, m := range metas {
		for _, f := range m.Meta.Files {
			if !f.IsMeta && !slices.Contains(out, f.TableID) {
				out = append(out, f.TableID)
			}
		}
	}
	slices.Sort(out)
	return out
}

func printKept(p truncatePlan) {
	for reason, n := range p.keptOld {
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
