package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// txn is one generated transaction on one row of table 1: a short put, a
// long put (its value a default-CF entry at start, logged when prewritten),
// or a delete.
type txn struct {
	handle        int64
	start, commit uint64
	value         []byte // nil for a delete
	long          bool
}

// retentionEnv is flow "default/f" (id 1) with a random history of cycles
// committed as the consumer commits them, under Redis prefix and GCS prefix
// of its own, so that several can share one Redis and one GCS.
type retentionEnv struct {
	redis  *testenv.Redis
	gcs    *testenv.GCS
	store  *meta.Store
	bucket sink.Bucket
	prefix string
	conn   []string
	base   time.Time
	txns   []txn
	ckpt   uint64
	lease  meta.Lease
	flow   []string // the flow flags of restore (default --flow f)
}

// ms is the TSO of base + ms milliseconds, with logical part l.
func (e *retentionEnv) ms(ms int64, l uint64) uint64 {
	return event.ComposeTS(e.base.Add(time.Duration(ms)*time.Millisecond).UnixMilli(), l)
}

// newRetentionEnv writes cycles cycles of 50 ms each, about perCycle
// transactions apiece, some of which prewrote their value cycles before
// they committed.
func newRetentionEnv(t *testing.T, rd *testenv.Redis, g *testenv.GCS, name string, seed uint64, cycles, perCycle int) *retentionEnv {
	t.Helper()
	ctx := context.Background()
	e := &retentionEnv{redis: rd, gcs: g, prefix: name, base: time.Now().Add(-3 * time.Hour).Truncate(time.Millisecond)}
	e.store = meta.NewStore(rd.Client(t), name, nil)
	e.conn = []string{"--redis-url", rd.URL, "--redis-prefix", name, "--gcs-endpoint", g.Endpoint(), "--gcs-bucket", testenv.Bucket,
		"--gcs-prefix", name, "--group", "g1"}
	info := meta.FlowInfo{CatalogName: "default", FlowName: "f", SourceTableIDs: []uint32{1},
		SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "out"}, FlownodeIDs: map[uint32]uint64{0: 1}}
	if err := e.store.CreateFlow(ctx, 1, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	b, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: g.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	e.bucket = b
	lease, err := e.store.AcquireLease(ctx, "flowlog.apply", 0, "member-1")
	if err != nil {
		t.Fatal(err)
	}
	openWindows(t, e.store, lease)
	e.lease = lease

	rng := rand.New(rand.NewPCG(seed, 1))
	const cycleMS = 50
	var now int64 = 1
	for j := 0; now < int64(cycles)*cycleMS-1; j++ {
		now += 1 + rng.Int64N(2*cycleMS/int64(perCycle))
		tx := txn{handle: 1 + rng.Int64N(12), commit: e.ms(now, 0)}
		back := 1 + rng.Int64N(min(now-1, 3*cycleMS)+1)
		tx.start = e.ms(max(now-back, 0), uint64(j+1))
		switch r := rng.IntN(10); {
		case r < 5:
			tx.value = []byte(fmt.Sprintf("s%d", j))
		case r < 8:
			tx.value, tx.long = bytes.Repeat([]byte{byte('a' + j%26)}, 300+j%7), true
		}
		if tx.start < tx.commit && now < int64(cycles)*cycleMS {
			e.txns = append(e.txns, tx)
		}
	}
	for k := range cycles {
		lo, hi := e.ms(int64(k)*cycleMS, 0), e.ms(int64(k+1)*cycleMS, 0)
		var entries []sinktest.Entry
		for _, tx := range e.txns {
			if tx.long && tx.start > lo && tx.start <= hi {
				entries = append(entries, sinktest.DefaultPut(1, tx.handle, tx.start, tx.value))
			}
			if tx.commit > lo && tx.commit <= hi {
				w := event.Write{Type: event.WritePut, StartTS: tx.start}
				switch {
				case tx.value == nil:
					w.Type = event.WriteDelete
				case !tx.long:
					w.ShortValue, w.HasShortValue = tx.value, true
				}
				entries = append(entries, sinktest.WriteRecord(1, tx.handle, tx.commit, w))
			}
		}
		c := sinktest.Cycle{Prefix: name, Catalog: "default", Flow: "f", FlowID: 1, CycleID: fmt.Sprintf("c%d", k), ResolvedTS: hi,
			Entries: entries, Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: int64(k), To: int64(k + 1)}}}
		_, path := sinktest.WriteCycle(t, e.bucket, c)
		err := e.store.Commit(ctx, meta.Commit{
			Leases:     []meta.Lease{lease},
			Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: int64(k + 1), Checkpoint: hi, HasCheckpoint: true}},
			Metas:      []meta.MetaRef{{FlowID: 1, Path: path, MinResolvedTS: hi}},
			Flows:      []meta.FlowID{1}, LastFlushTS: hi,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.AdvanceCheckpoint(ctx, 1, hi); err != nil {
			t.Fatal(err)
		}
		e.ckpt = hi
	}
	g.CreateObject(fakeObject(sink.CheckpointPath(name, "default", "f", "g1", 1), sink.EncodeCheckpoint(e.ckpt)))
	return e
}

// state is the MVCC read of the generated history at ts: handle -> value.
func (e *retentionEnv) state(ts uint64) map[int64]string {
	out := map[int64]string{}
	latest := map[int64]uint64{}
	for _, tx := range e.txns {
		if tx.commit > ts || tx.commit < latest[tx.handle] {
			continue
		}
		latest[tx.handle] = tx.commit
		if tx.value == nil {
			delete(out, tx.handle)
		} else {
			out[tx.handle] = string(tx.value)
		}
	}
	return out
}

// snapshot takes a snapshot at ts with `consumer snapshot` and returns the
// bytes of its objects.
func (e *retentionEnv) snapshot(t *testing.T, ts uint64) int64 {
	t.Helper()
	if out, err := e.run(t, "snapshot", "--flow", "f", "--ts", fmt.Sprint(ts), "--temp-dir", t.TempDir()); err != nil {
		t.Fatalf("snapshot at %d: %v, stdout:\n%s", ts, err, out)
	}
	dir := strings.TrimSuffix(sink.SnapshotMetaPath(e.prefix, "default", "f", 1, ts), "snapshot.meta")
	var n int64
	err := e.bucket.(sink.Lister).List(context.Background(), dir, func(o sink.ObjectInfo) error { n += o.Size; return nil })
	if err != nil || n == 0 {
		t.Fatalf("snapshot at %d: %d bytes under %s, %v", ts, n, dir, err)
	}
	return n
}

// restore runs `consumer restore --ts ts` with args and returns a digest
// of the files it wrote, its stdout and its error.
func (e *retentionEnv) restore(t *testing.T, ts uint64, args ...string) (digest map[string]string, stdout string, err error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "out")
	flow := slices.Clone(e.flow)
	if flow == nil {
		flow = []string{"--flow", "f"}
	}
	stdout, err = e.run(t, "restore", append(append(flow, "--ts", fmt.Sprint(ts), "--out", dir, "--temp-dir", t.TempDir()), args...)...)
	if err != nil {
		return nil, stdout, err
	}
	entries, rerr := os.ReadDir(dir)
	if rerr != nil {
		t.Fatal(rerr)
	}
	digest = map[string]string{}
	for _, de := range entries {
		b, rerr := os.ReadFile(filepath.Join(dir, de.Name()))
		if rerr != nil {
			t.Fatal(rerr)
		}
		digest[de.Name()] = string(b)
	}
	return digest, stdout, nil
}

// baseline restores the flow from the log alone at each of tss, checks
// each against the generated history, and returns what each wrote.
func (e *retentionEnv) baseline(t *testing.T, tss ...uint64) map[uint64]map[string]string {
	t.Helper()
	out := map[uint64]map[string]string{}
	for _, ts := range tss {
		files, stdout, err := e.restore(t, ts, "--snapshots=false")
		if err != nil {
			t.Fatalf("restore at %d: %v, stdout:\n%s", ts, err, stdout)
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
			h := slices.IndexFunc(handles, func(h int64) bool { return rowHex(1, h) == r.Key })
			if h < 0 {
				t.Fatalf("restore at %d wrote key %s, not a generated row", ts, r.Key)
			}
			got[handles[h]] = string(r.Value)
		}
		if want := e.state(ts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("restore at %d from the log gives\n%v\nwant\n%v", ts, got, want)
		}
		out[ts] = files
	}
	return out
}

// handles are the rows newRetentionEnv writes.
var handles = []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

// checkRestores checks what truncate and gc promise with `consumer
// restore`: at every ts of base the restore (from a snapshot where one
// serves) writes byte for byte what it wrote before; and once the flow is
// truncated, a restore below the truncation point is refused naming the
// oldest restorable ts.
func (e *retentionEnv) checkRestores(t *testing.T, base map[uint64]map[string]string) {
	t.Helper()
	for ts, want := range base {
		got, stdout, err := e.restore(t, ts)
		if err != nil {
			t.Fatalf("restore at %d: %v, stdout:\n%s", ts, err, stdout)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("restore at %d differs from the one before:\n%v\nwant\n%v\nstdout:\n%s", ts, got, want, stdout)
		}
	}
	tb, ok, err := e.store.TruncatedBefore(context.Background(), 1)
	if err != nil || !ok {
		return
	}
	_, stdout, err := e.restore(t, tb-1)
	if want := fmt.Sprintf("the oldest restorable ts is %d", tb); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("restore at %d, below the truncation point %d: %v (want an error naming %q), stdout:\n%s", tb-1, tb, err, want, stdout)
	}
}

// restoreTSs are the ts checkRestores checks after a snapshot at s: s,
// a commit ts halfway from s to the checkpoint, the checkpoint, and the
// commit ts of the first 3 puts after s whose value was prewritten at or
// before s (a truncate must keep the metas holding those values).
func (e *retentionEnv) restoreTSs(s uint64) []uint64 {
	var after, prewritten []uint64
	for _, tx := range e.txns {
		if tx.commit > s {
			after = append(after, tx.commit)
			if tx.long && tx.start <= s && len(prewritten) < 3 {
				prewritten = append(prewritten, tx.commit)
			}
		}
	}
	out := append([]uint64{s, e.ckpt}, prewritten...)
	if len(after) > 0 {
		out = append(out, after[len(after)/2])
	}
	return out
}

// objectNames lists every object under the env's prefix.
func (e *retentionEnv) objectNames(t *testing.T) []string {
	t.Helper()
	var out []string
	if err := e.bucket.Iter(context.Background(), e.prefix+"/", func(n string) error { out = append(out, n); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// storedBytes is the bytes of the env's objects, checkpoints left out.
func (e *retentionEnv) storedBytes(t *testing.T) int64 {
	t.Helper()
	var n int64
	err := e.bucket.(sink.Lister).List(context.Background(), e.prefix+"/", func(o sink.ObjectInfo) error {
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

// cmd is the arguments of consumer command with the env's connection flags
// and args.
func (e *retentionEnv) cmd(command string, args ...string) []string {
	return append(append([]string{command}, e.conn...), args...)
}

// listedMetas reads every meta listed for the flow, failing the test if
// one is missing or damaged.
func (e *retentionEnv) listedMetas(t *testing.T) []sink.LoggedMeta {
	t.Helper()
	ctx := context.Background()
	refs, err := e.store.Metas(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, r := range refs {
		paths = append(paths, r.Path)
	}
	metas, err := sink.ReadMetas(ctx, e.bucket, sink.Flow{Prefix: e.prefix, Catalog: "default", Name: "f", ID: 1}, paths, 8)
	if err != nil {
		t.Fatalf("a listed meta is unreadable: %v", err)
	}
	return metas
}

// run runs consumer command in this process with the env's connection
// flags and args, and returns what it printed and its error.
func (e *retentionEnv) run(t *testing.T, command string, args ...string) (string, error) {
	t.Helper()
	return capture(t, func() error { return commands[command](context.Background(), e.cmd(command, args...)[1:]) })
}
