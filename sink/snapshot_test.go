package sink_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// window is a coverage window of the random flows: since, until (0 while
// open).
type window struct {
	table        int64
	since, until uint64
}

// randFlow is a random backup: transactions over a few tables with few
// keys (many versions each), short values inline and large values in the
// default CF prewritten well before their commit, deletes, lock and
// rollback records, cut into cycles as the pipeline would (each event in the
// cycle of its own ts, so a value often lands cycles before its commit).
type randFlow struct {
	metas   []string
	windows []window
	last    uint64 // ts of the last event
}

func newRandFlow(t *testing.T, b sink.Bucket, prefix string, r *rand.Rand) *randFlow {
	t.Helper()
	const tables = 3
	f := &randFlow{}
	type ev struct {
		ts uint64
		e  sinktest.Entry
	}
	var evs []ev
	ts := uint64(1000)
	used := map[uint64]bool{}
	for range 600 + r.IntN(400) {
		table, handle := int64(1+r.IntN(tables)), int64(r.IntN(25))
		commit := ts + uint64(1+r.IntN(4))
		start := commit - uint64(1+r.IntN(3))
		if r.IntN(4) == 0 {
			start = commit - uint64(1+r.IntN(400)) // prewritten long before
		}
		for used[start] { // TSOs are unique: no two values at one (key, start ts)
			start--
		}
		used[start] = true
		ts = commit
		switch x := r.IntN(20); {
		case x < 3:
			evs = append(evs, ev{commit, sinktest.WriteRecord(table, handle, commit, event.Write{Type: event.WriteDelete, StartTS: start})})
		case x == 3:
			evs = append(evs, ev{commit, sinktest.WriteRecord(table, handle, commit, event.Write{Type: event.WriteRollback, StartTS: start})})
		case x == 4:
			evs = append(evs, ev{commit, sinktest.WriteRecord(table, handle, commit, event.Write{Type: event.WriteLock, StartTS: start})})
		case x < 12:
			v := fmt.Appendf(nil, "s%d-%d", handle, commit)
			evs = append(evs, ev{commit, sinktest.WritePut(table, handle, start, commit, v, true)})
		default:
			v := bytes.Repeat(fmt.Appendf(nil, "L%d-%d.", handle, commit), 40+r.IntN(40))
			evs = append(evs, ev{start, sinktest.DefaultPut(table, handle, start, v)},
				ev{commit, sinktest.WritePut(table, handle, start, commit, v, false)})
		}
	}
	f.last = ts
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].ts < evs[j].ts })
	for i, cycle := 0, 0; i < len(evs); cycle++ {
		n := min(len(evs)-i, 40+r.IntN(120))
		es := make([]sinktest.Entry, 0, n)
		for _, e := range evs[i : i+n] {
			es = append(es, e.e)
		}
		i += n
		_, path := sinktest.WriteCycle(t, b, sinktest.Cycle{Prefix: prefix, Catalog: "default", Flow: "f", FlowID: 1, CycleID: fmt.Sprint(cycle),
			Compression: []string{sink.CompressionNone, sink.CompressionZstd}[cycle%2], ResolvedTS: evs[i-1].ts, Entries: es})
		f.metas = append(f.metas, path)
	}
	// Windows: table 1 covers everything; the others have one to three
	// windows with gaps, some ending early, some starting late.
	f.windows = append(f.windows, window{table: 1, since: 900})
	for table := int64(2); table <= tables; table++ {
		at := uint64(900 + r.IntN(int(ts-900)/3))
		for k := 0; k < 1+r.IntN(3) && at < ts; k++ {
			end := at + uint64(1+r.IntN(int(ts-900)/2))
			w := window{table: table, since: at}
			if end < ts || r.IntN(2) == 0 {
				w.until = end
			}
			f.windows = append(f.windows, w)
			if w.until == 0 {
				break
			}
			at = end + uint64(1+r.IntN(200))
		}
	}
	return f
}

// at returns the windows holding ts, as Restore and Snapshot take them.
func (f *randFlow) at(ts uint64) (map[int64]sink.TableWindow, map[int64]sink.SnapshotWindow) {
	rw, sw := map[int64]sink.TableWindow{}, map[int64]sink.SnapshotWindow{}
	for _, w := range f.windows {
		if w.since > ts || w.until != 0 && w.until < ts {
			continue
		}
		until := ts
		var u *uint64
		if w.until != 0 {
			u = new(uint64)
			*u = w.until
			until = min(until, w.until)
		}
		rw[w.table] = sink.TableWindow{Since: w.since, Until: until}
		sw[w.table] = sink.SnapshotWindow{Since: w.since, Until: u}
	}
	return rw, sw
}

// TestRestoreWithSnapshotsEqualsLog checks that a restore that starts from
// snapshots gives byte for byte the files, and the same counts, as a
// restore from the log alone, over random flows, snapshot ts (snapshots
// built on older snapshots too) and many restore ts, through the GCS client
// against fake-gcs-server, with the snapshots listed in a real Redis.
func TestRestoreWithSnapshotsEqualsLog(t *testing.T) {
	ctx := context.Background()
	g := testenv.StartGCS(t)
	rdb := testenv.StartRedis(t)
	noValueChunks := 0
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			b, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: g.Endpoint()})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			store := meta.NewStore(rdb.Client(t), fmt.Sprint("snap", seed), nil)
			flow := sink.Flow{Prefix: fmt.Sprint("p", seed), Catalog: "default", Name: "f", ID: 1}
			r := rand.New(rand.NewPCG(seed, 7))
			f := newRandFlow(t, b, flow.Prefix, r)
			snapTS := []uint64{}
			for range 3 {
				snapTS = append(snapTS, 1000+uint64(r.IntN(int(f.last-1000))))
			}
			slices.Sort(snapTS)
			snapTS = slices.Compact(snapTS)
			listed := func() []sink.SnapshotRef {
				refs, err := store.Snapshots(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				var out []sink.SnapshotRef
				for _, s := range refs {
					out = append(out, sink.SnapshotRef{TS: s.TS, Path: s.Path})
				}
				return out
			}
			for _, s := range snapTS {
				_, sw := f.at(s)
				if len(sw) == 0 {
					continue
				}
				st, err := sink.Snapshot(ctx, sink.SnapshotOptions{Bucket: b, Flow: flow, MetaPaths: f.metas, Snapshots: listed(), TS: s,
					Windows: sw, TempDir: t.TempDir(), MaxMemory: 1 << 20, ChunkSize: 2 << 10})
				if err != nil {
					t.Fatalf("snapshot at %d: %v", s, err)
				}
				if err := store.AddSnapshot(ctx, 1, st.MetaPath); err != nil {
					t.Fatal(err)
				}
				m, err := sink.ReadSnapshotMeta(ctx, b, flow, sink.SnapshotRef{TS: s, Path: st.MetaPath})
				if err != nil {
					t.Fatal(err)
				}
				for _, tb := range m.Tables {
					for _, c := range tb.Chunks {
						if c.NoValue {
							noValueChunks++
						}
					}
				}
			}
			refs := listed()
			if len(refs) == 0 {
				t.Fatal("no snapshot taken")
			}
			based := 0
			for i := range 25 {
				ts := 1000 + uint64(r.IntN(int(f.last-1000)+50))
				if i < len(refs) {
					ts = refs[i].TS // exactly at a snapshot
				}
				rw, _ := f.at(ts)
				if len(rw) == 0 {
					continue
				}
				restore := func(snaps []sink.SnapshotRef) (sink.RestoreStats, string, error) {
					out := filepath.Join(t.TempDir(), "out")
					st, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: flow, MetaPaths: f.metas, TS: ts, Windows: rw,
						Snapshots: snaps, OutDir: out, TempDir: t.TempDir(), MaxMemory: 1 << 20})
					return st, out, err
				}
				want, wantDir, werr := restore(nil)
				got, gotDir, gerr := restore(refs)
				if (werr == nil) != (gerr == nil) {
					t.Fatalf("ts %d: restore from the log: %v; with snapshots: %v", ts, werr, gerr)
				}
				if werr != nil {
					continue
				}
				if got.Chunks < want.Chunks {
					based++
				}
				if got.Keys != want.Keys || got.NoValue != want.NoValue || got.Tables != want.Tables {
					t.Fatalf("ts %d: with snapshots %d keys, %d without value, %d tables; from the log %d, %d, %d",
						ts, got.Keys, got.NoValue, got.Tables, want.Keys, want.NoValue, want.Tables)
				}
				sameDirs(t, fmt.Sprint("ts ", ts), wantDir, gotDir)
			}
			if based == 0 {
				t.Fatal("no restore read fewer chunks with snapshots: they were not used")
			}
		})
	}
	if noValueChunks == 0 {
		t.Error("no snapshot recorded a key without value: that path went untested")
	}
}

// sameDirs fails unless dirs a and b hold the same files with the same
// bytes.
func sameDirs(t *testing.T, what, a, b string) {
	t.Helper()
	ea, err := os.ReadDir(a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := os.ReadDir(b)
	if err != nil {
		t.Fatal(err)
	}
	names := func(es []os.DirEntry) (out []string) {
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	if !slices.Equal(names(ea), names(eb)) {
		t.Fatalf("%s: files %v from the log, %v with snapshots", what, names(ea), names(eb))
	}
	for _, e := range ea {
		x, _ := os.ReadFile(filepath.Join(a, e.Name()))
		y, _ := os.ReadFile(filepath.Join(b, e.Name()))
		if !bytes.Equal(x, y) {
			lx, ly := bytes.Split(x, []byte("\n")), bytes.Split(y, []byte("\n"))
			for i := range min(len(lx), len(ly)) {
				if !bytes.Equal(lx[i], ly[i]) {
					t.Fatalf("%s: %s differs at line %d:\nfrom the log:   %.200s\nwith snapshots: %.200s", what, e.Name(), i+1, lx[i], ly[i])
				}
			}
			t.Fatalf("%s: %s differs: %d bytes from the log, %d with snapshots", what, e.Name(), len(x), len(y))
		}
	}
}

// TestSnapshotLargeValues restores from a snapshot whose chunks hold
// values larger than a reader's batch, several chunks read at once: the
// oversized batches go through one at a time, in order, and the result is
// the log's.
func TestSnapshotLargeValues(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	var es []sinktest.Entry
	for h := range int64(12) {
		v := bytes.Repeat([]byte{byte('a' + h)}, 100)
		if h%3 == 0 {
			v = bytes.Repeat([]byte{byte('a' + h)}, 3<<20)
		}
		es = append(es, sinktest.DefaultPut(1, h, 10+uint64(h), v), sinktest.WritePut(1, h, 10+uint64(h), 50+uint64(h), v, false))
	}
	_, mp := sinktest.WriteCycle(t, b, sinktest.Cycle{Catalog: "default", Flow: "f", FlowID: 1, CycleID: "c1", ResolvedTS: 100,
		Compression: sink.CompressionZstd, Entries: es})
	st, err := sink.Snapshot(ctx, sink.SnapshotOptions{Bucket: b, Flow: testFlow, MetaPaths: []string{mp}, TS: 100,
		Windows: map[int64]sink.SnapshotWindow{1: {Since: 1}}, TempDir: t.TempDir(), ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	restore := func(snaps []sink.SnapshotRef) string {
		out := t.TempDir()
		rs, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: []string{mp}, TS: 100, OutDir: out, Force: true,
			Windows: map[int64]sink.TableWindow{1: {Since: 1, Until: 100}}, Snapshots: snaps, TempDir: t.TempDir(), Parallel: 4})
		if err != nil || rs.Keys != 12 || rs.FromSnapshot != len(snaps) {
			t.Fatalf("restore with %d snapshots: %+v, %v", len(snaps), rs, err)
		}
		return out
	}
	sameDirs(t, "large values", restore(nil), restore([]sink.SnapshotRef{{TS: 100, Path: st.MetaPath}}))
}
