package sink_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// kv is one apply event of a hand-built backup.
type kv struct {
	table, handle int64
	cf            string // "write" or "default"
	op            string // "put" or "delete"
	ts            uint64 // commit ts (write) or start ts (default)
	value         []byte // write record or default value
}

func wput(table, handle int64, commit, start uint64, short string) kv {
	w := event.Write{Type: event.WritePut, StartTS: start, ShortValue: []byte(short), HasShortValue: short != ""}
	return wrec(table, handle, commit, w)
}

func wrec(table, handle int64, commit uint64, w event.Write) kv {
	v, err := event.AppendWrite(nil, w)
	if err != nil {
		panic(err)
	}
	return kv{table: table, handle: handle, cf: "write", op: "put", ts: commit, value: v}
}

func wtype(table, handle int64, commit, start uint64, t event.WriteType) kv {
	return wrec(table, handle, commit, event.Write{Type: t, StartTS: start})
}

func dput(table, handle int64, start uint64, v []byte) kv {
	return kv{table: table, handle: handle, cf: "default", op: "put", ts: start, value: v}
}

// writeBackup stores events as one cycle: a data object with one chunk per
// (table, cf, op), then its meta. It returns the meta path.
func writeBackup(t testing.TB, b sink.Bucket, cycle string, compression string, evs []kv) string {
	t.Helper()
	return writeBackupWith(t, b, cycle, compression, evs, nil)
}

// writeBackupWith is writeBackup with mod applied to the meta before it is
// stored.
func writeBackupWith(t testing.TB, b sink.Bucket, cycle string, compression string, evs []kv, mod func(*sink.Meta)) string {
	t.Helper()
	type group struct {
		table  int64
		cf, op string
	}
	chunks := map[group][]kv{}
	var order []group
	for _, e := range evs {
		g := group{e.table, e.cf, e.op}
		if _, ok := chunks[g]; !ok {
			order = append(order, g)
		}
		chunks[g] = append(chunks[g], e)
	}
	var buf bytes.Buffer
	w, err := sink.NewObjectWriter(&buf, compression)
	if err != nil {
		t.Fatal(err)
	}
	m := sink.Meta{Version: 1, Flow: "f", FlowID: 1, CycleID: cycle, DataPath: "default/f/v1/20220307/07/1-" + cycle + ".log", MinTS: 1 << 63}
	for _, g := range order {
		var framed []byte
		f := sink.FileMeta{Compression: compression, TableID: g.table, CF: g.cf, Op: g.op, MinTS: 1<<64 - 1}
		for _, e := range chunks[g] {
			key := event.AppendDataKey(nil, event.RowKey(e.table, e.handle), e.ts)
			framed = event.AppendEntry(framed, key, e.value)
			f.NumberOfEntries++
			f.MinTS, f.MaxTS = min(f.MinTS, e.ts), max(f.MaxTS, e.ts)
		}
		f.MinBeginTSInDefaultCF = f.MinTS
		f.Offset, f.Length, f.RawLength, err = w.AddChunk(bytes.NewReader(framed))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(framed)
		f.SHA256 = hex.EncodeToString(sum[:])
		m.Files = append(m.Files, f)
		m.MinTS, m.MaxTS = min(m.MinTS, f.MinTS), max(m.MaxTS, f.MaxTS)
	}
	ctx := context.Background()
	if err := b.Upload(ctx, sink.Object{Name: m.DataPath, Body: &buf, Size: w.Size(), CRC32C: w.CRC32C()}); err != nil {
		t.Fatal(err)
	}
	if mod != nil {
		mod(&m)
	}
	mb, err := sink.EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	path := sink.MetaPath("", "default", "f", 1, 1, cycle)
	if err := b.Upload(ctx, sink.Object{Name: path, Body: bytes.NewReader(mb), Size: int64(len(mb)), CRC32C: sink.CRC32C(mb)}); err != nil {
		t.Fatal(err)
	}
	return path
}

// testFlow is the flow writeBackup writes.
var testFlow = sink.Flow{Catalog: "default", Name: "f", ID: 1}

type row struct {
	Key      string `json:"key"`
	Value    string `json:"value"`
	CommitTS uint64 `json:"commit_ts"`
}

// readTables reads every <table>.jsonl in dir as "handle=value@ts" strings.
func readTables(t testing.TB, dir string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	names, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			t.Fatal(err)
		}
		table := strings.TrimSuffix(filepath.Base(n), ".jsonl")
		out[table] = []string{}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 64<<20)
		var prev []byte
		for sc.Scan() {
			var r row
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("%s: %v", n, err)
			}
			raw, _ := hex.DecodeString(r.Key)
			if prev != nil && bytes.Compare(prev, raw) >= 0 {
				t.Fatalf("%s: keys not sorted", n)
			}
			prev = raw
			v, _ := base64.StdEncoding.DecodeString(r.Value)
			handle := int64(uint64(raw[11])<<56|uint64(raw[12])<<48|uint64(raw[13])<<40|uint64(raw[14])<<32|uint64(raw[15])<<24|uint64(raw[16])<<16|uint64(raw[17])<<8|uint64(raw[18])) ^ -1<<63
			out[table] = append(out[table], fmt.Sprintf("%d=%s@%d", handle, v, r.CommitTS))
		}
		f.Close()
	}
	return out
}

func TestRestoreMVCC(t *testing.T) {
	big := bytes.Repeat([]byte("L"), 300)
	evs := []kv{
		// Key 1: put at 10, delete at 20, put again at 30.
		wput(1, 1, 10, 9, "a"), wtype(1, 1, 20, 19, event.WriteDelete), wput(1, 1, 30, 29, "b"),
		// Key 2: put at 10, then a rollback and a lock record newer: skipped.
		wput(1, 2, 10, 8, "c"), wtype(1, 2, 25, 25, event.WriteRollback), wtype(1, 2, 26, 24, event.WriteLock),
		// Key 3: large values through the default CF, many versions.
		dput(1, 3, 5, big), wput(1, 3, 6, 5, ""),
		dput(1, 3, 11, []byte("v11-long")), wput(1, 3, 12, 11, ""),
		dput(1, 3, 40, []byte("v40-after")), wput(1, 3, 41, 40, ""),
		// Key -5 (negative handle sorts first): only a delete.
		wtype(1, -5, 15, 14, event.WriteDelete),
		// Table 2: a put whose default value is in a delete-op chunk
		// (ignored) and a normal one.
		wput(2, 7, 22, 21, "t2"),
		{table: 2, handle: 7, cf: "write", op: "delete", ts: 22},
		// A lock-only key is absent.
		wtype(2, 8, 23, 22, event.WriteLock),
	}
	ctx := context.Background()
	for _, comp := range []string{sink.CompressionNone, sink.CompressionZstd} {
		b := sink.NewMemBucket()
		// Split across two cycles to exercise several metas.
		metas := []string{writeBackup(t, b, "c1", comp, evs[:7]), writeBackup(t, b, "c2", comp, evs[7:])}
		for _, tc := range []struct {
			ts     uint64
			tables map[int64]bool
			want   map[string][]string
			first  uint64 // a *NoDataError naming this first write record
		}{
			{5, nil, nil, 6},
			{9, nil, map[string][]string{"1": {"3=" + string(big) + "@6"}}, 0},
			{10, nil, map[string][]string{"1": {"1=a@10", "2=c@10", "3=" + string(big) + "@6"}}, 0},
			{19, nil, map[string][]string{"1": {"1=a@10", "2=c@10", "3=v11-long@12"}}, 0},
			{20, nil, map[string][]string{"1": {"2=c@10", "3=v11-long@12"}}, 0},
			{23, nil, map[string][]string{"1": {"2=c@10", "3=v11-long@12"}, "2": {"7=t2@22"}}, 0},
			{5, map[int64]bool{2: true}, nil, 22},
			{21, map[int64]bool{2: true}, nil, 22},
			{22, map[int64]bool{2: true}, map[string][]string{"2": {"7=t2@22"}}, 0},
			{30, nil, map[string][]string{"1": {"1=b@30", "2=c@10", "3=v11-long@12"}, "2": {"7=t2@22"}}, 0},
			{100, nil, map[string][]string{"1": {"1=b@30", "2=c@10", "3=v40-after@41"}, "2": {"7=t2@22"}}, 0},
			{100, map[int64]bool{2: true}, map[string][]string{"2": {"7=t2@22"}}, 0},
			{6, map[int64]bool{1: true}, map[string][]string{"1": {"3=" + string(big) + "@6"}}, 0},
		} {
			t.Run(fmt.Sprintf("%s/ts=%d/tables=%v", comp, tc.ts, tc.tables), func(t *testing.T) {
				out := t.TempDir()
				st, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: tc.ts, Tables: tc.tables, OutDir: out, TempDir: t.TempDir()})
				if tc.first != 0 {
					var nd *sink.NoDataError
					if !errors.As(err, &nd) || nd.First != tc.first || nd.TS != tc.ts {
						t.Fatalf("restore at %d = %v, want a NoDataError naming %d", tc.ts, err, tc.first)
					}
					if files, _ := os.ReadDir(out); len(files) != 0 {
						t.Fatalf("restore before the data wrote %v", files)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				got := readTables(t, out)
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("restore at %d:\n got %v\nwant %v", tc.ts, got, tc.want)
				}
				var keys int64
				for _, r := range got {
					keys += int64(len(r))
				}
				if st.Keys != keys || st.Tables != len(tc.want) || st.Chunks == 0 && keys > 0 {
					t.Fatalf("stats %+v, want %d keys in %d tables", st, keys, len(tc.want))
				}
			})
		}
	}
}

func TestRestoreMissingDefault(t *testing.T) {
	b := sink.NewMemBucket()
	metas := []string{writeBackup(t, b, "c1", "none", []kv{wput(1, 1, 10, 9, "")})}
	_, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: 10, OutDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "no default-CF entry") {
		t.Fatalf("Restore = %v, want missing default-CF error", err)
	}
}

func TestRestoreCorrupt(t *testing.T) {
	ctx := context.Background()
	for _, comp := range []string{sink.CompressionNone, sink.CompressionZstd} {
		t.Run(comp, func(t *testing.T) {
			b := sink.NewMemBucket()
			mp := writeBackup(t, b, "c1", comp, []kv{wput(1, 1, 10, 9, "a"), dput(1, 2, 5, []byte("some default value")), wput(1, 2, 6, 5, "")})
			rc, _ := b.Get(ctx, mp)
			var m sink.Meta
			json.NewDecoder(rc).Decode(&m)
			f := m.Files[1]
			if !b.Corrupt(m.DataPath, f.Offset+f.Length-3) {
				t.Fatal("corrupt failed")
			}
			_, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: []string{mp}, TS: 100, OutDir: t.TempDir()})
			var ce *sink.ChecksumError
			if !errors.As(err, &ce) || ce.Object != m.DataPath || ce.Chunk != 1 {
				t.Fatalf("Restore = %v, want checksum error of chunk 1 of %s", err, m.DataPath)
			}
			if !strings.Contains(err.Error(), m.DataPath) || !strings.Contains(err.Error(), "chunk 1") {
				t.Fatalf("error does not name object and chunk: %v", err)
			}
		})
	}
}

// randomBackup makes n transactions over a few tables and returns the events
// and the expected restore at each ts in tss, computed naively.
func randomBackup(seed uint64, n int, valueSize int) []kv {
	r := rand.New(rand.NewPCG(seed, seed))
	var evs []kv
	ts := uint64(100)
	for range n {
		table, handle := int64(1+r.IntN(3)), int64(r.IntN(n/4+1))
		start := ts
		commit := ts + 1
		ts += 2
		switch x := r.IntN(10); {
		case x < 1:
			evs = append(evs, wtype(table, handle, commit, start, event.WriteDelete))
		case x < 2:
			evs = append(evs, wtype(table, handle, commit, start, event.WriteRollback))
		case x < 6:
			evs = append(evs, wput(table, handle, commit, start, fmt.Sprintf("s%d", commit)))
		default:
			v := bytes.Repeat([]byte{byte('a' + r.IntN(26))}, valueSize)
			evs = append(evs, dput(table, handle, start, v), wput(table, handle, commit, start, ""))
		}
	}
	return evs
}

func expectRestore(evs []kv, ts uint64) map[string][]string {
	type ver struct {
		commit uint64
		w      event.Write
	}
	newest := map[[2]int64]ver{}
	defaults := map[string][]byte{}
	tables := map[int64]bool{}
	for _, e := range evs {
		k := [2]int64{e.table, e.handle}
		if e.cf == "default" {
			defaults[fmt.Sprint(k, e.ts)] = e.value
			continue
		}
		w, _ := event.DecodeWrite(e.value)
		if e.ts > ts {
			continue
		}
		tables[e.table] = true
		if w.Type == event.WriteRollback || w.Type == event.WriteLock {
			continue
		}
		if v, ok := newest[k]; !ok || v.commit < e.ts {
			newest[k] = ver{e.ts, w}
		}
	}
	out := map[string][]string{}
	for t := range tables {
		out[fmt.Sprint(t)] = []string{}
	}
	var keys [][2]int64
	for k := range newest {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]int64) int {
		if a[0] != b[0] {
			return int(a[0] - b[0])
		}
		return int(a[1] - b[1])
	})
	for _, k := range keys {
		v := newest[k]
		if v.w.Type == event.WriteDelete {
			continue
		}
		val := v.w.ShortValue
		if !v.w.HasShortValue {
			val = defaults[fmt.Sprint(k, v.w.StartTS)]
		}
		out[fmt.Sprint(k[0])] = append(out[fmt.Sprint(k[0])], fmt.Sprintf("%d=%s@%d", k[1], val, v.commit))
	}
	return out
}

// TestRestoreSpill restores more data than MaxMemory, so both sorts spill
// runs and merge them, and compares with a naive computation.
func TestRestoreSpill(t *testing.T) {
	evs := randomBackup(7, 20000, 1000)
	b := sink.NewMemBucket()
	var metas []string
	for i := 0; i < len(evs); i += 5000 {
		metas = append(metas, writeBackup(t, b, fmt.Sprintf("c%d", i), "zstd", evs[i:min(i+5000, len(evs))]))
	}
	for _, ts := range []uint64{15000, 30000, 1 << 62} {
		t.Run(fmt.Sprint(ts), func(t *testing.T) {
			tmp := t.TempDir()
			out := t.TempDir()
			st, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: ts, OutDir: out, TempDir: tmp, MaxMemory: 2 << 20})
			if err != nil {
				t.Fatal(err)
			}
			if st.LogBytes < 4<<20 { // twice MaxMemory: both sorts spill
				t.Fatalf("only %d log bytes; the test must exceed MaxMemory", st.LogBytes)
			}
			want := expectRestore(evs, ts)
			got := readTables(t, out)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("restore differs from the naive MVCC read (%d vs %d tables)", len(got), len(want))
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Fatalf("temp files left: %v", left)
			}
		})
	}
}

func TestRestoreCancelled(t *testing.T) {
	b := sink.NewMemBucket()
	metas := []string{writeBackup(t, b, "c1", "none", randomBackup(3, 2000, 100))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: 1 << 62, OutDir: t.TempDir()}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Restore with a cancelled context = %v", err)
	}
}
