package backup_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// churn builds a layout v2 backup as the consumer commits one: flows
// created, replaced with tables added and removed, dropped and created
// again under the same name, every cycle a v2 cycle serving the flows that
// routed its events and listed for each, coverage reports of one apply
// partition made final, the live flows' checkpoints and the group's
// checkpoint object advanced after every cycle.
type churn struct {
	t      *testing.T
	e      *backuptest.Env
	rng    *rand.Rand
	tables map[meta.FlowID][]uint32 // live flows' tables
	names  map[meta.FlowID]string
	info   map[meta.FlowID]meta.FlowInfo
	off    int64
	now    time.Duration // of the last cycle, after Base
	seq    int
	tss    []uint64 // commit ts of every event written
}

var churnRoutes = map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}

func (c *churn) create(id meta.FlowID, name string, tables ...uint32) {
	c.t.Helper()
	info := meta.FlowInfo{CatalogName: "default", FlowName: name, SourceTableIDs: tables,
		SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "out"}, FlownodeIDs: map[uint32]uint64{0: 1}}
	if err := c.e.Store.CreateFlow(context.Background(), id, info, churnRoutes); err != nil {
		c.t.Fatal(err)
	}
	c.tables[id], c.names[id], c.info[id] = tables, name, info
}

func (c *churn) replace(id meta.FlowID, tables ...uint32) {
	c.t.Helper()
	next := c.info[id]
	next.SourceTableIDs = tables
	if err := c.e.Store.UpdateFlow(context.Background(), id, c.info[id], next, churnRoutes); err != nil {
		c.t.Fatal(err)
	}
	c.tables[id], c.info[id] = tables, next
}

func (c *churn) drop(id meta.FlowID) {
	c.t.Helper()
	if err := c.e.Store.DestroyFlow(context.Background(), id, c.info[id]); err != nil {
		c.t.Fatal(err)
	}
	delete(c.tables, id)
}

// cycle writes and commits one cycle of events on tables 1-4 a second
// apart, reporting the pending coverage entries at the cycle's first ts
// unless hold, and returns the cycle's meta, its path and its entries.
func (c *churn) cycle(hold bool) (sink.Meta, string, []sinktest.Entry) {
	c.t.Helper()
	ctx := context.Background()
	start := c.now
	var entries []sinktest.Entry
	flows := map[meta.FlowID]bool{}
	for i := range 12 {
		c.now += time.Second
		table := uint32(1 + c.rng.IntN(4))
		var ids []uint32
		for id, ts := range c.tables {
			if slices.Contains(ts, table) {
				ids = append(ids, uint32(id))
				flows[id] = true
			}
		}
		if len(ids) == 0 {
			continue // no flow routes it
		}
		slices.Sort(ids)
		commit := c.e.TS(c.now)
		h := int64(1 + c.rng.IntN(5))
		val := []byte(fmt.Sprintf("t%d-%d-%d", table, c.seq, i))
		var es []sinktest.Entry
		if i%3 == 0 {
			es = []sinktest.Entry{sinktest.DefaultPut(int64(table), h, commit-1, append(val, make([]byte, 300)...)),
				sinktest.WritePut(int64(table), h, commit-1, commit, nil, false)}
		} else {
			es = []sinktest.Entry{sinktest.WritePut(int64(table), h, commit-1, commit, val, true)}
		}
		for _, en := range es {
			en.FlowIDs = ids
			entries = append(entries, en)
		}
		c.tss = append(c.tss, commit)
	}
	c.seq++
	rts := c.e.TS(c.now + 500*time.Millisecond)
	cyc := sinktest.CycleV2{Prefix: c.e.Prefix, StoreID: "s1", CycleID: fmt.Sprintf("%d-%d-00", c.seq, c.off), Group: backuptest.Group,
		ResolvedTS: rts, Entries: entries, Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: c.off, To: c.off + 1}}}
	for id := range flows {
		cyc.Flows = append(cyc.Flows, sink.MetaFlow{FlowID: uint32(id), Catalog: "default", Name: c.names[id]})
	}
	slices.SortFunc(cyc.Flows, func(a, b sink.MetaFlow) int { return int(a.FlowID) - int(b.FlowID) })
	m, path := sinktest.WriteCycleV2(c.t, c.e.Bucket, cyc)
	commit := meta.Commit{Leases: []meta.Lease{c.e.Lease},
		Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: c.off + 1, Checkpoint: rts, HasCheckpoint: true}}}
	for id := range flows {
		commit.Metas = append(commit.Metas, meta.MetaRef{FlowID: id, Path: path, MinResolvedTS: rts})
	}
	if !hold {
		pending, err := c.e.Store.PendingCoverage(ctx)
		if err != nil {
			c.t.Fatal(err)
		}
		for _, pf := range pending {
			for _, en := range pf.Entries {
				v := meta.CoverageValue{TS: c.e.TS(start)}
				commit.Coverage = append(commit.Coverage, meta.CoverageReport{FlowID: pf.ID, Seq: en.Seq, Topic: "flowlog.apply", Since: v, Until: v})
			}
		}
	}
	c.off++
	if err := c.e.Store.Commit(ctx, commit); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.e.Store.FinalizeCoverage(ctx, "flowlog.apply", []int32{0}); err != nil {
		c.t.Fatal(err)
	}
	for id := range c.tables {
		if _, err := c.e.Store.AdvanceCheckpoint(ctx, id, rts); err != nil {
			c.t.Fatal(err)
		}
	}
	c.e.PutObject(sink.CheckpointPathV2(c.e.Prefix, backuptest.Group), sink.EncodeCheckpoint(rts))
	return m, path, entries
}

// TestRestoreFromBucketEqualsRedis: a layout v2 backup with churn (tables
// added and removed, a flow dropped and created again under its name, a
// removal still pending at the end), with a zombie's cycle (the same events
// as a committed one, never listed) and a crashed cycle (events past the
// checkpoint, never listed). After Redis is flushed, restores from the
// bucket alone at the checkpoint and at 10 random ts give, for every flow
// id, byte for byte what the Redis-backed restores gave, leaving out the
// same tables for the same reasons.
func TestRestoreFromBucketEqualsRedis(t *testing.T) {
	ctx := context.Background()
	rd := testenv.StartRedis(t)
	e := backuptest.New(t, rd, testenv.StartGCS(t), "flowlog", "pre") // flow default/f (id 1) on no table yet
	e.Base = time.Now().Add(-2 * time.Hour).Truncate(time.Millisecond)
	c := &churn{t: t, e: e, rng: rand.New(rand.NewPCG(18, 24)), tables: map[meta.FlowID][]uint32{}, names: map[meta.FlowID]string{1: "f"},
		info: map[meta.FlowID]meta.FlowInfo{}}
	info, _, err := e.Store.FlowInfo(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	c.info[1], c.tables[1] = info, info.SourceTableIDs
	c.replace(1, 1, 2)
	c.cycle(false)
	c.cycle(false)
	c.replace(1, 1, 3) // table 2 removed, table 3 added
	c.create(2, "g", 2, 3)
	_, committedPath, committed := c.cycle(false)
	c.cycle(false)
	c.drop(2)
	c.cycle(false)
	c.create(3, "g", 2, 4) // the name again: a new flow
	c.cycle(false)
	c.cycle(false)
	c.replace(3, 2)    // table 4 removed ...
	c.cycle(true)      // ... and not reported yet: its until is pending
	c.replace(1, 1, 3) // no change
	ckpt := e.TS(c.now + 500*time.Millisecond)

	// A zombie's upload of a committed cycle's events, and a crashed
	// cycle past the checkpoint; neither is listed.
	sinktest.WriteCycleV2(t, e.Bucket, sinktest.CycleV2{Prefix: e.Prefix, StoreID: "zombie", CycleID: "1-0-zz", Group: backuptest.Group, ResolvedTS: ckpt,
		Flows: []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "f"}, {FlowID: 2, Catalog: "default", Name: "g"}}, Entries: committed})
	late := c.e.TS(c.now + time.Hour)
	crashed := sinktest.WritePut(1, 1, late-1, late, []byte("after the checkpoint"), true)
	crashed.FlowIDs = []uint32{1}
	sinktest.WriteCycleV2(t, e.Bucket, sinktest.CycleV2{Prefix: e.Prefix, StoreID: "crashed", CycleID: "9-0-cc", Group: backuptest.Group, ResolvedTS: late,
		Flows: []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "f"}}, Entries: []sinktest.Entry{crashed}})
	for id := range meta.FlowID(3) {
		e.WriteCatalog(t, id+1, 1)
	}
	if pending, err := e.Store.PendingCoverage(ctx); err != nil || len(pending) != 1 || pending[0].ID != 3 {
		t.Fatalf("pending coverage at the end: %+v, %v; want flow 3's removal of table 4", pending, err)
	}
	listed, err := backup.MetaPaths(ctx, e.Store, 1)
	if err != nil || !slices.Contains(listed, committedPath) {
		t.Fatalf("flow 1's metas %v, %v", listed, err)
	}

	// The restores, by name and by id, at the checkpoint and at 10 ts.
	tss := []uint64{0}
	for range 10 {
		tss = append(tss, c.tss[c.rng.IntN(len(c.tss))]+uint64(c.rng.IntN(3))-1)
	}
	lookups := []backup.Lookup{{Catalog: "default", Name: "f"}, {Catalog: "default", Name: "g"}, {ID: 1}, {ID: 2}, {ID: 3}}
	type outcome struct{ files, said string }
	metasRead := map[string]int{} // by source, of flow 1 at the checkpoint
	run := func(src backup.Source, l backup.Lookup, ts uint64) outcome {
		out := filepath.Join(t.TempDir(), "out")
		var said []string
		res, err := backup.Restore(ctx, src, backup.RestoreRequest{
			Request: backup.Request{Flow: l, TS: ts, MaxClockSkew: backuptest.Skew, Notify: func(ev backup.Event) {
				if lo, ok := ev.(backup.LeftOut); ok {
					var ws []string
					for _, w := range lo.Windows {
						until := "open"
						if w.Until != nil {
							until = fmt.Sprint(*w.Until)
						}
						ws = append(ws, fmt.Sprintf("[%d, %s]", w.Since, until))
					}
					said = append(said, fmt.Sprintf("table %d at %d: windows %v, establishing %v, removing %v up to %d",
						lo.Table, lo.TS, ws, lo.Establishing, lo.Removing, lo.CompleteUpTo))
				}
			}},
			OutDir: out, TempDir: t.TempDir()})
		if err != nil {
			return outcome{said: fmt.Sprintf("%v %T", said, err)}
		}
		if l.ID == 1 && ts == 0 {
			metasRead[fmt.Sprintf("%T", src.Store)] = res.Metas
		}
		return outcome{files: fmt.Sprint(backuptest.ReadDir(t, out)), said: fmt.Sprintf("as of %d, left out %v", res.TS, said)}
	}
	want := map[string]outcome{}
	restored, removing := 0, 0
	for _, l := range lookups {
		for _, ts := range tss {
			o := run(e.Source(), l, ts)
			want[fmt.Sprint(l, ts)] = o
			if o.files != "" {
				restored++
			}
			if strings.Contains(o.said, "removing true") {
				removing++
			}
		}
	}
	t.Logf("%d of %d Redis-backed restores wrote tables, %d left out a table being removed", restored, len(lookups)*len(tss), removing)
	if restored < len(lookups)*len(tss)/2 || removing == 0 {
		t.Fatalf("the test restores too little, or no restore meets the pending removal")
	}
	if err := rd.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	bucket := backup.Source{Store: &backup.BucketStore{Bucket: e.Bucket, Prefix: e.Prefix, Group: backuptest.Group}, Bucket: e.Bucket, Prefix: e.Prefix, Group: backuptest.Group}
	for _, l := range lookups {
		for _, ts := range tss {
			if got, w := run(bucket, l, ts), want[fmt.Sprint(l, ts)]; got != w {
				t.Errorf("%+v as of %d from the bucket:\n%s\n%s\nwant (Redis-backed)\n%s\n%s", l, ts, got.said, got.files, w.said, w.files)
			}
		}
	}
	// The bucket holds the zombie's and the crashed cycle's metas too.
	if r, b := metasRead["*meta.Store"], metasRead["*backup.BucketStore"]; b != r+2 {
		t.Errorf("flow 1 at the checkpoint read %d metas from the bucket, %d listed in Redis: want the 2 unlisted ones more", b, r)
	}
}
