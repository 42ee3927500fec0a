package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
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

// commitTSs are the commit ts of every transaction at or after ts.
func (e *retentionEnv) commitTSs(ts uint64) []uint64 {
	var out []uint64
	for _, tx := range e.txns {
		if tx.commit >= ts {
			out = append(out, tx.commit)
		}
	}
	return out
}

// snapshot writes and lists a snapshot at ts as DESIGN 10 lays it out: the
// state of table 1 as zstd chunks of framed entries sorted by key, then
// snapshot.meta, then the listing. It returns the snapshot's bytes.
func (e *retentionEnv) snapshot(t *testing.T, ts uint64) int64 {
	t.Helper()
	ctx := context.Background()
	st := e.state(ts)
	latest := map[int64]uint64{}
	for _, tx := range e.txns {
		if tx.commit <= ts {
			latest[tx.handle] = max(latest[tx.handle], tx.commit)
		}
	}
	var keys [][]byte
	vals := map[string][]byte{}
	for h, v := range st {
		k := event.AppendDataKey(nil, event.RowKey(1, h), latest[h])
		keys = append(keys, k)
		vals[string(k)] = []byte(v)
	}
	slices.SortFunc(keys, bytes.Compare)
	var framed []byte
	for _, k := range keys {
		framed = event.AppendEntry(framed, k, vals[string(k)])
	}
	var buf bytes.Buffer
	w, err := sink.NewObjectWriter(&buf, sink.CompressionZstd)
	if err != nil {
		t.Fatal(err)
	}
	tbl := sink.SnapshotTable{TableID: 1, DataPath: sink.SnapshotTablePath(e.prefix, "default", "f", 1, ts, 1)}
	if len(keys) > 0 {
		off, length, raw, err := w.AddChunk(bytes.NewReader(framed))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(framed)
		tbl.Chunks = []sink.SnapshotChunk{{Offset: off, Length: length, RawLength: raw, SHA256: hex.EncodeToString(sum[:]),
			NumberOfEntries: int64(len(keys)), MinKey: hex.EncodeToString(keys[0]), MaxKey: hex.EncodeToString(keys[len(keys)-1])}}
	}
	if err := e.bucket.Upload(ctx, sink.Object{Name: tbl.DataPath, Body: &buf, Size: w.Size(), CRC32C: w.CRC32C()}); err != nil {
		t.Fatal(err)
	}
	mb, err := sink.EncodeSnapshotMeta(sink.SnapshotMeta{Version: 1, Flow: "default/f", FlowID: 1, TS: ts, Tables: []sink.SnapshotTable{tbl}})
	if err != nil {
		t.Fatal(err)
	}
	path := sink.SnapshotMetaPath(e.prefix, "default", "f", 1, ts)
	if err := e.bucket.Upload(ctx, sink.Object{Name: path, Body: bytes.NewReader(mb), Size: int64(len(mb)), CRC32C: sink.CRC32C(mb)}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.AddSnapshot(ctx, 1, path); err != nil {
		t.Fatal(err)
	}
	return w.Size() + int64(len(mb))
}

// logAfter reads every chunk the listed metas reference and returns its
// write records newer than s and its default-CF values, failing the test
// on a listed object that is missing or damaged.
func (e *retentionEnv) logAfter(t *testing.T, s uint64) (writes []txn, defaults map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	metas := e.listedMetas(t)
	defaults = map[string][]byte{}
	for _, m := range metas {
		for _, f := range m.Meta.Files {
			framed, err := sink.ReadChunk(ctx, e.bucket, m.Meta.DataPath, f)
			if err != nil {
				t.Fatalf("a listed chunk is unreadable: %v", err)
			}
			for len(framed) > 0 {
				k, v, rest, err := event.NextEntry(framed)
				if err != nil {
					t.Fatal(err)
				}
				framed = rest
				raw, ts, err := event.DecodeDataKey(k)
				if err != nil {
					t.Fatal(err)
				}
				if f.CF == sink.CFDefault {
					defaults[fmt.Sprintf("%x/%d", raw, ts)] = v
					continue
				}
				if ts <= s {
					continue
				}
				w, err := event.DecodeWrite(v)
				if err != nil {
					t.Fatal(err)
				}
				tx := txn{handle: handleOf(t, raw), start: w.StartTS, commit: ts}
				switch {
				case w.Type == event.WriteDelete:
				case w.HasShortValue:
					tx.value = w.ShortValue
				default:
					tx.long = true
				}
				writes = append(writes, tx)
			}
		}
	}
	return writes, defaults
}

func handleOf(t *testing.T, raw []byte) int64 {
	t.Helper()
	for h := int64(1); h <= 12; h++ {
		if bytes.Equal(raw, event.RowKey(1, h)) {
			return h
		}
	}
	t.Fatalf("unexpected key %x", raw)
	return 0
}

// checkRestorable checks what truncate promises: the snapshot at s plus the
// listed log after s give the generated history's state at every commit ts
// at or above s, and at s and the checkpoint; every default-CF value a write
// after s names is still listed.
func (e *retentionEnv) checkRestorable(t *testing.T, s uint64) {
	t.Helper()
	writes, defaults := e.logAfter(t, s)
	slices.SortFunc(writes, func(a, b txn) int { return cmp.Compare(a.commit, b.commit) })
	tss := append(e.commitTSs(s), s, e.ckpt)
	for _, ts := range tss {
		got := e.state(s)
		for _, w := range writes {
			if w.commit > ts {
				break
			}
			switch {
			case w.value == nil && !w.long:
				delete(got, w.handle)
			case w.long:
				v, ok := defaults[fmt.Sprintf("%x/%d", event.RowKey(1, w.handle), w.start)]
				if !ok {
					t.Fatalf("at %d: the value of row %d committed at %d (prewritten at %d) is no longer listed", ts, w.handle, w.commit, w.start)
				}
				got[w.handle] = string(v)
			default:
				got[w.handle] = string(w.value)
			}
		}
		if want := e.state(ts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("at %d (snapshot %d): snapshot + log give\n%v\nwant\n%v", ts, s, got, want)
		}
	}
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
