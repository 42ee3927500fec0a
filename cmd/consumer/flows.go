package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// flowRow is one line of `consumer flows`.
type flowRow struct {
	ID             uint32   `json:"id"`
	Catalog        string   `json:"catalog"`
	Name           string   `json:"name"`
	Tables         []uint32 `json:"tables"`
	State          string   `json:"state"`
	Error          string   `json:"error,omitempty"`
	CheckpointTS   uint64   `json:"checkpoint_ts"`
	CheckpointTime string   `json:"checkpoint_time"`
	// CheckpointAheadSeconds is how far the checkpoint lies ahead of this
	// machine's clock, 0 when it does not: the producers' TSO clock runs
	// ahead, by at most --max-clock-skew.
	CheckpointAheadSeconds float64 `json:"checkpoint_ahead_seconds"`
	LastFlushTS            uint64  `json:"last_flush_ts"`
	LastFlushTime          string  `json:"last_flush_time"`
	Metas                  int     `json:"metas"`
	// Windows are the tables' coverage windows, oldest first.
	Windows []meta.Window `json:"windows"`
	// SnapshotTS is the ts of the newest listed snapshot, 0 if none;
	// TruncatedBefore the truncation point, 0 if never truncated.
	SnapshotTS      uint64 `json:"snapshot_ts"`
	TruncatedBefore uint64 `json:"truncated_before"`
	// LogBytesAfterSnapshot is the stored bytes of the listed chunks with
	// an event after SnapshotTS; absent when the objects could not be read.
	LogBytesAfterSnapshot *int64 `json:"log_bytes_after_snapshot,omitempty"`
}

// listFlows reads every flow with its state.
func listFlows(ctx context.Context, st *meta.Store) ([]flowRow, error) {
	ids, err := st.AllFlows(ctx)
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	rows := make([]flowRow, 0, len(ids))
	for _, id := range ids {
		info, ok, err := st.FlowInfo(ctx, id)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // dropped between the two reads
		}
		row := flowRow{ID: id, Catalog: info.CatalogName, Name: info.FlowName, Tables: info.SourceTableIDs, State: "-"}
		s, err := st.FlowState(ctx, id)
		switch {
		case err == nil:
			row.State, row.Error, row.CheckpointTS, row.LastFlushTS = s.Status, s.Error, s.CheckpointTS, s.LastFlushTS
		case !errors.Is(err, meta.ErrFlowNotFound):
			return nil, err
		}
		row.CheckpointTime, row.LastFlushTime = tsTime(row.CheckpointTS), tsTime(row.LastFlushTS)
		if row.CheckpointTS > 0 {
			row.CheckpointAheadSeconds = event.Ahead(row.CheckpointTS, time.Now()).Seconds()
		}
		refs, err := st.Metas(ctx, id)
		if err != nil {
			return nil, err
		}
		row.Metas = len(refs)
		if row.Windows, err = backup.Windows(ctx, st, id); err != nil {
			return nil, err
		}
		if err := retentionState(ctx, st, &row); err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func runFlows(ctx context.Context, args []string) error {
	fs := newFlagSet("flows")
	var (
		conn connConfig
		mem  opMemory
		out  output
	)
	conn.RegisterFlags(fs)
	mem.RegisterFlags(fs)
	out.RegisterFlags(fs)
	st, closeStore, err := conn.parseOpen(fs, args)
	if err != nil {
		return err
	}
	defer closeStore()
	mem.apply()
	rows, err := listFlows(ctx, st)
	if err != nil {
		return err
	}
	addLogBytes(ctx, &conn, st, rows, mem.streams(16))
	if out.json {
		return out.result(rows)
	}
	printFlows(rows)
	return nil
}

func printFlows(rows []flowRow) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFLOW\tTABLES\tSTATE\tCHECKPOINT TS\tCHECKPOINT TIME (UTC)\tLAST FLUSH (UTC)\tMETAS\tCOVERAGE\tSNAPSHOT (UTC)\tTRUNCATED BEFORE (UTC)\tLOG AFTER SNAPSHOT")
	for _, r := range rows {
		tables := make([]string, len(r.Tables))
		for i, t := range r.Tables {
			tables[i] = fmt.Sprint(t)
		}
		state := r.State
		if r.Error != "" {
			state += ": " + r.Error
		}
		cov := make([]string, len(r.Windows))
		for i, w := range r.Windows {
			cov[i] = fmt.Sprintf("%d:%s", w.TableID, windowString(w))
		}
		if len(cov) == 0 {
			cov = []string{"establishing"}
		}
		snap, truncated, logBytes := retentionCells(r)
		ckTime := r.CheckpointTime
		if r.CheckpointAheadSeconds >= 1 {
			ckTime += fmt.Sprintf(" (%v ahead of this clock)", time.Duration(r.CheckpointAheadSeconds*float64(time.Second)).Round(time.Second))
		}
		fmt.Fprintf(tw, "%d\t%s/%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.Catalog, r.Name, strings.Join(tables, ","), state,
			r.CheckpointTS, ckTime, r.LastFlushTime, r.Metas, strings.Join(cov, " "), snap, truncated, logBytes)
	}
	tw.Flush()
}
