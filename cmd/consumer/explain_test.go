package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// TestReadWording: the read side's refusals and events in the words
// `consumer restore` and `consumer snapshot` print, flags named.
func TestReadWording(t *testing.T) {
	f := backup.Flow{ID: 7, Catalog: "c", Name: "f"}
	at := func(min int) uint64 {
		return event.ComposeTS(time.Date(2026, 12, 1, 10, min, 0, 0, time.UTC).UnixMilli(), 0)
	}
	var ts tsFlag
	if err := ts.Set("2026-12-01T10:30:00Z"); err != nil {
		t.Fatal(err)
	}
	desc := fmt.Sprintf("2026-12-01T10:30:00Z is TSO %d (2026-12-01T10:30:00Z)", ts.ts)
	r := reader{ts: &ts, verb: "restoring", noun: "restore", tables: "2,3"}
	snap := reader{ts: &tsFlag{}, verb: "snapshotting", noun: "snapshot"}
	until := uint64(at(20))
	for _, tc := range []struct {
		r    reader
		err  error
		want string
	}{
		{r, &backup.NotFoundError{Lookup: backup.Lookup{Catalog: "c", Name: "f"}}, "no flow c/f (use --flow-id for a dropped flow)"},
		{r, &backup.NotFoundError{Lookup: backup.Lookup{ID: 7}}, "flow 7: no such flow and no committed backup"},
		{r, &backup.OutsidePrefixError{ID: 7, Path: "x/c/f/v1/m", Prefix: "pre"}, `flow 7: meta path x/c/f/v1/m is not under --gcs-prefix "pre"`},
		{r, &backup.FutureError{Flow: f, TS: ts.ts, Ahead: 90 * time.Minute, Skew: 5 * time.Minute},
			"--ts " + desc + fmt.Sprintf(" is %d (2026-12-01T10:30:00Z), 1h30m0s ahead of this machine's clock, more than --max-clock-skew 5m0s: refused, nothing past the clock can be backed up yet (a producer clock far ahead, or a corrupted heartbeat; see docs/OPERATING.md, \"Time is bounded\")", ts.ts)},
		{r, &backup.FutureError{Flow: f, Checkpoint: true, TS: at(40), Ahead: time.Hour, Skew: time.Minute},
			fmt.Sprintf("the checkpoint of flow c/f (id 7) is %d (2026-12-01T10:40:00Z), 1h0m0s ahead of this machine's clock, more than --max-clock-skew 1m0s: refused,", at(40))},
		{r, &backup.NoCheckpointError{Flow: f}, "flow c/f (id 7) has no checkpoint yet: nothing is restorable"},
		{r, &backup.PastCheckpointError{Flow: f, TS: ts.ts, Checkpoint: at(20)},
			fmt.Sprintf("--ts %s is past the flow's checkpoint %d (2026-12-01T10:20:00Z): later data may still be incomplete", desc, at(20))},
		{r, &backup.TruncatedError{Flow: f, TS: at(10), TruncatedBefore: at(20), Table: -1},
			fmt.Sprintf("--ts %d (2026-12-01T10:10:00Z) is before the truncation point of flow c/f (id 7): the log before it was removed; the oldest restorable ts is %d (2026-12-01T10:20:00Z)", at(10), at(20))},
		{r, &backup.TruncatedError{Flow: f, TS: at(30), TruncatedBefore: at(20), Table: 3, LogOnly: true},
			fmt.Sprintf("table 3 of flow c/f (id 7) cannot be restored from the log alone (--snapshots=false): the log before the truncation point %d (2026-12-01T10:20:00Z) was removed", at(20))},
		{r, &backup.TruncatedError{Flow: f, TS: at(30), TruncatedBefore: at(20), Table: 3},
			fmt.Sprintf("table 3 of flow c/f (id 7) cannot be restored as of %d: the log before the truncation point %d (2026-12-01T10:20:00Z) was removed and no listed snapshot at or after it holds the table's coverage window (restore the other tables with --tables)", at(30), at(20))},
		{r, &backup.UncoveredError{Flow: f, TS: at(30), NoWindow: true}, "flow c/f (id 7) has no coverage window yet: nothing is restorable"},
		{r, &backup.UncoveredError{Flow: f, TS: at(30)}, fmt.Sprintf("no table of flow c/f (id 7) is restorable as of %d (2026-12-01T10:30:00Z): every table left out", at(30))},
		{r, &backup.NoDataError{Flow: f, TS: at(30)}, "flow c/f (id 7) has no backed-up write record of tables 2,3: nothing to restore"},
		{r, &backup.NoDataError{Flow: f, TS: at(1), First: at(5)},
			fmt.Sprintf("--ts %d (2026-12-01T10:01:00Z) is before the first backed-up write record of tables 2,3 of flow c/f at %d (2026-12-01T10:05:00Z): nothing to restore", at(1), at(5))},
		{snap, &backup.NoDataError{Flow: f, TS: at(30)}, "flow c/f (id 7) has no backed-up write record: nothing to snapshot"},
		{snap, &backup.NoDataError{Flow: f, TS: at(1), First: at(5)},
			fmt.Sprintf("--ts %d (2026-12-01T10:01:00Z) is before the first backed-up write record of flow c/f at %d (2026-12-01T10:05:00Z): nothing to snapshot", at(1), at(5))},
		{r, errors.New("redis down"), "redis down"},
	} {
		if got := tc.r.explain(fmt.Errorf("wrapped: %w", tc.err)).Error(); !strings.HasPrefix(got, tc.want) && got != "wrapped: "+tc.want {
			t.Errorf("%T %+v:\n got %s\nwant %s", tc.err, tc.err, got, tc.want)
		}
	}

	// The truncate's refusals.
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&backup.NoSnapshotError{Flow: f, Until: until}, "flow c/f (id 7) has no listed snapshot at or below --until " + ts.describe() + " (it has none): take one with 'consumer snapshot' first"},
		{&backup.NoSnapshotError{Flow: f, Until: until, Oldest: at(25)}, fmt.Sprintf("(its oldest is at %d (2026-12-01T10:25:00Z))", at(25))},
		{&backup.TruncatedPastError{Flow: f, TruncatedBefore: at(30), Snapshot: at(20)},
			fmt.Sprintf("flow c/f (id 7) is already truncated before %d (2026-12-01T10:30:00Z), past the snapshot at %d: nothing to do", at(30), at(20))},
	} {
		if got := explainTruncate(tc.err, &ts).Error(); !strings.Contains(got, tc.want) {
			t.Errorf("%T:\n got %s\nwant %s", tc.err, got, tc.want)
		}
	}

	// The events.
	until30 := at(30)
	stderr, stdout, _ := captureStderr(t, func() error {
		for _, e := range []backup.Event{
			backup.CheckpointUnreadable{Flow: f, Err: errors.New("object not found")},
			backup.AtWindowsEnd{Flow: f, End: at(30)},
			backup.TSChosen{Flow: f, TS: ts.ts},
			backup.LeftOut{Table: 2, TS: at(40), Windows: []meta.Window{{Since: 5, Until: &until30}, {Since: at(45)}}},
			backup.LeftOut{Table: 3, TS: at(40), Establishing: true},
			backup.LeftOut{Table: 4, TS: at(40)},
			backup.LeftOut{Table: 5, TS: at(40), Windows: []meta.Window{{Since: 5}}, Removing: true, CompleteUpTo: at(30)},
		} {
			r.notify(e)
		}
		snap.notify(backup.TSChosen{Flow: f, TS: 1}) // a --ts TSO, or none: nothing to say
		return nil
	})
	wantOut := fmt.Sprintf("flow c/f (id 7) was dropped: restoring as of the end of its last coverage window, %d (2026-12-01T10:30:00Z)\n--ts %s\n", at(30), desc)
	wantErr := "flow c/f (id 7) was dropped and its checkpoint is unreadable (object not found); its coverage windows are final, so it is restorable up to their end\n" +
		fmt.Sprintf("left out table 2: no coverage window holds %d (2026-12-01T10:40:00Z); its windows are [5 (1970-01-01T00:00:00Z), %d (2026-12-01T10:30:00Z)], [%d (2026-12-01T10:45:00Z), now]\n", at(40), at(30), at(45)) +
		"left out table 3: its coverage window is not established yet (an apply partition has not routed past the DDL that added it)\n" +
		"left out table 4: not a table of the flow (no coverage window)\n" +
		fmt.Sprintf("left out table 5: it is being removed from the flow and not every apply partition has said where it stopped backing it up: "+
			"its window is complete only up to %d (2026-12-01T10:30:00Z), the flow's checkpoint when it was removed; restore at or below that, or once the removal is final\n", at(30))
	if stdout != wantOut || stderr != wantErr {
		t.Errorf("events printed\n%s---\n%s\nwant\n%s---\n%s", stdout, stderr, wantOut, wantErr)
	}
}
