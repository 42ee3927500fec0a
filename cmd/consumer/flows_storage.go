package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// storageTimeout bounds the object reads of `flows` and `status`: they
// report, they must not hang on an unreachable store.
const storageTimeout = 20 * time.Second

// retentionState sets the Redis side of a row's retention columns: its newest
// listed snapshot and its truncation point (docs/FORMAT.md, "Snapshot rule"
// and "Truncate rule").
func retentionState(ctx context.Context, st *meta.Store, row *flowRow) error {
	snaps, err := st.Snapshots(ctx, row.ID)
	if err != nil {
		return err
	}
	if len(snaps) > 0 {
		row.SnapshotTS = snaps[len(snaps)-1].TS
	}
	tb, _, err := st.TruncatedBefore(ctx, row.ID)
	row.TruncatedBefore = tb
	return err
}

// addLogBytes sets each row's LogBytesAfterSnapshot: the stored bytes of
// the listed chunks holding an event newer than its latest snapshot (all of
// them without one; of a v2 meta, the flow's chunks), what a restore at the
// checkpoint still reads from the log. It opens the bucket and streams the
// listed metas, parallel at most at once, each shared meta once for all
// the flows that list it; where that fails, the column stays unknown and a
// note goes to stderr.
func addLogBytes(ctx context.Context, conn *connConfig, st *meta.Store, rows []flowRow, parallel int) {
	if len(rows) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, storageTimeout)
	defer cancel()
	b, err := conn.openBucket(ctx, false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "log bytes after snapshot unknown: %v\n", err)
		return
	}
	defer b.Close()
	reqs := make([]sink.SummaryRequest, 0, len(rows))
	of := make([]int, 0, len(rows)) // the row of each request
	for i := range rows {
		r := &rows[i]
		refs, err := st.Metas(ctx, r.ID)
		if err != nil {
			fmt.Fprintf(os.Stderr, "flow %s/%s: log bytes after snapshot unknown: %v\n", r.Catalog, r.Name, err)
			continue
		}
		paths := make([]string, len(refs))
		for j, m := range refs {
			paths[j] = m.Path
		}
		reqs = append(reqs, sink.SummaryRequest{Flow: sink.Flow{Prefix: conn.GCS.Prefix, Catalog: r.Catalog, Name: r.Name, ID: r.ID},
			Paths: paths, TS: r.SnapshotTS})
		of = append(of, i)
	}
	// The flows of a layout v2 backup share their metas: each is read once.
	for k, res := range sink.ReadSharedMetaSummaries(ctx, b, reqs, parallel) {
		r := &rows[of[k]]
		if res.Err != nil {
			fmt.Fprintf(os.Stderr, "flow %s/%s: log bytes after snapshot unknown: %v\n", r.Catalog, r.Name, res.Err)
			continue
		}
		var n int64
		for _, m := range res.Summaries {
			n += m.LogBytesAfter
		}
		r.LogBytesAfterSnapshot = &n
	}
}

// retentionCells renders a row's retention columns.
func retentionCells(r flowRow) (snap, truncated, logBytes string) {
	snap, truncated, logBytes = tsTime(r.SnapshotTS), tsTime(r.TruncatedBefore), "-"
	if r.LogBytesAfterSnapshot != nil {
		logBytes = humanBytes(*r.LogBytesAfterSnapshot)
	}
	return snap, truncated, logBytes
}
