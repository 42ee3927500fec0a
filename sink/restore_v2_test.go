package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// countingBucket counts what is read of a bucket: whole-object reads by
// name, and ranged reads with the bytes they delivered.
type countingBucket struct {
	sink.Bucket
	mu         sync.Mutex
	gets       map[string]int
	ranges     int
	rangeBytes map[string]int64
}

func newCountingBucket(b sink.Bucket) *countingBucket {
	return &countingBucket{Bucket: b, gets: map[string]int{}, rangeBytes: map[string]int64{}}
}

func (c *countingBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	c.mu.Lock()
	c.gets[name]++
	c.mu.Unlock()
	return c.Bucket.Get(ctx, name)
}

func (c *countingBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	rc, err := c.Bucket.GetRange(ctx, name, off, length)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.ranges++
	c.mu.Unlock()
	return &countingReader{ReadCloser: rc, add: func(n int) {
		c.mu.Lock()
		c.rangeBytes[name] += int64(n)
		c.mu.Unlock()
	}}, nil
}

type countingReader struct {
	io.ReadCloser
	add func(int)
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.add(n)
	return n, err
}

// sharedEvents are the events of three flows whose tables overlap: flow 1
// covers tables 10 and 11, flow 2 tables 11 and 12, flow 3 table 12. Every
// table gets puts with short and with default-CF values, deletes and
// rewrites, at commit ts from base on.
func sharedEvents(base uint64) []sinktest.Entry {
	flows := map[int64][]uint32{10: {1}, 11: {1, 2}, 12: {2, 3}}
	var out []sinktest.Entry
	for _, table := range []int64{10, 11, 12} {
		for h := int64(1); h <= 6; h++ {
			ts := base + uint64(table*100+h*10)
			var es []sinktest.Entry
			if h%2 == 0 {
				val := bytes.Repeat([]byte{byte(h)}, 300)
				es = append(es, sinktest.DefaultPut(table, h, ts-1, val), sinktest.WritePut(table, h, ts-1, ts, val, false))
			} else {
				es = append(es, sinktest.WritePut(table, h, ts-1, ts, []byte(fmt.Sprintf("v%d-%d", table, h)), true))
			}
			if h == 3 {
				es = append(es, sinktest.WritePut(table, h, ts+1, ts+2, []byte("rewritten"), true))
			}
			for _, e := range es {
				e.FlowIDs = flows[table]
				out = append(out, e)
			}
		}
	}
	return out
}

var sharedFlows = []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "a"}, {FlowID: 2, Catalog: "default", Name: "b"}, {FlowID: 3, Catalog: "default", Name: "c"}}

// only returns the entries flow id routed, without flow ids, as a v1
// cycle of the flow holds them.
func only(es []sinktest.Entry, id uint32) []sinktest.Entry {
	var out []sinktest.Entry
	for _, e := range es {
		if slices.Contains(e.FlowIDs, id) {
			e.FlowIDs = nil
			out = append(out, e)
		}
	}
	return out
}

// restoreDir restores flow f of b as of ts from metas and returns the
// files written, by name.
func restoreDir(t *testing.T, b sink.Bucket, f sink.Flow, metas []string, ts uint64) map[string]string {
	t.Helper()
	out := t.TempDir()
	if _, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: b, Flow: f, MetaPaths: metas, TS: ts, OutDir: out, TempDir: t.TempDir()}); err != nil {
		t.Fatalf("restore %s as of %d: %v", f, ts, err)
	}
	files := map[string]string{}
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(out, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(raw)
	}
	return files
}

// A restore of one flow of three that share a cycle reads only the chunks
// tagged with its id, each with one ranged read, and gives what a layout v1
// backup of the same events gives; a flow whose history starts in v1 and
// goes on in v2 reads both.
func TestRestoreV2SharedCycle(t *testing.T) {
	const base = 1 << 40
	mem := sink.NewMemBucket()
	evs := sharedEvents(base)
	var first, second []sinktest.Entry
	for i, e := range evs {
		if i%3 == 0 {
			first = append(first, e)
		} else {
			second = append(second, e)
		}
	}
	// Flow 1's history: a v1 cycle, then two shared v2 cycles.
	_, v1Path := sinktest.WriteCycle(t, mem, sinktest.Cycle{Catalog: "default", Flow: "a", FlowID: 1, CycleID: "old", ResolvedTS: base,
		Entries: only(sharedEvents(base-1000), 1)})
	m1, p1 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "1-0-aa", ResolvedTS: base + 1, Flows: sharedFlows, Entries: first, Compression: sink.CompressionZstd})
	m2, p2 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "2-0-bb", ResolvedTS: base + 2, Flows: sharedFlows, Entries: second})

	// The oracle: the same events as v1 cycles of each flow alone.
	oracle := sink.NewMemBucket()
	ts := uint64(base + 2000)
	for _, f := range sharedFlows {
		flow := sink.Flow{Catalog: f.Catalog, Name: f.Name, ID: f.FlowID}
		var metas []string
		if f.FlowID == 1 {
			_, p := sinktest.WriteCycle(t, oracle, sinktest.Cycle{Catalog: "default", Flow: "a", FlowID: 1, CycleID: "old", ResolvedTS: base,
				Entries: only(sharedEvents(base-1000), 1)})
			metas = append(metas, p)
		}
		_, p := sinktest.WriteCycle(t, oracle, sinktest.Cycle{Catalog: f.Catalog, Flow: f.Name, FlowID: f.FlowID, CycleID: "v1", ResolvedTS: base + 1, Entries: only(evs, f.FlowID)})
		want := restoreDir(t, oracle, flow, append(metas, p), ts)

		cb := newCountingBucket(mem)
		v2metas := []string{p1, p2}
		if f.FlowID == 1 {
			v2metas = append([]string{v1Path}, v2metas...)
		}
		got := restoreDir(t, cb, flow, v2metas, ts)
		if fmt.Sprint(got) != fmt.Sprint(want) || len(got) == 0 {
			t.Errorf("flow %d: restore from the shared cycles\n%v\nwant\n%v", f.FlowID, got, want)
		}
		// What was read: each meta (twice: to plan, then to read), and of
		// the shared data objects exactly the flow's chunks.
		wantBytes := map[string]int64{}
		ranges := 0
		for _, m := range []sink.Meta{m1, m2} {
			for _, fm := range m.Files {
				if m.Holds(f.FlowID, &fm) {
					wantBytes[m.DataPath] += fm.Length
					ranges++
				}
			}
		}
		for _, m := range []sink.Meta{m1, m2} {
			if got := cb.rangeBytes[m.DataPath]; got != wantBytes[m.DataPath] {
				t.Errorf("flow %d read %d bytes of %s, want %d (its chunks' bytes)", f.FlowID, got, m.DataPath, wantBytes[m.DataPath])
			}
			if cb.gets[m.DataPath] != 0 {
				t.Errorf("flow %d read all of the shared object %s", f.FlowID, m.DataPath)
			}
		}
		if f.FlowID == 1 {
			old, _ := sink.DecodeMeta(mustGet(t, mem, v1Path))
			ranges += len(old.Files) // every chunk of the v1 cycle is the flow's
		}
		if cb.ranges != ranges {
			t.Errorf("flow %d: %d ranged reads, want one per chunk of the flow (%d)", f.FlowID, cb.ranges, ranges)
		}
		for _, p := range v2metas {
			if cb.gets[p] != 2 {
				t.Errorf("flow %d: meta %s read %d times, want 2", f.FlowID, p, cb.gets[p])
			}
		}
	}
}

func mustGet(t *testing.T, b sink.Bucket, name string) []byte {
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

// The same (key, ts, value) in two chunks, in two metas, or in a v1 and a
// v2 meta, restores as once: a restore from the bucket alone lists the
// metas of crashed and fenced cycles too, which hold duplicates.
func TestRestoreIgnoresDuplicates(t *testing.T) {
	const base = 1 << 40
	mem := sink.NewMemBucket()
	evs := sharedEvents(base)
	flow := sink.Flow{Catalog: "default", Name: "b", ID: 2}
	_, once := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "1-0-aa", ResolvedTS: base + 1, Flows: sharedFlows, Entries: evs})
	_, zombie := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{StoreID: "other", CycleID: "1-0-ab", ResolvedTS: base + 1, Flows: sharedFlows, Entries: evs})
	twice := append(slices.Clone(evs), evs[len(evs)/2:]...) // the second half twice in one chunk each
	_, inner := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "1-0-ac", ResolvedTS: base + 1, Flows: sharedFlows, Entries: twice})
	_, v1 := sinktest.WriteCycle(t, mem, sinktest.Cycle{Catalog: "default", Flow: "b", FlowID: 2, CycleID: "v1", ResolvedTS: base, Entries: only(evs, 2)})
	for _, ts := range []uint64{base + 1150, base + 1235, base + 5000} {
		want := restoreDir(t, mem, flow, []string{once}, ts)
		for name, metas := range map[string][]string{
			"two metas":     {once, zombie},
			"in one chunk":  {inner},
			"v1 and v2":     {v1, once},
			"all of them":   {v1, inner, zombie, once},
			"twice the one": {once, once},
		} {
			if got := restoreDir(t, mem, flow, metas, ts); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("as of %d, %s: %v, want %v", ts, name, got, want)
			}
		}
	}
}

// A v2 meta is read for a flow only if it serves the flow and its data
// object lies under the prefix's v2 log directory.
func TestRestoreV2RefusesForeignMeta(t *testing.T) {
	const base = 1 << 40
	mem := sink.NewMemBucket()
	evs := sharedEvents(base)
	_, p := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{Prefix: "pre", CycleID: "1-0-aa", ResolvedTS: base + 1, Flows: sharedFlows[:2], Entries: only2(evs)})
	ctx := context.Background()
	for name, f := range map[string]sink.Flow{
		"a flow the meta does not serve": {Prefix: "pre", Catalog: "default", Name: "c", ID: 3},
		"another prefix":                 {Prefix: "other", Catalog: "default", Name: "a", ID: 1},
	} {
		_, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: mem, Flow: f, MetaPaths: []string{p}, TS: base + 5000, OutDir: t.TempDir(), TempDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: %v, want the meta refused", name, err)
		}
	}
}

// only2 drops flow 3 from the entries' flows (and the entries of no flow
// left).
func only2(es []sinktest.Entry) []sinktest.Entry {
	var out []sinktest.Entry
	for _, e := range es {
		e.FlowIDs = slices.DeleteFunc(slices.Clone(e.FlowIDs), func(id uint32) bool { return id == 3 })
		if len(e.FlowIDs) > 0 {
			out = append(out, e)
		}
	}
	return out
}

// A snapshot of one flow of shared cycles reads only its chunks, and a
// restore from it plus the shared log after it equals one from the log.
func TestSnapshotV2(t *testing.T) {
	const base = 1 << 40
	ctx := context.Background()
	mem := sink.NewMemBucket()
	evs := sharedEvents(base)
	_, p1 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "1-0-aa", ResolvedTS: base + 1, Flows: sharedFlows, Entries: evs[:len(evs)/2]})
	_, p2 := sinktest.WriteCycleV2(t, mem, sinktest.CycleV2{CycleID: "2-0-bb", ResolvedTS: base + 2, Flows: sharedFlows, Entries: evs[len(evs)/2:]})
	flow := sink.Flow{Catalog: "default", Name: "b", ID: 2}
	metas := []string{p1, p2}
	const snapTS = base + 1150
	st, err := sink.Snapshot(ctx, sink.SnapshotOptions{Bucket: mem, Flow: flow, MetaPaths: metas, TS: snapTS, TempDir: t.TempDir(),
		Windows: map[int64]sink.SnapshotWindow{11: {Since: base}, 12: {Since: base}}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Tables != 2 || st.Keys == 0 {
		t.Fatalf("snapshot %+v, want tables 11 and 12 with keys", st)
	}
	for _, ts := range []uint64{snapTS, base + 1235, base + 5000} {
		windows := map[int64]sink.TableWindow{11: {Since: base, Until: ts}, 12: {Since: base, Until: ts}}
		read := func(snaps []sink.SnapshotRef) (string, sink.RestoreStats) {
			out := t.TempDir()
			rs, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: mem, Flow: flow, MetaPaths: metas, TS: ts, Windows: windows, Snapshots: snaps, OutDir: out, TempDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			var all []string
			for _, tid := range []string{"11", "12"} {
				raw, _ := os.ReadFile(filepath.Join(out, tid+".jsonl"))
				all = append(all, string(raw))
			}
			return strings.Join(all, "|"), rs
		}
		want, _ := read(nil)
		got, rs := read([]sink.SnapshotRef{{TS: snapTS, Path: st.MetaPath}})
		if got != want || rs.FromSnapshot != 2 {
			t.Errorf("as of %d: from the snapshot (%d tables) %q, from the log %q", ts, rs.FromSnapshot, got, want)
		}
	}
}

// A chunk that cannot be read fails the restore with its error while the
// metas are still being read for the chunk readers: the reader of metas
// stops, and nothing is left running.
func TestRestoreFailsWhileMetasStream(t *testing.T) {
	const base = 1 << 40
	ctx := context.Background()
	mem := sink.NewMemBucket()
	var metas []string
	for i := range 300 {
		m, p := sinktest.WriteCycle(t, mem, sinktest.Cycle{Catalog: "default", Flow: "a", FlowID: 1, CycleID: fmt.Sprint(i), ResolvedTS: base + uint64(i),
			Entries: []sinktest.Entry{sinktest.WritePut(1, int64(i), base+uint64(i), base+uint64(i)+1, []byte("v"), true)}})
		if err := mem.Delete(ctx, m.DataPath); err != nil {
			t.Fatal(err)
		}
		metas = append(metas, p)
	}
	for range 20 {
		_, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: mem, Flow: sink.Flow{Catalog: "default", Name: "a", ID: 1}, MetaPaths: metas,
			TS: base + 1000, OutDir: t.TempDir(), TempDir: t.TempDir(), Parallel: 2})
		if !errors.Is(err, sink.ErrNotExist) {
			t.Fatalf("restore with its data objects gone: %v, want ErrNotExist", err)
		}
	}
}
