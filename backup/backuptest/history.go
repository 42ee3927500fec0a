package backuptest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// Txn is one generated transaction on one row of table 1: a short put, a
// long put (its value a default-CF entry at Start, logged when prewritten),
// or a delete.
type Txn struct {
	Handle        int64
	Start, Commit uint64
	Value         []byte // nil for a delete
	Long          bool
}

// History is flow default/f on table 1 with a random history of cycles
// committed as the consumer commits them: what retention (snapshot,
// truncate, gc) is tested on.
type History struct {
	*Env
	Txns []Txn
	// Checkpoint is the flow's checkpoint: the resolved ts of the last
	// cycle.
	Checkpoint uint64
	// Flow is the flow the helpers restore (default: default/f by name).
	Flow backup.Lookup
}

// Handles are the rows a History writes.
var Handles = []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

// NewHistory writes, under Redis and bucket prefix name, cycles cycles of
// 50 ms each (from three hours ago), about perCycle transactions apiece,
// some of which prewrote their value cycles before they committed.
func NewHistory(t testing.TB, rd *testenv.Redis, g *testenv.GCS, name string, seed uint64, cycles, perCycle int) *History {
	t.Helper()
	return newHistory(t, rd, g, name, seed, cycles, perCycle, false)
}

// NewHistoryV2 is NewHistory in layout v2 (Env.CommitV2): every cycle is
// shared with flow 2, which lists it too.
func NewHistoryV2(t testing.TB, rd *testenv.Redis, g *testenv.GCS, name string, seed uint64, cycles, perCycle int) *History {
	t.Helper()
	return newHistory(t, rd, g, name, seed, cycles, perCycle, true)
}

func newHistory(t testing.TB, rd *testenv.Redis, g *testenv.GCS, name string, seed uint64, cycles, perCycle int, v2 bool) *History {
	t.Helper()
	h := &History{Env: New(t, rd, g, name, name, 1), Flow: backup.Lookup{Catalog: "default", Name: "f"}}
	h.Base = time.Now().Add(-3 * time.Hour).Truncate(time.Millisecond)
	rng := rand.New(rand.NewPCG(seed, 1))
	const cycleMS = 50
	var now int64 = 1
	for j := 0; now < int64(cycles)*cycleMS-1; j++ {
		now += 1 + rng.Int64N(2*cycleMS/int64(perCycle))
		tx := Txn{Handle: 1 + rng.Int64N(12), Commit: h.MS(now, 0)}
		back := 1 + rng.Int64N(min(now-1, 3*cycleMS)+1)
		tx.Start = h.MS(max(now-back, 0), uint64(j+1))
		switch r := rng.IntN(10); {
		case r < 5:
			tx.Value = []byte(fmt.Sprintf("s%d", j))
		case r < 8:
			tx.Value, tx.Long = bytes.Repeat([]byte{byte('a' + j%26)}, 300+j%7), true
		}
		if tx.Start < tx.Commit && now < int64(cycles)*cycleMS {
			h.Txns = append(h.Txns, tx)
		}
	}
	for k := range cycles {
		lo, hi := h.MS(int64(k)*cycleMS, 0), h.MS(int64(k+1)*cycleMS, 0)
		var entries []sinktest.Entry
		for _, tx := range h.Txns {
			if tx.Long && tx.Start > lo && tx.Start <= hi {
				entries = append(entries, sinktest.DefaultPut(1, tx.Handle, tx.Start, tx.Value))
			}
			if tx.Commit > lo && tx.Commit <= hi {
				w := event.Write{Type: event.WritePut, StartTS: tx.Start}
				switch {
				case tx.Value == nil:
					w.Type = event.WriteDelete
				case !tx.Long:
					w.ShortValue, w.HasShortValue = tx.Value, true
				}
				entries = append(entries, sinktest.WriteRecord(1, tx.Handle, tx.Commit, w))
			}
		}
		if v2 {
			h.CommitV2(t, hi, entries...)
		} else {
			h.Commit(t, hi, entries...)
		}
		h.Checkpoint = hi
	}
	return h
}

// MS is the TSO of Base + ms milliseconds, with logical part l.
func (h *History) MS(ms int64, l uint64) uint64 {
	return event.ComposeTS(h.Base.Add(time.Duration(ms)*time.Millisecond).UnixMilli(), l)
}

// State is the MVCC read of the generated history at ts: handle -> value.
func (h *History) State(ts uint64) map[int64]string {
	out := map[int64]string{}
	latest := map[int64]uint64{}
	for _, tx := range h.Txns {
		if tx.Commit > ts || tx.Commit < latest[tx.Handle] {
			continue
		}
		latest[tx.Handle] = tx.Commit
		if tx.Value == nil {
			delete(out, tx.Handle)
		} else {
			out[tx.Handle] = string(tx.Value)
		}
	}
	return out
}

// Snapshot takes and lists a snapshot at ts with backup.Snapshot and
// returns the bytes of its objects.
func (h *History) Snapshot(t testing.TB, ts uint64) int64 {
	t.Helper()
	ctx := context.Background()
	_, err := backup.Snapshot(ctx, h.Source(), h.Store, backup.SnapshotRequest{
		Request: backup.Request{Flow: h.Flow, TS: ts, MaxClockSkew: Skew}, TempDir: t.TempDir()})
	if err != nil {
		t.Fatalf("snapshot at %d: %v", ts, err)
	}
	dir := strings.TrimSuffix(sink.SnapshotMetaPath(h.Prefix, "default", "f", 1, ts), "snapshot.meta")
	var n int64
	err = h.Bucket.(sink.Lister).List(ctx, dir, func(o sink.ObjectInfo) error { n += o.Size; return nil })
	if err != nil || n == 0 {
		t.Fatalf("snapshot at %d: %d bytes under %s, %v", ts, n, dir, err)
	}
	return n
}

// Restore restores h.Flow as of ts with backup.Restore into a new
// directory and returns the files it wrote, by name, and its result.
func (h *History) Restore(t testing.TB, ts uint64, logOnly bool) (map[string]string, backup.RestoreResult, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "out")
	res, err := backup.Restore(context.Background(), h.Source(), backup.RestoreRequest{
		Request: backup.Request{Flow: h.Flow, TS: ts, MaxClockSkew: Skew}, LogOnly: logOnly, OutDir: dir, TempDir: t.TempDir()})
	if err != nil {
		return nil, res, err
	}
	return ReadDir(t, dir), res, nil
}

// Baseline restores the flow from the log alone at each of tss, checks each
// against the generated history, and returns what each wrote.
func (h *History) Baseline(t testing.TB, tss ...uint64) map[uint64]map[string]string {
	t.Helper()
	out := map[uint64]map[string]string{}
	for _, ts := range tss {
		files, _, err := h.Restore(t, ts, true)
		if err != nil {
			t.Fatalf("restore at %d: %v", ts, err)
		}
		got := map[int64]string{}
		for line := range strings.SplitSeq(files["1.jsonl"], "\n") {
			if line == "" {
				continue
			}
			var r struct {
				Key   string `json:"key"`
				Value []byte `json:"value"`
			}
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(Handles, func(hd int64) bool { return RowHex(1, hd) == r.Key })
			if i < 0 {
				t.Fatalf("restore at %d wrote key %s, not a generated row", ts, r.Key)
			}
			got[Handles[i]] = string(r.Value)
		}
		if want := h.State(ts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("restore at %d from the log gives\n%v\nwant\n%v", ts, got, want)
		}
		out[ts] = files
	}
	return out
}

// CheckRestores checks what truncate and gc promise: at every ts of base
// the restore (from a snapshot where one serves) writes byte for byte what
// it wrote before; and once the flow is truncated, a restore below the
// truncation point is refused with a *backup.TruncatedError naming it.
func (h *History) CheckRestores(t testing.TB, base map[uint64]map[string]string) {
	t.Helper()
	for ts, want := range base {
		got, _, err := h.Restore(t, ts, false)
		if err != nil {
			t.Fatalf("restore at %d: %v", ts, err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("restore at %d differs from the one before:\n%v\nwant\n%v", ts, got, want)
		}
	}
	tb, ok, err := h.Store.TruncatedBefore(context.Background(), 1)
	if err != nil || !ok {
		return
	}
	_, _, err = h.Restore(t, tb-1, false)
	var te *backup.TruncatedError
	if !errors.As(err, &te) || te.TruncatedBefore != tb || te.TS != tb-1 {
		t.Fatalf("restore at %d, below the truncation point %d: %v, want a *backup.TruncatedError naming it", tb-1, tb, err)
	}
}

// RestoreTSs are the ts CheckRestores checks after a snapshot at s: s, a
// commit ts halfway from s to the checkpoint, the checkpoint, and the
// commit ts of the first 3 puts after s whose value was prewritten at or
// before s (a truncate must keep the metas holding those values).
func (h *History) RestoreTSs(s uint64) []uint64 {
	var after, prewritten []uint64
	for _, tx := range h.Txns {
		if tx.Commit > s {
			after = append(after, tx.Commit)
			if tx.Long && tx.Start <= s && len(prewritten) < 3 {
				prewritten = append(prewritten, tx.Commit)
			}
		}
	}
	out := append([]uint64{s, h.Checkpoint}, prewritten...)
	if len(after) > 0 {
		out = append(out, after[len(after)/2])
	}
	return out
}

// ObjectNames lists every object under the bucket prefix.
func (h *History) ObjectNames(t testing.TB) []string {
	t.Helper()
	var out []string
	if err := h.Bucket.Iter(context.Background(), h.Prefix+"/", func(n string) error { out = append(out, n); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// StoredBytes is the bytes of the objects under the bucket prefix,
// checkpoints left out.
func (h *History) StoredBytes(t testing.TB) int64 {
	t.Helper()
	var n int64
	err := h.Bucket.(sink.Lister).List(context.Background(), h.Prefix+"/", func(o sink.ObjectInfo) error {
		if !strings.Contains(o.Name, "/global_checkpoint/") {
			n += o.Size
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ListedMetas reads every meta listed for the flow, whole, failing the test
// if one is missing or damaged.
func (h *History) ListedMetas(t testing.TB) []sink.Meta {
	t.Helper()
	ctx := context.Background()
	paths, err := backup.MetaPaths(ctx, h.Store, 1)
	if err != nil {
		t.Fatal(err)
	}
	var out []sink.Meta
	for _, p := range paths {
		rc, err := h.Bucket.Get(ctx, p)
		if err != nil {
			t.Fatalf("a listed meta is unreadable: %v", err)
		}
		raw, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		m, err := sink.DecodeMeta(raw)
		if err != nil {
			t.Fatalf("listed meta %s: %v", p, err)
		}
		out = append(out, m)
	}
	return out
}

// LogBytesAfter is the stored bytes of m's chunks with an event newer than
// ts: what a restore at or above ts still reads of it.
func LogBytesAfter(m sink.Meta, ts uint64) int64 {
	var n int64
	for _, f := range m.Files {
		if f.MaxTS > ts && f.NumberOfEntries > 0 {
			n += f.Length
		}
	}
	return n
}
