package replay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/replay"
)

// TestReplayCoverageWindows: a replay reads each table only inside the
// coverage window that holds --to, as restore does: a table whose window
// ended before --to is left out and named, and a replay that leaves out
// every table is refused.
func TestReplayCoverageWindows(t *testing.T) {
	e := backuptest.NewTimed(t)
	// Table 1 was added at 5m (its put at exactly 5m is before the
	// window); table 2 was removed at 5m30s, before its put at 6m.
	err := e.Redis.Client(t).HSet(context.Background(), meta.NewKeys(e.RedisPrefix).Coverage(1), map[string]string{
		"1": fmt.Sprintf(`{"since":%d,"until":null}`, e.TS(5*time.Minute)),
		"2": fmt.Sprintf(`{"since":0,"until":%d}`, e.TS(5*time.Minute+30*time.Second)),
	}).Err()
	if err != nil {
		t.Fatal(err)
	}
	k := kafka(t, 2, "out", "none")
	var left []backup.LeftOut
	notify := func(ev backup.Event) {
		if l, ok := ev.(backup.LeftOut); ok {
			left = append(left, l)
		}
	}
	flow := backup.Lookup{Catalog: "default", Name: "f"}
	res, err := replay.Run(context.Background(), e.Source(), target(t, k, "out"), replay.Request{Flow: flow, MaxClockSkew: backuptest.Skew, Topic: "out", Notify: notify})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Table != 2 || fmt.Sprint(res.Tables) != "[1]" {
		t.Fatalf("left out %+v, replayed tables %v; want table 2 left out", left, res.Tables)
	}
	var puts []uint64
	for _, r := range readAll(t, k, "out") {
		for _, ev := range r.batch.Events {
			raw, ts, _ := event.DecodeDataKey(ev.Key)
			if tid, _ := event.TableIDOfRaw(raw); tid != 1 {
				t.Errorf("replayed an event of table %d", tid)
			}
			puts = append(puts, ts)
		}
	}
	if want := fmt.Sprint([]uint64{e.TS(48 * time.Minute)}); fmt.Sprint(puts) != want {
		t.Errorf("replayed events at %v, want only the one inside table 1's window, %s", puts, want)
	}
	left = nil
	_, err = replay.Run(context.Background(), e.Source(), target(t, k, "none"), replay.Request{Flow: flow, MaxClockSkew: backuptest.Skew, Topic: "none",
		Notify: notify, Selection: backup.Selection{Tables: map[int64]bool{2: true}}})
	var un *backup.UncoveredError
	if !errors.As(err, &un) || len(left) != 1 || left[0].Table != 2 {
		t.Fatalf("replay of table 2 alone: %v, left out %+v; want an UncoveredError", err, left)
	}
	if n := len(readAll(t, k, "none")); n != 0 {
		t.Errorf("a refused replay wrote %d records", n)
	}
}

// TestReplaySelection: --start-key/--end-key select raw keys as restore
// does: every replayed event's key lies in the range, and the replayed
// state and log equal the history's state of the keys in it.
func TestReplaySelection(t *testing.T) {
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "sel", 9, 20, 12)
	sel := backup.Selection{StartKey: event.RowKey(1, 3), EndKey: event.RowKey(1, 8)}
	k := kafka(t, 2, "state", "log")
	ctx := context.Background()
	a := h.MS(450, 0)
	for _, req := range []replay.Request{
		{Mode: replay.ModeState, To: a, Topic: "state", TempDir: t.TempDir()},
		{From: a, Topic: "log"},
	} {
		req.Flow, req.MaxClockSkew, req.Selection = h.Flow, backuptest.Skew, sel
		if _, err := replay.Run(ctx, h.Source(), target(t, k, req.Topic), req); err != nil {
			t.Fatal(err)
		}
	}
	all := append(readAll(t, k, "state"), readAll(t, k, "log")...)
	for _, r := range all {
		for _, ev := range r.batch.Events {
			raw, _, _ := event.DecodeDataKey(ev.Key)
			if !sel.HasKey(raw) {
				t.Fatalf("replayed key %x outside the selection", raw)
			}
		}
	}
	for _, ts := range []uint64{a, h.MS(700, 1), h.Checkpoint} {
		want := map[string]string{}
		for hd, v := range h.State(ts) {
			if hd >= 3 && hd < 8 {
				want[backuptest.RowHex(1, hd)] = v
			}
		}
		if got := state(t, all, ts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("state at %d:\n%v\nwant\n%v", ts, got, want)
		}
	}
}
