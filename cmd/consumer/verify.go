package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// verifyConfig is everything `consumer verify` takes.
type verifyConfig struct {
	conn       connConfig
	mem        opMemory
	Flow       string
	FlowID     uint
	All        bool
	FromBucket bool
	JSON       bool
}

func (c *verifyConfig) RegisterFlags(f *flag.FlagSet) {
	c.conn.RegisterFlags(f)
	c.mem.RegisterFlags(f)
	addFlowFlags(f, &c.Flow, &c.FlowID)
	f.BoolVar(&c.All, "all", false, "verify every flow, live and dropped, reading each object that several flows share once")
	f.BoolVar(&c.FromBucket, "from-bucket", false, "read the backup from the bucket alone, without Redis: the flows' catalogs, the group's checkpoint object and the metas in the bucket")
	f.BoolVar(&c.JSON, "json", false, `print the report as one JSON document on stdout instead of text (with --all, an array of them; docs/SCRIPTING.md, "JSON output")`)
}

func runVerify(ctx context.Context, args []string) error {
	fs := newFlagSet("verify")
	var cfg verifyConfig
	cfg.RegisterFlags(fs)
	if err := cfg.conn.parse(fs, args, func() error {
		if cfg.All {
			if cfg.Flow != "" || cfg.FlowID != 0 {
				return errors.New("--all and --flow or --flow-id are exclusive")
			}
			return nil
		}
		_, err := flowLookup(cfg.Flow, cfg.FlowID)
		return err
	}); err != nil {
		return err
	}
	cfg.mem.apply()
	b, st, closeBackup, err := cfg.conn.openBackup(ctx, cfg.FromBucket, cfg.mem.streams(8))
	if err != nil {
		return err
	}
	defer closeBackup()
	return verify(ctx, &cfg, st, b)
}

// verifiedFlow is one flow's verify report as printed.
type verifiedFlow struct {
	FlowID  uint32 `json:"flow_id"`
	Catalog string `json:"catalog"`
	Flow    string `json:"flow"`
	Dropped bool   `json:"dropped"`
	OK      bool   `json:"ok"`
	// Windows are the tables' coverage windows, oldest first.
	Windows []meta.Window `json:"windows"`
	// TruncatedBefore is the truncation point: the oldest restorable
	// ts, 0 if the log was never truncated.
	TruncatedBefore uint64 `json:"truncated_before"`
	sink.VerifyReport
}

// verify runs a parsed `consumer verify` on st's flows: every one with
// --all, else the one --flow or --flow-id names.
func verify(ctx context.Context, cfg *verifyConfig, st backup.Store, b sink.Bucket) error {
	src := cfg.conn.source(st, b)
	var flows []backup.Flow
	if cfg.All {
		ids, err := allFlowIDs(ctx, st)
		if err != nil {
			return err
		}
		for _, id := range ids {
			f, err := resolveFlow(ctx, src, "", uint(id))
			if err != nil {
				return err
			}
			flows = append(flows, f)
		}
	} else {
		f, err := resolveFlow(ctx, src, cfg.Flow, cfg.FlowID)
		if err != nil {
			return err
		}
		flows = []backup.Flow{f}
	}
	opts := make([]sink.VerifyOptions, len(flows))
	for i, f := range flows {
		o, err := verifyOptions(ctx, cfg, st, b, f)
		if err != nil {
			return err
		}
		opts[i] = o
	}
	reports, err := sink.VerifyFlows(ctx, b, opts, cfg.mem.streams(4))
	if err != nil {
		return err
	}
	var out []verifiedFlow
	faults := 0
	for i, f := range flows {
		r := reports[i]
		windows, err := backup.Windows(ctx, st, f.ID)
		if err != nil {
			return err
		}
		truncated, _, err := st.TruncatedBefore(ctx, f.ID)
		if err != nil {
			return err
		}
		futureFaults(&r, windows, time.Now(), cfg.conn.MaxClockSkew, !cfg.FromBucket)
		faults += len(r.Faults)
		out = append(out, verifiedFlow{f.ID, f.Catalog, f.Name, f.Dropped, r.OK(), windows, truncated, r})
	}
	switch {
	case cfg.JSON:
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		var v any = out
		if !cfg.All {
			v = out[0]
		}
		if err := enc.Encode(v); err != nil {
			return err
		}
	default:
		for i := range out {
			printVerified(&out[i], opts[i].Flow, cfg.FromBucket)
		}
	}
	if faults > 0 {
		return exitError{code: 1, msg: fmt.Sprintf("verify: %d faults", faults)}
	}
	return nil
}

// verifyOptions is what sink.VerifyFlows checks of flow f.
func verifyOptions(ctx context.Context, cfg *verifyConfig, st backup.Store, b sink.Bucket, f backup.Flow) (sink.VerifyOptions, error) {
	opts := sink.VerifyOptions{Bucket: b, Flow: f.Sink(cfg.conn.GCS.Prefix),
		ListedMetas: func(ctx context.Context, id uint32) ([]string, error) {
			return backup.MetaPaths(ctx, st, meta.FlowID(id))
		},
		ListedSnapshots: func(ctx context.Context, id uint32) ([]string, error) {
			refs, err := st.Snapshots(ctx, meta.FlowID(id))
			paths := make([]string, len(refs))
			for i, r := range refs {
				paths[i] = r.Path
			}
			return paths, err
		}}
	// A dropped flow has no checkpoint in Redis to compare with; from the
	// bucket, the checkpoint is the object itself.
	if !f.Dropped {
		s, err := st.FlowState(ctx, f.ID)
		if err != nil {
			return opts, err
		}
		opts.RedisCheckpoint, opts.Group = s.CheckpointTS, cfg.conn.Group
	}
	var err error
	if opts.MetaPaths, err = backup.MetaPaths(ctx, st, f.ID); err != nil {
		return opts, err
	}
	opts.Snapshots, err = backup.SnapshotRefs(ctx, st, f.ID)
	return opts, err
}

// allFlowIDs lists every flow id st has a backup or a definition of.
func allFlowIDs(ctx context.Context, st backup.Store) ([]meta.FlowID, error) {
	switch st := st.(type) {
	case *backup.BucketStore:
		return st.FlowIDs(ctx)
	case *meta.Store:
		live, err := st.AllFlows(ctx)
		if err != nil {
			return nil, err
		}
		backed, err := st.BackupIDs(ctx)
		if err != nil {
			return nil, err
		}
		ids := append(live, backed...)
		slices.Sort(ids)
		return slices.Compact(ids), nil
	}
	return nil, fmt.Errorf("verify --all: cannot list the flows of %T", st)
}

// printVerified prints one flow's report for the operator.
func printVerified(v *verifiedFlow, f sink.Flow, fromBucket bool) {
	r := &v.VerifyReport
	fmt.Printf("flow %s/%s (id %d)%s\n", v.Catalog, v.Flow, v.FlowID, map[bool]string{true: " [dropped]"}[v.Dropped])
	fmt.Printf("  metas %d, data objects %d, chunks checked %d (%.1f MiB)\n", r.Metas, r.DataObjects, r.Chunks, float64(r.ChunkBytes)/(1<<20))
	for _, w := range v.Windows {
		fmt.Printf("  table %d: coverage window %s\n", w.TableID, windowString(w))
	}
	if len(v.Windows) == 0 {
		fmt.Println("  no coverage window yet: nothing is restorable")
	}
	if r.Snapshots > 0 {
		fmt.Printf("  snapshots %d (%d tables, %d chunks checked, %.1f MiB), newest at %d (%s)\n", r.Snapshots, r.SnapshotTables, r.SnapshotChunks,
			float64(r.SnapshotBytes)/(1<<20), r.NewestSnapshot, tsTime(r.NewestSnapshot))
	} else {
		fmt.Println("  snapshots: none")
	}
	if v.TruncatedBefore > 0 {
		fmt.Printf("  truncation point: %d (%s): restores below it are refused\n", v.TruncatedBefore, tsTime(v.TruncatedBefore))
	} else {
		fmt.Println("  truncation point: none (the whole log is kept)")
	}
	switch {
	case r.CheckpointObject != "" && fromBucket:
		fmt.Printf("  checkpoint: object %d (%s), read from the bucket alone\n", r.CheckpointTS, tsTime(r.CheckpointTS))
	case r.CheckpointObject != "":
		fmt.Printf("  checkpoint: redis %d (%s), object %d (%s)\n", r.RedisCheckpoint, tsTime(r.RedisCheckpoint), r.CheckpointTS, tsTime(r.CheckpointTS))
	}
	if r.Unreferenced > 0 {
		fmt.Printf("  unreferenced: %d objects (%.1f MiB) under %s that no committed meta references; not part of the backup, consumer gc removes them once older than its --grace\n",
			r.Unreferenced, float64(r.UnreferencedBytes)/(1<<20), f.Dir())
	}
	for _, fault := range r.Faults {
		fmt.Printf("  FAULT: %s\n", fault)
	}
	if r.OK() {
		fmt.Println("  OK")
	}
}

// futureFaults adds a fault for every bound of r and windows that the
// clock rule of verify (backup.VerifyClock) finds ahead of the clock. redis
// is false when the checkpoint came from the bucket, not Redis.
func futureFaults(r *sink.VerifyReport, windows []meta.Window, now time.Time, skew time.Duration, redis bool) {
	var redisCkpt *uint64
	if redis {
		redisCkpt = &r.RedisCheckpoint
	}
	for _, b := range backup.VerifyClock(redisCkpt, r.CheckpointTS, windows, now, skew) {
		what := b.Kind
		if b.Kind == backup.BoundWindowSince || b.Kind == backup.BoundWindowUntil {
			what = fmt.Sprintf("table %d: %s", b.Table, b.Kind)
		}
		r.Faults = append(r.Faults, fmt.Sprintf("%s %d (%s) is %v ahead of this machine's clock, more than --max-clock-skew %v",
			what, b.TS, tsTime(b.TS), b.Ahead.Round(time.Second), b.Skew))
	}
}
