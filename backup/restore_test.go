package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink/sinktest"
)

var flowF = backup.Lookup{Catalog: "default", Name: "f"}

// restore restores st's flow l as of ts (0: the checkpoint) into a new
// directory, with the events it reported.
func restore(t *testing.T, src backup.Source, l backup.Lookup, ts uint64, tables map[int64]bool) (string, backup.RestoreResult, []backup.Event, error) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	var events []backup.Event
	res, err := backup.Restore(context.Background(), src, backup.RestoreRequest{
		Request:   backup.Request{Flow: l, TS: ts, MaxClockSkew: backuptest.Skew, Notify: func(e backup.Event) { events = append(events, e) }},
		Selection: backup.Selection{Tables: tables}, OutDir: out, TempDir: t.TempDir(),
	})
	return out, res, events, err
}

// TestRestoreTS: the ts a restore reads as of is the checkpoint unless one
// is asked for, which may not lie past the checkpoint; a ts before the
// first write record of the tables restored has nothing to restore.
func TestRestoreTS(t *testing.T) {
	e := backuptest.NewTimed(t)
	early := []string{backuptest.Row(1, 1, "early", e.TS(5*time.Minute))}
	nine := []string{backuptest.Row(2, 9, "nine", e.TS(6*time.Minute))}
	late := []string{backuptest.Row(1, 1, "late", e.TS(48*time.Minute))}
	for _, tc := range []struct {
		name   string
		ts     uint64
		only   map[int64]bool
		asOf   uint64
		tables map[string][]string
		check  func(error) bool
	}{
		{"default checkpoint", 0, nil, e.TS(50 * time.Minute), map[string][]string{"1": late, "2": nine}, nil},
		{"tso", e.TS(6 * time.Minute), nil, e.TS(6 * time.Minute), map[string][]string{"1": early, "2": nine}, nil},
		{"between cycles", e.TS(20 * time.Minute), nil, e.TS(20 * time.Minute), map[string][]string{"1": early, "2": nine}, nil},
		{"before data", e.TS(time.Minute), nil, 0, nil, func(err error) bool {
			var nd *backup.NoDataError
			return errors.As(err, &nd) && nd.First == e.TS(5*time.Minute) && nd.TS == e.TS(time.Minute) && nd.Flow.ID == 1
		}},
		{"tables before data", e.TS(5 * time.Minute), map[int64]bool{2: true}, 0, nil, func(err error) bool {
			var nd *backup.NoDataError
			return errors.As(err, &nd) && nd.First == e.TS(6*time.Minute)
		}},
		{"past checkpoint", e.TS(50*time.Minute) + 1, nil, 0, nil, func(err error) bool {
			var pc *backup.PastCheckpointError
			return errors.As(err, &pc) && pc.Checkpoint == e.TS(50*time.Minute) && pc.TS == e.TS(50*time.Minute)+1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, res, events, err := restore(t, e.Source(), flowF, tc.ts, tc.only)
			if tc.check != nil {
				if !tc.check(err) {
					t.Fatalf("restore = %v (%T)", err, err)
				}
				if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("failed restore created its directory (%v)", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("restore: %v", err)
			}
			if res.TS != tc.asOf || res.Flow != (backup.Flow{ID: 1, Catalog: "default", Name: "f"}) || res.Metas != 2 {
				t.Errorf("result %+v, want as of %d from 2 metas", res, tc.asOf)
			}
			if n := len(events); n == 0 || events[n-1] != (backup.Restoring{Flow: res.Flow, TS: tc.asOf, Tables: len(tc.tables), Metas: 2}) {
				t.Errorf("events %+v, want Restoring last", events)
			}
			for table, want := range tc.tables {
				if got := backuptest.ReadTable(t, filepath.Join(out, table+".jsonl")); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("table %s: got %v, want %v", table, got, want)
				}
			}
		})
	}
}

// commitBetween is the flow store with fn (a commit that also advances the
// checkpoint) run right after the first read of either the checkpoint or
// the metas list.
type commitBetween struct {
	*meta.Store
	once sync.Once
	fn   func()
}

func (c *commitBetween) FlowState(ctx context.Context, id meta.FlowID) (meta.FlowState, error) {
	s, err := c.Store.FlowState(ctx, id)
	c.once.Do(c.fn)
	return s, err
}

func (c *commitBetween) Metas(ctx context.Context, id meta.FlowID) ([]meta.MetaRef, error) {
	r, err := c.Store.Metas(ctx, id)
	c.once.Do(c.fn)
	return r, err
}

// TestRestoreReadsCheckpointFirst commits a cycle and advances the
// checkpoint between restore's reads of the checkpoint and of the metas:
// the restore must be the state as of the ts it names, so it must not pair
// the new checkpoint with the old list of metas.
func TestRestoreReadsCheckpointFirst(t *testing.T) {
	e := backuptest.NewTimed(t)
	src := e.Source()
	src.Store = &commitBetween{Store: e.Store, fn: func() {
		e.Commit(t, e.TS(58*time.Minute), sinktest.WritePut(1, 1, e.TS(54*time.Minute), e.TS(55*time.Minute), []byte("newest"), true))
	}}
	out, res, _, err := restore(t, src, flowF, 0, nil)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	want := backuptest.Row(1, 1, "late", e.TS(48*time.Minute))
	if res.TS >= e.TS(55*time.Minute) {
		want = backuptest.Row(1, 1, "newest", e.TS(55*time.Minute))
	}
	if got := backuptest.ReadTable(t, filepath.Join(out, "1.jsonl")); fmt.Sprint(got) != fmt.Sprint([]string{want}) {
		t.Fatalf("restore as of %d (checkpoint was %d, then %d) has table 1 = %v, want [%s]",
			res.TS, e.TS(50*time.Minute), e.TS(58*time.Minute), got, want)
	}
}

// TestRestoreFlowLookup: a flow is found by name while it exists and by id
// after it is dropped, its catalog and name then taken from its metas.
func TestRestoreFlowLookup(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	for _, l := range []backup.Lookup{{Catalog: "default", Name: "nope"}, {ID: 77}} {
		var nf *backup.NotFoundError
		if _, _, _, err := restore(t, e.Source(), l, 0, nil); !errors.As(err, &nf) || nf.Lookup != l {
			t.Errorf("restore of %+v = %v, want a *backup.NotFoundError", l, err)
		}
	}
	info, _, err := e.Store.FlowInfo(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Store.DestroyFlow(ctx, 1, info); err != nil {
		t.Fatal(err)
	}
	var nf *backup.NotFoundError
	if _, _, _, err := restore(t, e.Source(), flowF, 0, nil); !errors.As(err, &nf) {
		t.Errorf("restore of the dropped flow by name = %v, want a *backup.NotFoundError", err)
	}
	out, res, _, err := restore(t, e.Source(), backup.Lookup{ID: 1}, 0, nil)
	if err != nil {
		t.Fatalf("restore of the dropped flow by id: %v", err)
	}
	if want := (backup.Flow{ID: 1, Catalog: "default", Name: "f", Dropped: true}); res.Flow != want || res.TS != e.TS(50*time.Minute) {
		t.Errorf("restored %+v as of %d, want %+v as of the checkpoint object's %d", res.Flow, res.TS, want, e.TS(50*time.Minute))
	}
	if got := backuptest.ReadTable(t, filepath.Join(out, "2.jsonl")); fmt.Sprint(got) != fmt.Sprint([]string{backuptest.Row(2, 9, "nine", e.TS(6*time.Minute))}) {
		t.Errorf("table 2 of the dropped flow: %v", got)
	}
	src := e.Source()
	src.Prefix = "elsewhere"
	var op *backup.OutsidePrefixError
	if _, _, _, err := restore(t, src, backup.Lookup{ID: 1}, 0, nil); !errors.As(err, &op) || op.Prefix != "elsewhere" {
		t.Errorf("restore of the dropped flow under another prefix = %v, want a *backup.OutsidePrefixError", err)
	}
}

// TestRestoreNoCheckpoint: a flow whose checkpoint never moved has nothing
// restorable.
func TestRestoreNoCheckpoint(t *testing.T) {
	e := backuptest.NewTimed(t)
	if err := e.Redis.Client(t).HSet(context.Background(), meta.NewKeys("flowlog").FlowState(1), "checkpoint_ts", "0").Err(); err != nil {
		t.Fatal(err)
	}
	var nc *backup.NoCheckpointError
	if _, _, _, err := restore(t, e.Source(), flowF, 0, nil); !errors.As(err, &nc) || nc.Flow.ID != 1 {
		t.Fatalf("restore without a checkpoint = %v, want a *backup.NoCheckpointError", err)
	}
}

// TestRestoreHistoryV1ThenV2: a flow backed up in layout v1 and then in v2
// (one upgrade) restores from both; dropped, it is found by id from its
// newest meta, a v2 one that names it among its flows, with the group's
// global checkpoint object as its checkpoint.
func TestRestoreHistoryV1ThenV2(t *testing.T) {
	e := backuptest.NewTimed(t) // v1 cycles up to 50m
	ctx := context.Background()
	e.CommitV2(t, e.TS(56*time.Minute), sinktest.WritePut(2, 9, e.TS(51*time.Minute), e.TS(52*time.Minute), []byte("v2 nine"), true),
		sinktest.WritePut(1, 3, e.TS(53*time.Minute), e.TS(54*time.Minute), []byte("three"), true))
	want := func(ts uint64) map[string][]string {
		out := map[string][]string{
			"1.jsonl": {backuptest.Row(1, 1, "late", e.TS(48*time.Minute))},
			"2.jsonl": {backuptest.Row(2, 9, "nine", e.TS(6*time.Minute))},
		}
		if ts >= e.TS(54*time.Minute) {
			out["1.jsonl"] = append(out["1.jsonl"], backuptest.Row(1, 3, "three", e.TS(54*time.Minute)))
			out["2.jsonl"] = []string{backuptest.Row(2, 9, "v2 nine", e.TS(52*time.Minute))}
		}
		return out
	}
	check := func(name string, l backup.Lookup, ts uint64) {
		t.Helper()
		out, res, _, err := restore(t, e.Source(), l, ts, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := map[string][]string{}
		for _, f := range []string{"1.jsonl", "2.jsonl"} {
			got[f] = backuptest.ReadTable(t, filepath.Join(out, f))
		}
		if w := want(res.TS); fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s as of %d: %v, want %v", name, res.TS, got, w)
		}
	}
	check("live, at the checkpoint", flowF, 0)
	check("live, before the upgrade", flowF, e.TS(50*time.Minute))

	info, _, err := e.Store.FlowInfo(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Store.DestroyFlow(ctx, 1, info); err != nil {
		t.Fatal(err)
	}
	// The drop's until entries are pending: the restore is complete up to
	// the checkpoint at the drop, 56m.
	check("dropped, by id", backup.Lookup{ID: 1}, e.TS(56*time.Minute))
	f, err := backup.Resolve(ctx, e.Source(), backup.Lookup{ID: 1})
	if err != nil || !f.Dropped || f.String() != "default/f" {
		t.Errorf("Resolve of the dropped flow = %+v, %v; want default/f, dropped", f, err)
	}
}
