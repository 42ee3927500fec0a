package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

func runVerify(ctx context.Context, args []string) error {
	fs := newFlagSet("verify")
	var (
		conn     connConfig
		flowName string
		flowID   uint
		asJSON   bool
	)
	conn.RegisterFlags(fs)
	addFlowFlags(fs, &flowName, &flowID)
	fs.BoolVar(&asJSON, "json", false, `print the report as one JSON document on stdout instead of text (docs/SCRIPTING.md, "JSON output")`)
	st, closeStore, err := conn.parseOpen(fs, args, func() error {
		_, err := flowLookup(flowName, flowID)
		return err
	})
	if err != nil {
		return err
	}
	defer closeStore()
	b, err := conn.openBucket(ctx, false)
	if err != nil {
		return err
	}
	defer b.Close()
	ref, err := conn.resolveFlow(ctx, st, flowName, flowID)
	if err != nil {
		return err
	}
	// A dropped flow has no checkpoint in Redis to compare with.
	opts := sink.VerifyOptions{Bucket: b, Flow: ref.Sink(conn.GCS.Prefix),
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
	if !ref.Dropped {
		s, err := st.FlowState(ctx, ref.ID)
		if err != nil {
			return err
		}
		opts.RedisCheckpoint, opts.Group = s.CheckpointTS, conn.Group
	}
	if opts.MetaPaths, err = backup.MetaPaths(ctx, st, ref.ID); err != nil {
		return err
	}
	if opts.Snapshots, err = backup.SnapshotRefs(ctx, st, ref.ID); err != nil {
		return err
	}
	truncated, _, err := st.TruncatedBefore(ctx, ref.ID)
	if err != nil {
		return err
	}
	r, err := sink.Verify(ctx, opts)
	if err != nil {
		return err
	}
	windows, err := backup.Windows(ctx, st, ref.ID)
	if err != nil {
		return err
	}
	futureFaults(&r, windows, time.Now(), conn.MaxClockSkew)
	out := struct {
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
	}{ref.ID, ref.Catalog, ref.Name, ref.Dropped, r.OK(), windows, truncated, r}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		fmt.Printf("flow %s/%s (id %d)%s\n", ref.Catalog, ref.Name, ref.ID, map[bool]string{true: " [dropped]"}[ref.Dropped])
		fmt.Printf("  metas %d, data objects %d, chunks checked %d (%.1f MiB)\n", r.Metas, r.DataObjects, r.Chunks, float64(r.ChunkBytes)/(1<<20))
		for _, w := range windows {
			fmt.Printf("  table %d: coverage window %s\n", w.TableID, windowString(w))
		}
		if len(windows) == 0 {
			fmt.Println("  no coverage window yet: nothing is restorable")
		}
		if r.Snapshots > 0 {
			fmt.Printf("  snapshots %d (%d tables, %d chunks checked, %.1f MiB), newest at %d (%s)\n", r.Snapshots, r.SnapshotTables, r.SnapshotChunks,
				float64(r.SnapshotBytes)/(1<<20), r.NewestSnapshot, tsTime(r.NewestSnapshot))
		} else {
			fmt.Println("  snapshots: none")
		}
		if truncated > 0 {
			fmt.Printf("  truncation point: %d (%s): restores below it are refused\n", truncated, tsTime(truncated))
		} else {
			fmt.Println("  truncation point: none (the whole log is kept)")
		}
		if r.CheckpointObject != "" {
			fmt.Printf("  checkpoint: redis %d (%s), object %d (%s)\n", r.RedisCheckpoint, tsTime(r.RedisCheckpoint), r.CheckpointTS, tsTime(r.CheckpointTS))
		}
		if r.Unreferenced > 0 {
			fmt.Printf("  unreferenced: %d objects (%.1f MiB) under %s that no committed meta references; not part of the backup, consumer gc removes them once older than its --grace\n",
				r.Unreferenced, float64(r.UnreferencedBytes)/(1<<20), opts.Flow.Dir())
		}
		for _, f := range r.Faults {
			fmt.Printf("  FAULT: %s\n", f)
		}
		if r.OK() {
			fmt.Println("  OK")
		}
	}
	if !r.OK() {
		return exitError{code: 1, msg: fmt.Sprintf("verify: %d faults", len(r.Faults))}
	}
	return nil
}

// futureFaults adds a fault for every checkpoint and window bound that lies
// further ahead of now than skew: a ts no clock could honestly give moved it
// there, so what it claims is unproven.
func futureFaults(r *sink.VerifyReport, windows []meta.Window, now time.Time, skew time.Duration) {
	bound := event.MaxTS(now, skew)
	future := func(what string, ts uint64) {
		if ts > bound {
			r.Faults = append(r.Faults, fmt.Sprintf("%s %d (%s) is %v ahead of this machine's clock, more than --max-clock-skew %v",
				what, ts, tsTime(ts), event.Ahead(ts, now).Round(time.Second), skew))
		}
	}
	future("redis checkpoint", r.RedisCheckpoint)
	future("checkpoint object", r.CheckpointTS)
	for _, w := range windows {
		future(fmt.Sprintf("table %d: coverage window since", w.TableID), w.Since)
		if w.Until != nil {
			future(fmt.Sprintf("table %d: coverage window until", w.TableID), *w.Until)
		}
	}
}
