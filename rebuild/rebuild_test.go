package rebuild_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/catalog"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/rebuild"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

const apply = "flowlog.apply"

// backup2 is a layout v2 backup on two apply partitions, committed as the
// consumer commits: flows 1 (default/f, tables 1 and 2) and 2 (default/g,
// tables 2 and 3, created after the first cycle: its windows come from
// the coverage reports of a cycle that carries nothing else, a meta without
// a data object that the commit lists under g), cycles of both partitions with
// their partition commits in the metas, a zombie's meta overlapping two
// committed cycles, and a crashed cycle's meta consumed again by the next
// committed one. Each flow's catalog holds what Redis holds.
type backup2 struct {
	t       *testing.T
	e       *backuptest.Env
	leases  []meta.Lease
	off     [2]int64
	now     time.Duration
	ckpt    uint64
	zombie  string
	crashed string
}

func (b *backup2) cycle(id string, n0, n1 int64, flows map[uint32][]int64, commit bool) (string, []sinktest.Entry) {
	t, e := b.t, b.e
	ctx := context.Background()
	var entries []sinktest.Entry
	var named []sink.MetaFlow
	for _, fid := range slices.Sorted(func(yield func(uint32) bool) {
		for k := range flows {
			if !yield(k) {
				return
			}
		}
	}) {
		named = append(named, sink.MetaFlow{FlowID: fid, Catalog: "default", Name: map[uint32]string{1: "f", 2: "g"}[fid]})
		for _, table := range flows[fid] {
			b.now += time.Second
			ts := e.TS(b.now)
			en := sinktest.WritePut(table, int64(len(entries)%4), ts-1, ts, []byte(fmt.Sprintf("%s-%d-%d", id, fid, table)), true)
			en.FlowIDs = []uint32{fid}
			entries = append(entries, en)
		}
	}
	rts := e.TS(b.now + 500*time.Millisecond)
	ranges := []sink.OffsetRange{{Topic: apply, Partition: 0, From: b.off[0], To: b.off[0] + n0}, {Topic: apply, Partition: 1, From: b.off[1], To: b.off[1] + n1}}
	c := meta.Commit{Leases: b.leases}
	var states []sink.PartitionState
	for p := range 2 {
		regions := map[uint64]uint64{uint64(10 + p): rts}
		c.Partitions = append(c.Partitions, meta.PartitionCommit{Topic: apply, Partition: int32(p), NextOffset: ranges[p].To,
			Checkpoint: rts, HasCheckpoint: true, MaxTS: rts - 1, Regions: regions})
		states = append(states, sink.PartitionState{Topic: apply, Partition: int32(p), NextOffset: ranges[p].To, Checkpoint: rts,
			HasCheckpoint: true, MaxTS: rts - 1, Regions: map[string]uint64{strconv.Itoa(10 + p): rts}})
	}
	pending, err := e.Store.PendingCoverage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reports []sink.CoverageReport
	for _, pf := range pending {
		for _, en := range pf.Entries {
			for p := range int32(2) {
				v := meta.CoverageValue{TS: rts}
				c.Coverage = append(c.Coverage, meta.CoverageReport{FlowID: pf.ID, Seq: en.Seq, Topic: apply, Partition: p, Since: v, Until: v})
				sv := sink.CoverageValue{TS: rts}
				reports = append(reports, sink.CoverageReport{FlowID: pf.ID, Seq: en.Seq, Topic: apply, Partition: p, Since: sv, Until: sv})
			}
		}
	}
	_, path := sinktest.WriteCycleV2(t, e.Bucket, sinktest.CycleV2{Prefix: e.Prefix, StoreID: "s1", CycleID: id, Group: backuptest.Group,
		ResolvedTS: rts, Flows: named, Offsets: ranges, Partitions: states, Coverage: reports, Entries: entries})
	if !commit {
		return path, entries
	}
	for fid := range flows {
		c.Metas = append(c.Metas, meta.MetaRef{FlowID: meta.FlowID(fid), Path: path, MinResolvedTS: rts})
	}
	if err := e.Store.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Store.FinalizeCoverage(ctx, apply, []int32{0, 1}); err != nil {
		t.Fatal(err)
	}
	for _, fid := range []meta.FlowID{1, 2} {
		if _, err := e.Store.AdvanceCheckpoint(ctx, fid, rts); err != nil {
			t.Fatal(err)
		}
	}
	e.PutObject(sink.CheckpointPathV2(e.Prefix, backuptest.Group), sink.EncodeCheckpoint(rts))
	b.off[0] += n0
	b.off[1] += n1
	b.ckpt = rts
	return path, entries
}

// dump is every key under the prefix with its content, but the leases
// (taken again on assignment) and the owner (recover writes it).
func dump(t *testing.T, rdb redis.UniversalClient, base string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, base+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, key := range keys {
		name := strings.TrimPrefix(key, base)
		if strings.HasPrefix(name, "lease:") || name == "owner" {
			continue
		}
		var v any
		switch typ, _ := rdb.Type(ctx, key).Result(); typ {
		case "string":
			v, _ = rdb.Get(ctx, key).Result()
		case "hash":
			h, _ := rdb.HGetAll(ctx, key).Result()
			if strings.HasPrefix(name, "flow:state:") {
				delete(h, "last_flush_ts") // runtime state, not recovered
			}
			v = h
		case "set":
			m, _ := rdb.SMembers(ctx, key).Result()
			slices.Sort(m)
			v = m
		case "list":
			v, _ = rdb.LRange(ctx, key, 0, -1).Result()
		case "zset":
			v, _ = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		}
		out[name] = fmt.Sprint(v)
	}
	return out
}

// TestRecoverRebuildsRedis: after FLUSHALL, the state recover writes from
// the bucket (and the group's Kafka offsets) is, key for key, what Redis
// held, but for what the consumer takes again by itself (leases,
// last_flush_ts): flows and their indexes, coverage windows and history,
// metas:<flow_id> without the zombie's and the crashed cycle's metas, the
// partitions' offsets, checkpoints, maxts and regions, flow:seq and the
// checkpoints. Where Kafka's commit is past the chain (cycles that
// uploaded nothing), the offset follows Kafka and maxts the clock.
// Redis-backed restores of both flows at the checkpoint and at every
// event's ts equal the ones taken before the flush.
func TestRecoverRebuildsRedis(t *testing.T) {
	ctx := context.Background()
	rd := testenv.StartRedis(t)
	e := backuptest.New(t, rd, testenv.StartGCS(t), "flowlog", "pre", 1, 2)
	e.Base = time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	l1, err := e.Store.AcquireLease(ctx, apply, 1, "member-1")
	if err != nil {
		t.Fatal(err)
	}
	b := &backup2{t: t, e: e, leases: []meta.Lease{e.Lease, l1}}
	b.cycle("1-a-00", 3, 2, map[uint32][]int64{1: {1, 2}}, true)
	info := meta.FlowInfo{CatalogName: "default", FlowName: "g", SourceTableIDs: []uint32{2, 3},
		SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "out"}, FlownodeIDs: map[uint32]uint64{0: 2}}
	if err := e.Store.CreateFlow(ctx, 2, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 2, Addr: "n2:4000"}}}); err != nil {
		t.Fatal(err)
	}
	covOnly, _ := b.cycle("2-a-00", 1, 1, map[uint32][]int64{2: nil}, true)
	_, zombieEntries := b.cycle("2-b-00", 4, 1, map[uint32][]int64{1: {1}, 2: {2, 3}}, true)
	b.cycle("3-c-00", 2, 3, map[uint32][]int64{2: {3}}, true)
	// The zombie froze partition 0 from the second cycle's start past the
	// third's; the crashed cycle took the fourth's start and less.
	_, b.zombie = sinktest.WriteCycleV2(t, e.Bucket, sinktest.CycleV2{Prefix: e.Prefix, StoreID: "zombie", CycleID: "2-z-00", Group: backuptest.Group,
		ResolvedTS: b.ckpt, Flows: []sink.MetaFlow{{FlowID: 1, Catalog: "default", Name: "f"}, {FlowID: 2, Catalog: "default", Name: "g"}},
		Offsets: []sink.OffsetRange{{Topic: apply, Partition: 0, From: 3, To: 8}}, Entries: zombieEntries})
	b.crashed, _ = b.cycle("4-x-00", 1, 1, map[uint32][]int64{1: {2}}, false)
	b.cycle("4-d-00", 2, 2, map[uint32][]int64{1: {1, 2}, 2: {2}}, true)
	w := catalog.Writer{Store: e.Store, Bucket: e.Bucket, Prefix: e.Prefix, Group: backuptest.Group}
	if n, err := w.WriteDirty(ctx); err != nil || n != 2 {
		t.Fatalf("catalogs written: %d, %v; want 2", n, err)
	}

	rdb := e.Store.Client()
	base := e.Store.Keys().Base()
	before := dump(t, rdb, base)
	restores := func() map[string]string {
		out := map[string]string{}
		for _, l := range []backup.Lookup{{Catalog: "default", Name: "f"}, {Catalog: "default", Name: "g"}, {ID: 1}, {ID: 2}} {
			for _, ts := range []uint64{0, e.TS(3 * time.Second), e.TS(6 * time.Second), e.TS(9 * time.Second), b.ckpt} {
				dir := filepath.Join(t.TempDir(), "out")
				res, err := backup.Restore(ctx, e.Source(), backup.RestoreRequest{
					Request: backup.Request{Flow: l, TS: ts, MaxClockSkew: backuptest.Skew}, OutDir: dir, TempDir: t.TempDir()})
				if err != nil {
					out[fmt.Sprint(l, ts)] = err.Error()
					continue
				}
				out[fmt.Sprint(l, ts)] = fmt.Sprint(res.TS, backuptest.ReadDir(t, dir))
			}
		}
		return out
	}
	want := restores()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	in := rebuild.Input{Bucket: e.Bucket, Prefix: e.Prefix, Group: backuptest.Group, ApplyTopic: apply, ApplyPartitions: []int32{0, 1},
		Committed: map[int32]int64{0: b.off[0] - 2, 1: b.off[1] + 4}, Now: time.Now()}
	plan, err := rebuild.Build(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	plan.Print(&out)
	t.Logf("plan:\n%s", out.String())
	for i, m := range plan.Metas {
		wantV := rebuild.Chosen
		if m.Path == b.zombie || m.Path == b.crashed {
			wantV = rebuild.Dropped
		}
		if plan.Verdicts[i] != wantV {
			t.Errorf("meta %s: verdict %v, want %v", m.Path, plan.Verdicts[i], wantV)
		}
	}
	if listed := plan.Listed[2]; !slices.ContainsFunc(listed, func(m rebuild.MetaInfo) bool { return m.Path == covOnly }) {
		t.Errorf("the plan does not list g's coverage-only meta %s under it", covOnly)
	}
	if len(plan.Duplicates) != 0 || len(plan.Gaps) != 0 {
		t.Errorf("duplicates %v, gaps %v; want none", plan.Duplicates, plan.Gaps)
	}
	for _, s := range []string{"dropped " + b.zombie, "dropped " + b.crashed, "duplicates the choice cannot avoid: 0 records"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("the plan does not say %q", s)
		}
	}
	if err := plan.Apply(ctx, e.Store); err != nil {
		t.Fatal(err)
	}
	if owner, _ := rdb.Get(ctx, base+"owner").Result(); owner != backuptest.Group {
		t.Errorf("owner = %q, want %q", owner, backuptest.Group)
	}
	got := dump(t, rdb, base)
	// Partition 1's Kafka commit is past the chain: cycles that uploaded
	// nothing. Its offset follows Kafka, and its maxts is the clock, since
	// no meta says what ts its records had.
	wantP1 := strconv.FormatInt(b.off[1]+4, 10)
	if got["offset:"+apply+":1"] != wantP1 {
		t.Errorf("offset of partition 1 = %s, want Kafka's %s", got["offset:"+apply+":1"], wantP1)
	}
	if m, _ := strconv.ParseUint(got["maxts:"+apply+":1"], 10, 64); m < uint64(in.Now.UnixMilli())<<18 {
		t.Errorf("maxts of partition 1 = %d, want at least the clock", m)
	}
	// flow:seq is at least every id seen, so that no new flow takes one
	// the bucket holds (the flows were created with explicit ids, which
	// does not move it).
	if got["flow:seq"] != "2" {
		t.Errorf("flow:seq = %q, want 2", got["flow:seq"])
	}
	delete(got, "flow:seq")
	// catalog:init: every flow's catalog is in the bucket at the revision
	// recovered, so the first start marks none dirty (no consumer ran in
	// this test to set it before).
	if got["catalog:init"] != "1" {
		t.Errorf("catalog:init = %q, want 1", got["catalog:init"])
	}
	delete(got, "catalog:init")
	// global_checkpoint is the checkpoint object's value (this test's
	// cycles wrote the object, not the key, as a consumer would both).
	if want := strconv.FormatUint(plan.Checkpoint, 10); plan.Checkpoint == 0 || got["global_checkpoint"] != want {
		t.Errorf("global_checkpoint = %q, want the checkpoint object's %s", got["global_checkpoint"], want)
	}
	delete(got, "global_checkpoint")
	delete(before, "global_checkpoint")
	delete(got, "offset:"+apply+":1")
	delete(got, "maxts:"+apply+":1")
	delete(before, "offset:"+apply+":1")
	delete(before, "maxts:"+apply+":1")
	for k, v := range before {
		if got[k] != v {
			t.Errorf("%s = %s after recover, was %s", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := before[k]; !ok {
			t.Errorf("%s = %s after recover, absent before", k, v)
		}
	}
	if after := restores(); fmt.Sprint(after) != fmt.Sprint(want) {
		for k, w := range want {
			if after[k] != w {
				t.Errorf("restore %s after recover:\n%s\nwant\n%s", k, after[k], w)
			}
		}
	}
}
