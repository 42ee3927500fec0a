// Package backuptest builds backups to test the read side on: a private
// Redis and GCS emulator holding flow default/f (id 1) with cycles committed
// as the consumer commits them, and the checks a restore must pass.
package backuptest

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// Group is the consumer group of every Env: its global_checkpoint object
// is the one a dropped flow's restore reads.
const Group = "g1"

// Skew is the clock skew the helpers' restores and snapshots allow.
const Skew = 5 * time.Minute

// Env is flow default/f (id 1) in a Redis and a GCS emulator, under a Redis
// prefix and a bucket prefix of its own, so that several can share one
// Redis and one GCS. Its apply partition 0 is leased to member-1 and the
// windows of its tables are open from the start.
type Env struct {
	Redis       *testenv.Redis
	GCS         *testenv.GCS
	Store       *meta.Store
	Bucket      sink.Bucket
	Lease       meta.Lease
	RedisPrefix string
	Prefix      string // the bucket prefix
	// Base is an hour before New was called unless set otherwise: the TSOs
	// of TS are counted from it.
	Base time.Time
	// Conn are the connection flags of a consumer command that reads this
	// backup.
	Conn []string
	// MultiRegion makes CommitV2 write chunks that hold every region's
	// entries of a (table, cf, op, is_meta) key, as the consumer does, the
	// regions listed as runs (sinktest.CycleV2.MultiRegion).
	MultiRegion bool
	cycles      int
	ckpt        uint64 // the highest checkpoint CommitOffsets advanced to
}

// New creates flow default/f on tables in rd and g, under redisPrefix and
// the bucket prefix prefix, and opens its tables' windows.
func New(t testing.TB, rd *testenv.Redis, g *testenv.GCS, redisPrefix, prefix string, tables ...uint32) *Env {
	t.Helper()
	ctx := context.Background()
	e := &Env{Redis: rd, GCS: g, RedisPrefix: redisPrefix, Prefix: prefix, Base: time.Now().Add(-time.Hour).Truncate(time.Millisecond)}
	e.Store = meta.NewStore(rd.Client(t), redisPrefix, nil)
	e.Conn = []string{"--redis-url", rd.URL, "--redis-prefix", redisPrefix, "--gcs-endpoint", g.Endpoint(), "--gcs-bucket", testenv.Bucket,
		"--gcs-prefix", prefix, "--group", Group}
	info := meta.FlowInfo{CatalogName: "default", FlowName: "f", SourceTableIDs: tables,
		SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "out"}, FlownodeIDs: map[uint32]uint64{0: 1}}
	if err := e.Store.CreateFlow(ctx, 1, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	b, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: g.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	e.Bucket = b
	if e.Lease, err = e.Store.AcquireLease(ctx, "flowlog.apply", 0, "member-1"); err != nil {
		t.Fatal(err)
	}
	OpenWindows(t, e.Store, e.Lease)
	return e
}

// NewTimed is New in a Redis and a GCS of its own (Redis prefix "flowlog",
// bucket prefix "pre") with flow default/f on tables 1 and 2 and cycles at
// real TSOs around Base: a put of row (1,1) = "early" at Base+5m and (2,9) =
// "nine" at Base+6m committed at Base+10m, then (1,1) = "late" at Base+48m,
// checkpointed at Base+50m.
func NewTimed(t testing.TB) *Env {
	t.Helper()
	e := New(t, testenv.StartRedis(t), testenv.StartGCS(t), "flowlog", "pre", 1, 2)
	e.Commit(t, e.TS(10*time.Minute), sinktest.WritePut(1, 1, e.TS(4*time.Minute), e.TS(5*time.Minute), []byte("early"), true),
		sinktest.WritePut(2, 9, e.TS(5*time.Minute), e.TS(6*time.Minute), []byte("nine"), true))
	e.Commit(t, e.TS(50*time.Minute), sinktest.WritePut(1, 1, e.TS(47*time.Minute), e.TS(48*time.Minute), []byte("late"), true))
	return e
}

// TS is the TSO of Base+d.
func (e *Env) TS(d time.Duration) uint64 { return event.ComposeTS(e.Base.Add(d).UnixMilli(), 0) }

// Source is the backup as the read side takes it.
func (e *Env) Source() backup.Source {
	return backup.Source{Store: e.Store, Bucket: e.Bucket, Prefix: e.Prefix, Group: Group}
}

// Commit writes a cycle of entries resolved at rts and commits it, then
// advances the flow's checkpoint and its checkpoint object there, as the
// consumer does.
func (e *Env) Commit(t testing.TB, rts uint64, entries ...sinktest.Entry) {
	t.Helper()
	off := int64(e.cycles)
	e.cycles++
	c := sinktest.Cycle{Prefix: e.Prefix, Catalog: "default", Flow: "f", FlowID: 1, CycleID: fmt.Sprintf("c%d", e.cycles), ResolvedTS: rts,
		Entries: entries, Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: off, To: off + 1}}}
	_, path := sinktest.WriteCycle(t, e.Bucket, c)
	e.commit(t, off, rts, path, 1)
	e.PutObject(sink.CheckpointPath(e.Prefix, "default", "f", Group, 1), sink.EncodeCheckpoint(rts))
}

// CommitOffsets is Commit of a cycle whose meta records offsets as the
// apply partitions' ranges it consumed (Commit records partition 0 only),
// listed at rts. The checkpoint never moves back: a cycle listed below an
// earlier one leaves it where it is.
func (e *Env) CommitOffsets(t testing.TB, rts uint64, offsets []sink.OffsetRange, entries ...sinktest.Entry) {
	t.Helper()
	off := int64(e.cycles)
	e.cycles++
	c := sinktest.Cycle{Prefix: e.Prefix, Catalog: "default", Flow: "f", FlowID: 1, CycleID: fmt.Sprintf("c%d", e.cycles), ResolvedTS: rts,
		Entries: entries, Offsets: offsets}
	_, path := sinktest.WriteCycle(t, e.Bucket, c)
	e.commit(t, off, rts, path, 1)
	e.ckpt = max(e.ckpt, rts)
	e.PutObject(sink.CheckpointPath(e.Prefix, "default", "f", Group, 1), sink.EncodeCheckpoint(e.ckpt))
}

// CommitV2 is Commit in layout v2: the cycle is a v2 one whose entries
// flow 1 and flow 2 ("default/other") both routed, listed for both, and the
// checkpoint object is the group's global one.
func (e *Env) CommitV2(t testing.TB, rts uint64, entries ...sinktest.Entry) {
	t.Helper()
	off := int64(e.cycles)
	e.cycles++
	tagged := make([]sinktest.Entry, len(entries))
	for i, en := range entries {
		en.FlowIDs = []uint32{1, 2}
		tagged[i] = en
	}
	c := sinktest.CycleV2{Prefix: e.Prefix, StoreID: "s1", CycleID: fmt.Sprintf("%d-c%d-00", off, e.cycles), Group: Group, ResolvedTS: rts,
		Flows:   []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "f"}, {FlowID: 2, Catalog: "default", Name: "other"}},
		Entries: tagged, Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: off, To: off + 1}}, MultiRegion: e.MultiRegion}
	_, path := sinktest.WriteCycleV2(t, e.Bucket, c)
	e.commit(t, off, rts, path, 1, 2)
	e.PutObject(sink.CheckpointPathV2(e.Prefix, Group), sink.EncodeCheckpoint(rts))
}

// commit commits the cycle of meta path at offset off, resolved at rts,
// listing it for flows, and advances flow 1's checkpoint there.
func (e *Env) commit(t testing.TB, off int64, rts uint64, path string, flows ...meta.FlowID) {
	t.Helper()
	ctx := context.Background()
	c := meta.Commit{
		Leases:     []meta.Lease{e.Lease},
		Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: off + 1, Checkpoint: rts, HasCheckpoint: true}},
		Flows:      []meta.FlowID{1}, LastFlushTS: rts,
	}
	for _, id := range flows {
		c.Metas = append(c.Metas, meta.MetaRef{FlowID: id, Path: path, MinResolvedTS: rts})
	}
	if err := e.Store.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Store.AdvanceCheckpoint(ctx, 1, rts); err != nil {
		t.Fatal(err)
	}
}

// PutObject writes content to the emulator as object name, as is
// (overwriting, no checks): how a test plants what the consumer never
// writes.
func (e *Env) PutObject(name string, content []byte) {
	e.GCS.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: testenv.Bucket, Name: name}, Content: content})
}

// Args is Conn followed by extra.
func (e *Env) Args(extra ...string) []string {
	return append(append([]string{}, e.Conn...), extra...)
}

// OpenWindows makes the pending coverage windows of every flow final as the
// consumer does when the one apply partition with records (lease's)
// reports them: a table added before any record has since 0.
func OpenWindows(t testing.TB, st *meta.Store, lease meta.Lease) {
	t.Helper()
	ctx := context.Background()
	pending, err := st.PendingCoverage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reps []meta.CoverageReport
	for _, pf := range pending {
		for _, e := range pf.Entries {
			reps = append(reps, meta.CoverageReport{FlowID: pf.ID, Seq: e.Seq, Topic: lease.Topic, Partition: lease.Partition})
		}
	}
	if err := st.Commit(ctx, meta.Commit{Leases: []meta.Lease{lease}, Coverage: reps}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinalizeCoverage(ctx, lease.Topic, []int32{lease.Partition}); err != nil {
		t.Fatal(err)
	}
}

// Row is how ReadTable shows a restored row: "key-hex=value@commit_ts",
// the value cut to 12 bytes.
func Row(table, handle int64, value string, commit uint64) string {
	return fmt.Sprintf("%s=%.12s@%d", RowHex(table, handle), value, commit)
}

// RowHex is the hex of the row key of (table, handle), as restore writes it.
func RowHex(table, handle int64) string { return fmt.Sprintf("%x", event.RowKey(table, handle)) }

// ReadTable returns a restored table file as Row lines, in file order.
func ReadTable(t testing.TB, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Key      string `json:"key"`
			Value    []byte `json:"value"`
			CommitTS uint64 `json:"commit_ts"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s=%.12s@%d", r.Key, r.Value, r.CommitTS))
	}
	return out
}

// ReadDir returns the files of dir by name.
func ReadDir(t testing.TB, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, de := range entries {
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[de.Name()] = string(b)
	}
	return out
}

// WriteCatalog writes flow id's catalog at revision rev from what Redis
// holds of it, as the consumer's catalog writer does: its definition (or,
// dropped, the name of flow default/f), windows, history, pending entries,
// snapshots, truncation point and checkpoint.
func (e *Env) WriteCatalog(t testing.TB, id meta.FlowID, rev uint64) string {
	t.Helper()
	ctx := context.Background()
	c := sink.Catalog{Version: sink.CatalogVersion, Group: Group, FlowID: uint32(id), Catalog: "default", Name: "f", Rev: rev, Info: []byte(`{}`)}
	info, ok, err := e.Store.FlowInfo(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		c.Catalog, c.Name = info.CatalogName, info.FlowName
		if c.Info, err = json.Marshal(info); err != nil {
			t.Fatal(err)
		}
		st, err := e.Store.FlowState(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		c.CheckpointTS = st.CheckpointTS
	}
	c.Dropped = !ok
	cur, hist, err := e.Store.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range cur {
		c.Windows = append(c.Windows, sink.CatalogWindow{TableID: w.TableID, Since: w.Since, Until: w.Until})
	}
	slices.SortFunc(c.Windows, func(a, b sink.CatalogWindow) int { return cmp.Compare(a.TableID, b.TableID) })
	for _, w := range hist {
		c.History = append(c.History, sink.CatalogWindow{TableID: w.TableID, Since: w.Since, Until: w.Until})
	}
	steps, err := e.Store.PendingSteps(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range steps {
		c.Pending = append(c.Pending, sink.CatalogPending{Seq: st.Seq, Added: st.Added, Removed: st.Removed, Ckpt: st.Ckpt})
		c.CoverageSeq = max(c.CoverageSeq, st.Seq)
	}
	snaps, err := e.Store.Snapshots(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		c.Snapshots = append(c.Snapshots, sink.CatalogSnapshot{TS: s.TS, Path: s.Path})
	}
	if c.TruncatedBefore, _, err = e.Store.TruncatedBefore(ctx, id); err != nil {
		t.Fatal(err)
	}
	return sinktest.WriteCatalog(t, e.Bucket, e.Prefix, c)
}
