package backup_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// selTables are the tables of the selective restore's backup.
var selTables = []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}

const (
	selCycles = 4
	selRows   = 300 // new rows per table and cycle
	selSnapAt = 2   // the snapshot is taken after this many cycles
)

// selectiveBackup writes flow default/f on ten tables of the same shape:
// cycle k inserts rows k*selRows... of every table (half with short values,
// half with 2 KiB values through the default CF), and updates or deletes
// some rows of the previous cycle's block, so that each chunk covers about
// two blocks of keys. A snapshot (of small chunks) is taken after
// selSnapAt cycles. It returns the env and the checkpoint.
func selectiveBackup(t *testing.T, rd *testenv.Redis, g *testenv.GCS, name string, v2 bool) (*backuptest.Env, uint64) {
	t.Helper()
	e := backuptest.New(t, rd, g, name, name, selTables...)
	rng := rand.New(rand.NewPCG(21, 4))
	value := func(n int) []byte {
		v := make([]byte, n)
		for i := range v {
			v[i] = byte('a' + rng.IntN(26))
		}
		return v
	}
	var rts uint64
	for k := range selCycles {
		ts := e.TS(time.Duration(k)*10*time.Minute + time.Minute)
		var es []sinktest.Entry
		for _, tb := range selTables {
			table := int64(tb)
			for i := range selRows {
				h := int64(k*selRows + i)
				start, commit := ts, ts+1
				ts += 2
				if i%2 == 0 {
					es = append(es, sinktest.WritePut(table, h, start, commit, value(100), true))
				} else {
					v := value(2048)
					es = append(es, sinktest.DefaultPut(table, h, start, v), sinktest.WritePut(table, h, start, commit, v, false))
				}
			}
			for i := 0; k > 0 && i < selRows/10; i++ {
				h := int64((k-1)*selRows + i*7)
				start, commit := ts, ts+1
				ts += 2
				if i%3 == 0 {
					es = append(es, sinktest.WriteRecord(table, h, commit, event.Write{Type: event.WriteDelete, StartTS: start}))
				} else {
					es = append(es, sinktest.WritePut(table, h, start, commit, value(100), true))
				}
			}
		}
		rts = e.TS(time.Duration(k+1) * 10 * time.Minute)
		if v2 {
			e.CommitV2(t, rts, es...)
		} else {
			e.Commit(t, rts, es...)
		}
		if k+1 == selSnapAt {
			_, err := backup.Snapshot(context.Background(), e.Source(), e.Store, backup.SnapshotRequest{
				Request: backup.Request{Flow: flowF, TS: rts, MaxClockSkew: backuptest.Skew}, TempDir: t.TempDir(), ChunkSize: 64 << 10})
			if err != nil {
				t.Fatalf("snapshot: %v", err)
			}
		}
	}
	return e, rts
}

// selRestore restores e's flow as of ts with sel, reading through a
// counter, and returns the files written, the result and the bytes read.
func selRestore(t *testing.T, e *backuptest.Env, ts uint64, sel backup.Selection, logOnly bool) (map[string]string, backup.RestoreResult, int64) {
	t.Helper()
	return selRestoreFrom(t, e.Source(), ts, sel, logOnly)
}

// selRestoreFrom is selRestore from src.
func selRestoreFrom(t *testing.T, src backup.Source, ts uint64, sel backup.Selection, logOnly bool) (map[string]string, backup.RestoreResult, int64) {
	t.Helper()
	rc := sinktest.NewReadCounter(src.Bucket)
	src.Bucket = rc
	out := filepath.Join(t.TempDir(), "out")
	res, err := backup.Restore(context.Background(), src, backup.RestoreRequest{
		Request:   backup.Request{Flow: flowF, TS: ts, MaxClockSkew: backuptest.Skew},
		Selection: sel, LogOnly: logOnly, OutDir: out, TempDir: t.TempDir(),
	})
	if err != nil {
		t.Fatalf("restore of %+v: %v", sel, err)
	}
	return backuptest.ReadDir(t, out), res, rc.Total()
}

// tableShares is, per table, its part of the stored bytes of the chunks
// and snapshot chunks that the listed metas and snapshots hold.
func tableShares(t *testing.T, e *backuptest.Env) map[int64]float64 {
	t.Helper()
	ctx := context.Background()
	bytes := map[int64]int64{}
	paths, err := backup.MetaPaths(ctx, e.Store, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		m, err := sink.DecodeMeta(readObject(t, e.Bucket, p))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m.Files {
			bytes[f.TableID] += f.Length
		}
	}
	snaps, err := backup.SnapshotRefs(ctx, e.Store, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		m, err := sink.DecodeSnapshotMeta(readObject(t, e.Bucket, s.Path))
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range m.Tables {
			for _, c := range tb.Chunks {
				bytes[tb.TableID] += c.Length
			}
		}
	}
	var total int64
	for _, n := range bytes {
		total += n
	}
	out := map[int64]float64{}
	for id, n := range bytes {
		out[id] = float64(n) / float64(total)
	}
	return out
}

func readObject(t *testing.T, b sink.Bucket, name string) []byte {
	t.Helper()
	rc, err := b.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// inRange is the lines of a restored table whose key lies in [start, end).
func inRange(t *testing.T, content string, start, end []byte) string {
	t.Helper()
	var out strings.Builder
	for line := range strings.Lines(content) {
		var r struct {
			Key string `json:"key"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		k, err := hex.DecodeString(r.Key)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Compare(k, start) >= 0 && (end == nil || bytes.Compare(k, end) < 0) {
			out.WriteString(line)
		}
	}
	return out.String()
}

// TestSelectiveRestore restores one table of ten and key ranges of a
// backup with a snapshot, in both layouts: each writes exactly the full
// restore's rows of what it selects, and reads only the chunks (of the log
// and of the snapshot) that can hold them, as counted in bytes the GCS
// client read.
func TestSelectiveRestore(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	for _, v2 := range []bool{false, true} {
		name := "v1"
		if v2 {
			name = "v2"
		}
		t.Run(name, func(t *testing.T) {
			e, ckpt := selectiveBackup(t, rd, g, "sel"+name, v2)
			shares := tableShares(t, e)
			full, fullRes, fullBytes := selRestore(t, e, ckpt, backup.Selection{}, false)
			if len(full) != len(selTables) || fullRes.Stats.FromSnapshot != len(selTables) {
				t.Fatalf("full restore wrote %d files, %d tables from a snapshot; want %d of each", len(full), fullRes.Stats.FromSnapshot, len(selTables))
			}
			logFull, _, logFullBytes := selRestore(t, e, ckpt, backup.Selection{}, true)
			for name, content := range full {
				if logFull[name] != content {
					t.Fatalf("%s: the full restore from the log alone differs from the one from the snapshot", name)
				}
			}

			t.Run("one table", func(t *testing.T) {
				for _, logOnly := range []bool{false, true} {
					got, _, n := selRestore(t, e, ckpt, backup.Selection{Tables: map[int64]bool{4: true}}, logOnly)
					want, all := full["4.jsonl"], fullBytes
					if logOnly {
						all = logFullBytes
					}
					if len(got) != 1 || got["4.jsonl"] != want || want == "" {
						t.Errorf("log only %v: files %v, want 4.jsonl as the full restore wrote it", logOnly, slices.Sorted(mapKeys(got)))
					}
					share := float64(all) * shares[4]
					t.Logf("log only %v: table 4 read %d bytes, %.2fx its share %.0f of the full restore's %d", logOnly, n, float64(n)/share, share, all)
					if float64(n) > 1.2*share {
						t.Errorf("log only %v: table 4 read %d bytes, more than 1.2x its share %.0f of the full restore's %d", logOnly, n, share, all)
					}
				}
			})

			t.Run("key range across tables", func(t *testing.T) {
				start, end := event.RowKey(3, 450), event.RowKey(5, 700)
				got, _, n := selRestore(t, e, ckpt, backup.Selection{StartKey: start, EndKey: end}, false)
				want := map[string]string{"3.jsonl": inRange(t, full["3.jsonl"], start, end), "4.jsonl": full["4.jsonl"],
					"5.jsonl": inRange(t, full["5.jsonl"], start, end)}
				checkFiles(t, got, want)
				if share := float64(fullBytes) * (shares[3] + shares[4] + shares[5]); float64(n) > 1.2*share {
					t.Errorf("read %d bytes, more than 1.2x the three tables' share %.0f", n, share)
				}
			})

			t.Run("key range in one table", func(t *testing.T) {
				// Rows 0-99 of table 7: the first cycle's block, which only
				// the first two cycles' chunks and the snapshot's first
				// chunks hold.
				start, end := event.TablePrefix(7), event.RowKey(7, 100)
				_, _, table7 := selRestore(t, e, ckpt, backup.Selection{Tables: map[int64]bool{7: true}}, false)
				_, _, table7Log := selRestore(t, e, ckpt, backup.Selection{Tables: map[int64]bool{7: true}}, true)
				for _, logOnly := range []bool{false, true} {
					got, res, n := selRestore(t, e, ckpt, backup.Selection{Tables: map[int64]bool{7: true}, StartKey: start, EndKey: end}, logOnly)
					checkFiles(t, got, map[string]string{"7.jsonl": inRange(t, full["7.jsonl"], start, end)})
					whole := table7
					if logOnly {
						whole = table7Log
					}
					t.Logf("log only %v: rows 0-99 of table 7 read %d bytes (%d chunks), the whole table %d", logOnly, n, res.Stats.Chunks, whole)
					if float64(n) > 0.6*float64(whole) {
						t.Errorf("log only %v: rows 0-99 of table 7 read %d bytes, more than 0.6x the whole table's %d", logOnly, n, whole)
					}
				}
			})

			if v2 { // layout v1 is restorable with Redis only
				t.Run("from the bucket alone", func(t *testing.T) {
					e.WriteCatalog(t, 1, 1)
					bucket := backup.Source{Store: &backup.BucketStore{Bucket: e.Bucket, Prefix: e.Prefix, Group: backuptest.Group},
						Bucket: e.Bucket, Prefix: e.Prefix, Group: backuptest.Group}
					for _, sel := range []backup.Selection{
						{Tables: map[int64]bool{4: true}},
						{StartKey: event.RowKey(3, 450), EndKey: event.RowKey(5, 700)},
						{Tables: map[int64]bool{7: true}, EndKey: event.RowKey(7, 100)},
					} {
						want, _, _ := selRestore(t, e, ckpt, sel, false)
						got, _, _ := selRestoreFrom(t, bucket, ckpt, sel, false)
						checkFiles(t, got, want)
					}
				})
			}

			t.Run("at an earlier ts", func(t *testing.T) {
				ts := e.TS(25 * time.Minute) // between the snapshot and the checkpoint
				all, _, _ := selRestore(t, e, ts, backup.Selection{}, false)
				start, end := event.RowKey(9, 200), []byte(nil)
				got, _, _ := selRestore(t, e, ts, backup.Selection{StartKey: start}, false)
				checkFiles(t, got, map[string]string{"9.jsonl": inRange(t, all["9.jsonl"], start, end), "10.jsonl": all["10.jsonl"]})
			})
		})
	}
}

func checkFiles(t *testing.T, got, want map[string]string) {
	t.Helper()
	if !slices.Equal(slices.Sorted(mapKeys(got)), slices.Sorted(mapKeys(want))) {
		t.Fatalf("files %v, want %v", slices.Sorted(mapKeys(got)), slices.Sorted(mapKeys(want)))
	}
	for name, w := range want {
		if w == "" {
			t.Errorf("%s: the full restore has no row in the range: the test selects nothing", name)
		}
		if got[name] != w {
			t.Errorf("%s: %d bytes, want the full restore's %d bytes in the range", name, len(got[name]), len(w))
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestSelectionValidate: a selection that can hold no key is refused
// before anything is read.
func TestSelectionValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		sel  backup.Selection
		ok   bool
	}{
		{"all", backup.Selection{}, true},
		{"start only", backup.Selection{StartKey: event.RowKey(2, 5)}, true},
		{"table in range", backup.Selection{Tables: map[int64]bool{2: true}, StartKey: event.RowKey(2, 5), EndKey: event.TablePrefix(3)}, true},
		{"start at end", backup.Selection{StartKey: event.RowKey(2, 5), EndKey: event.RowKey(2, 5)}, false},
		{"start past end", backup.Selection{StartKey: event.RowKey(2, 6), EndKey: event.RowKey(2, 5)}, false},
		{"table outside range", backup.Selection{Tables: map[int64]bool{1: true, 2: true}, StartKey: event.RowKey(2, 5)}, false},
		{"end at the table's first key", backup.Selection{Tables: map[int64]bool{3: true}, EndKey: event.TablePrefix(3)}, false},
		{"below every table", backup.Selection{EndKey: []byte("t")}, false},
		{"past every table", backup.Selection{StartKey: []byte("u")}, false},
		{"from a short t key", backup.Selection{StartKey: []byte("t")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.sel.Validate()
			if tc.ok != (err == nil) || err != nil && !errors.Is(err, backup.ErrEmptySelection) {
				t.Errorf("Validate = %v, want ok %v", err, tc.ok)
			}
		})
	}
	for _, tc := range []struct {
		flags backup.SelectionFlags
		err   string
	}{
		{backup.SelectionFlags{StartKey: "zz"}, `--start-key: "zz" is not a hex raw key`},
		{backup.SelectionFlags{EndKey: "abc"}, `--end-key: "abc" is not a hex raw key`},
		{backup.SelectionFlags{StartKey: "7402", EndKey: "7401"}, "--start-key 7402 is not before --end-key 7401"},
		{backup.SelectionFlags{Tables: "1,x"}, `--tables: "x" is not a table id`},
		{backup.SelectionFlags{EndKey: "6d"}, "--start-key/--end-key: the selection holds no key: no table key lies in [, 6d)"},
		{backup.SelectionFlags{Tables: "1", StartKey: fmt.Sprintf("%x", event.TablePrefix(2))}, "table 1 has no key in"},
	} {
		if _, err := tc.flags.Selection(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %v, want %q", tc.flags, err, tc.err)
		}
	}
}
