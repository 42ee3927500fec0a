package sink_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// snapFixture is a flow with two tables in a MemBucket and a snapshot of
// it at ts 100.
func snapFixture(t *testing.T) (*sink.MemBucket, []string, sink.SnapshotRef) {
	t.Helper()
	ctx := context.Background()
	b := sink.NewMemBucket()
	var es []sinktest.Entry
	for h := range int64(40) {
		es = append(es, sinktest.WritePut(1, h, 10+uint64(h), 60+uint64(h), []byte("value"), true),
			sinktest.DefaultPut(2, h, 10+uint64(h), bytes.Repeat([]byte("v"), 300)),
			sinktest.WritePut(2, h, 10+uint64(h), 60+uint64(h), nil, false))
	}
	_, mp := sinktest.WriteCycle(t, b, sinktest.Cycle{Catalog: "default", Flow: "f", FlowID: 1, CycleID: "c1", ResolvedTS: 100, Entries: es})
	st, err := sink.Snapshot(ctx, sink.SnapshotOptions{Bucket: b, Flow: testFlow, MetaPaths: []string{mp}, TS: 100,
		Windows: map[int64]sink.SnapshotWindow{1: {Since: 1}, 2: {Since: 1}}, TempDir: t.TempDir(), ChunkSize: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if st.Keys != 80 || st.Objects != 3 {
		t.Fatalf("snapshot stats %+v, want 80 keys in 3 objects", st)
	}
	return b, []string{mp}, sink.SnapshotRef{TS: 100, Path: st.MetaPath}
}

// copySnapshot stores the snapshot of ref again at ts, with mod applied to
// its meta and table 2's object bytes.
func copySnapshot(t *testing.T, b *sink.MemBucket, ref sink.SnapshotRef, ts uint64, mod func(m *sink.SnapshotMeta, obj []byte) []byte) sink.SnapshotRef {
	t.Helper()
	ctx := context.Background()
	m, err := sink.ReadSnapshotMeta(ctx, b, testFlow, ref)
	if err != nil {
		t.Fatal(err)
	}
	m.TS = ts
	for i := range m.Tables {
		tb := &m.Tables[i]
		rc, err := b.Get(ctx, tb.DataPath)
		if err != nil {
			t.Fatal(err)
		}
		obj, _ := io.ReadAll(rc)
		rc.Close()
		if tb.TableID == 2 && mod != nil {
			obj = mod(&m, obj)
		}
		tb.DataPath = sink.SnapshotTablePath("", "default", "f", 1, ts, tb.TableID)
		if obj != nil {
			upload(t, b, tb.DataPath, obj)
		}
	}
	raw, err := sink.EncodeSnapshotMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	path := sink.SnapshotMetaPath("", "default", "f", 1, ts)
	upload(t, b, path, raw)
	return sink.SnapshotRef{TS: ts, Path: path}
}

func upload(t *testing.T, b sink.Bucket, name string, body []byte) {
	t.Helper()
	if err := b.Upload(context.Background(), sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
		t.Fatal(err)
	}
}

// table2 returns table 2 of m.
func table2(m *sink.SnapshotMeta) *sink.SnapshotTable {
	for i := range m.Tables {
		if m.Tables[i].TableID == 2 {
			return &m.Tables[i]
		}
	}
	panic("no table 2")
}

// TestVerifySnapshots checks that verify passes a sound snapshot, counts
// its objects as referenced, and reports each kind of damage; and that a
// restore from a damaged snapshot fails instead of writing wrong data.
func TestVerifySnapshots(t *testing.T) {
	ctx := context.Background()
	b, metas, good := snapFixture(t)
	r, err := sink.Verify(ctx, sink.VerifyOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, Snapshots: []sink.SnapshotRef{good}})
	if err != nil || !r.OK() || r.Snapshots != 1 || r.SnapshotTables != 2 || r.SnapshotChunks < 4 || r.Unreferenced != 0 {
		t.Fatalf("verify of a sound snapshot: %v, %+v", err, r)
	}
	for i, tc := range []struct {
		name  string
		mod   func(m *sink.SnapshotMeta, obj []byte) []byte
		fault string
	}{
		{"sha256", func(m *sink.SnapshotMeta, obj []byte) []byte {
			table2(m).Chunks[0].SHA256 = strings.Repeat("0", 64)
			return obj
		}, "sha256"},
		{"count", func(m *sink.SnapshotMeta, obj []byte) []byte {
			table2(m).Chunks[1].NumberOfEntries++
			return obj
		}, "entries, the snapshot meta says"},
		{"min key", func(m *sink.SnapshotMeta, obj []byte) []byte {
			c := &table2(m).Chunks[0]
			c.MinKey = c.MaxKey
			return obj
		}, "min_key and max_key"},
		{"missing object", func(m *sink.SnapshotMeta, obj []byte) []byte { return nil }, "is missing"},
		{"key order", func(m *sink.SnapshotMeta, obj []byte) []byte {
			// A chunk whose entries are in reverse order, with a
			// matching sha256 and count.
			var framed []byte
			var keys [][]byte
			for h := int64(5); h >= 0; h-- {
				k := event.AppendDataKey(nil, event.RowKey(2, h), 60+uint64(h))
				framed = event.AppendEntry(framed, k, []byte("x"))
				keys = append(keys, k)
			}
			var buf bytes.Buffer
			w, _ := sink.NewObjectWriter(&buf, sink.CompressionZstd)
			off, length, raw, _ := w.AddChunk(bytes.NewReader(framed))
			sum := sha256.Sum256(framed)
			table2(m).Chunks = []sink.SnapshotChunk{{Offset: off, Length: length, RawLength: raw, SHA256: hex.EncodeToString(sum[:]),
				NumberOfEntries: 6, MinKey: hex.EncodeToString(keys[0]), MaxKey: hex.EncodeToString(keys[5])}}
			return buf.Bytes()
		}, "keys do not increase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := copySnapshot(t, b, good, 200+uint64(i), tc.mod)
			r, err := sink.Verify(ctx, sink.VerifyOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, Snapshots: []sink.SnapshotRef{good, bad}})
			if err != nil || r.OK() || !strings.Contains(strings.Join(r.Faults, "\n"), tc.fault) {
				t.Fatalf("verify: %v, faults %q; want one containing %q", err, r.Faults, tc.fault)
			}
			if tc.name == "min key" {
				return // the keys are sound: restore does not read min_key
			}
			_, err = sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: bad.TS, OutDir: t.TempDir(), Force: true,
				Windows: map[int64]sink.TableWindow{1: {Since: 1, Until: bad.TS}, 2: {Since: 1, Until: bad.TS}}, Snapshots: []sink.SnapshotRef{good, bad}, TempDir: t.TempDir()})
			if err == nil {
				t.Fatal("restore from the damaged snapshot succeeded")
			}
		})
	}
}

// TestRestoreTruncated checks the truncation point: below it nothing is
// restored; at or above it a table whose window began before it needs a
// snapshot at or after it.
func TestRestoreTruncated(t *testing.T) {
	ctx := context.Background()
	b, metas, snap := snapFixture(t)
	for _, tc := range []struct {
		name  string
		ts    uint64
		snaps []sink.SnapshotRef
		want  string // "": the restore succeeds; "all": a *TruncatedError for all tables; "table": for one
	}{
		{"below the point", 99, []sink.SnapshotRef{snap}, "all"},
		{"no snapshot", 100, nil, "table"},
		{"snapshot at the point", 100, []sink.SnapshotRef{snap}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			windows := map[int64]sink.TableWindow{1: {Since: 1, Until: tc.ts}, 2: {Since: 1, Until: tc.ts}}
			_, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: tc.ts, Windows: windows,
				Snapshots: tc.snaps, TruncatedBefore: 100, OutDir: t.TempDir(), Force: true, TempDir: t.TempDir()})
			var te *sink.TruncatedError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("restore: %v", err)
			case tc.want != "" && !(errors.As(err, &te) && te.TruncatedBefore == 100 && (te.Table < 0) == (tc.want == "all")):
				t.Fatalf("restore = %v, want a *TruncatedError for %s", err, tc.want)
			}
		})
	}
}
