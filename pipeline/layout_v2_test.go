package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// countingBucket counts the objects uploaded, by kind of name.
type countingBucket struct {
	*sink.MemBucket
	mu     sync.Mutex
	counts map[string]int
}

func newCountingBucket() *countingBucket {
	return &countingBucket{MemBucket: sink.NewMemBucket(), counts: map[string]int{}}
}

// objectKind names what an object of the rig's prefix is.
func objectKind(name string) string {
	switch {
	case strings.HasPrefix(name, sink.V2LogDir("backup")):
		return "data"
	case strings.HasPrefix(name, sink.V2MetaDir("backup")):
		return "meta"
	case strings.HasSuffix(name, ".ts"):
		return "checkpoint"
	case strings.Contains(name, "/catalog/"):
		return "catalog"
	case strings.HasSuffix(name, ".log"):
		return "v1 data"
	case strings.HasSuffix(name, ".meta"):
		return "v1 meta"
	}
	return "other"
}

func (b *countingBucket) Upload(ctx context.Context, obj sink.Object) error {
	err := b.MemBucket.Upload(ctx, obj)
	if err == nil {
		b.mu.Lock()
		b.counts[objectKind(obj.Name)]++
		b.mu.Unlock()
	}
	return err
}

// snapshot returns the counts so far.
func (b *countingBucket) snapshot() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for k, v := range b.counts {
		out[k] = v
	}
	return out
}

// since returns the uploads after before, by kind, the unchanged kinds left
// out.
func (b *countingBucket) since(before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range b.snapshot() {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// createFlows publishes a create per flow (name -> tables) and waits until
// Redis holds them all.
func (r *rig) createFlows(flows map[string][]uint32) map[string]meta.FlowID {
	r.t.Helper()
	for name, tables := range flows {
		r.produce(testenv.DDLTopic, name, ddl("create", name, tables...), "application/json")
	}
	ids := map[string]meta.FlowID{}
	r.eventually(60*time.Second, func() bool {
		for name := range flows {
			if _, ok := ids[name]; ok {
				continue
			}
			id, ok, err := r.store.FlowIDByName(context.Background(), "default", name)
			if err != nil || !ok {
				return false
			}
			ids[name] = id
		}
		return true
	}, "every flow created")
	return ids
}

// heartbeats sends a heartbeat of region 1000+p at resolved ts ts(ms) to
// every partition p < n, so that every partition holds a record (the
// checkpoint and coverage count only such partitions).
func (r *rig) heartbeats(n int32, ms int64) {
	r.t.Helper()
	cl := r.kafka.Client(r.t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	for p := range n {
		produceTo(r.t, cl, p, &event.Batch{RegionID: 1000 + uint64(p), ResolvedTS: ts(ms)})
	}
}

// settle flushes until no coverage entry is pending and every catalog is
// written: what the creates of flows cost is behind, and a cycle after it
// shows what data alone costs.
func (r *rig) settle() {
	r.t.Helper()
	ctx := context.Background()
	r.eventually(60*time.Second, func() bool {
		r.flush()
		pending, err := r.store.PendingCoverage(ctx)
		dirty, derr := r.store.DirtyCatalogs(ctx)
		return err == nil && derr == nil && len(pending) == 0 && len(dirty) == 0
	}, "coverage established and catalogs written")
}

// A cycle writes one data object and one meta however many flows it
// serves: 300 flows over 60 tables, each table covered by several flows,
// give one data object whose chunks are one per (table, region) whatever
// the number of flows, each event stored once in it, and every flow reads
// exactly its tables' events from the chunks tagged with its id.
func TestV2WidthOneObjectPerCycle(t *testing.T) {
	bucket := newCountingBucket()
	r := newRig(t, 2, bucket, func(c *pipeline.Config) { c.Layout = pipeline.LayoutV2 })
	r.start()
	r.heartbeats(2, 0)
	const nflows, ntables, nregions = 300, 60, 20
	flows := map[string][]uint32{}
	for i := range nflows {
		a, b := uint32(i%ntables+1), uint32((i*7+3)%ntables+1)
		flows[fmt.Sprintf("w%03d", i)] = []uint32{a, b}
	}
	ids := r.createFlows(flows)
	r.settle()

	before := bucket.snapshot()
	all := map[string]int{}                // every produced entry
	byTable := map[uint32]map[string]int{} // table -> its entries
	regions := map[[2]uint64]bool{}        // (table, region) pairs written
	for region := uint64(1); region <= nregions; region++ {
		for k := range 3 {
			table := uint32((int(region)*3+k)%ntables + 1)
			b := putBatch(region, int64(table), int64(region)*100+int64(k)*10, 4, int64(region)*100+int64(k)*10)
			r.produceBatch(b)
			for _, kv := range keysOf(b) {
				all[string(kv)]++
				if byTable[table] == nil {
					byTable[table] = map[string]int{}
				}
				byTable[table][string(kv)]++
			}
			regions[[2]uint64{uint64(table), region}] = true
		}
	}
	r.waitHandled(nregions*3 + 2)
	r.flush()
	if got := bucket.since(before); got["data"] != 1 || got["meta"] != 1 || got["catalog"] != 0 || got["checkpoint"] > 1 || len(got) > 3 {
		t.Fatalf("a cycle of %d flows uploaded %v, want one data object, one meta and at most the checkpoint object", nflows, got)
	}

	// The whole data object: every event stored once, one chunk per
	// (partition, table) listing the runs of its regions.
	var cycleMeta sink.Meta
	seen := map[string]int{}
	for _, id := range ids {
		metas, _ := r.entries(id)
		for _, m := range metas {
			if len(m.Files) > 0 && m.CycleID != cycleMeta.CycleID {
				if cycleMeta.CycleID != "" {
					t.Fatalf("the data went into cycles %s and %s, want one", cycleMeta.CycleID, m.CycleID)
				}
				cycleMeta = m
			}
		}
	}
	type partTable struct {
		p     int32
		table int64
	}
	chunks := map[partTable]int{}
	listed := map[[2]uint64]bool{}
	for _, f := range cycleMeta.Files {
		chunks[partTable{f.Partition, f.TableID}]++
		f.EachRegion(func(region uint64, _ int64) { listed[[2]uint64{uint64(f.TableID), region}] = true })
	}
	for k, n := range chunks {
		if n != 1 {
			t.Errorf("table %d of partition %d has %d chunks, want one whatever its regions and flows", k.table, k.p, n)
		}
	}
	if !reflect.DeepEqual(listed, regions) {
		t.Errorf("the chunks list %d (table, region) pairs, want the %d written", len(listed), len(regions))
	}
	for _, f := range cycleMeta.Files {
		chunk, err := sink.ReadChunk(context.Background(), r.bucket, cycleMeta.DataPath, f)
		if err != nil {
			t.Fatal(err)
		}
		for len(chunk) > 0 {
			k, v, rest, err := event.NextEntry(chunk)
			if err != nil {
				t.Fatal(err)
			}
			seen[string(k)+"\x00"+string(v)]++
			chunk = rest
		}
	}
	checkOnce(t, seen, all)

	// Each flow: exactly its tables' events, once.
	for name, id := range ids {
		want := map[string]int{}
		for _, table := range flows[name] {
			for kv := range byTable[table] {
				want[kv] = 1
			}
		}
		_, got := r.entries(id)
		checkOnce(t, got, want)
	}
}

// catalogObjects lists the catalog revisions in the bucket of flow name, by
// flow id.
func catalogObjects(t *testing.T, b sink.Bucket, name string) map[meta.FlowID][]sink.Catalog {
	t.Helper()
	ctx := context.Background()
	out := map[meta.FlowID][]sink.Catalog{}
	err := b.Iter(ctx, sink.CatalogDir("backup", "default", name), func(o string) error {
		rc, err := b.Get(ctx, o)
		if err != nil {
			return err
		}
		defer rc.Close()
		var raw json.RawMessage
		if err := json.NewDecoder(rc).Decode(&raw); err != nil {
			return err
		}
		c, err := sink.DecodeCatalog(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", o, err)
		}
		if want := sink.CatalogPath("backup", "default", name, "g", c.FlowID, c.Rev); o != want {
			return fmt.Errorf("catalog %s of flow %d rev %d, want the name %s", o, c.FlowID, c.Rev, want)
		}
		out[c.FlowID] = append(out[c.FlowID], c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A flow's catalog is written when its content changes, and only then:
// cycles of data add no catalog, a replace of one flow writes catalogs of
// that flow only, and its newest catalog holds its windows as Redis does.
func TestV2CatalogsOnlyOnChange(t *testing.T) {
	bucket := newCountingBucket()
	r := newRig(t, 1, bucket, func(c *pipeline.Config) { c.Layout = pipeline.LayoutV2 })
	r.start()
	r.heartbeats(1, 0)
	ids := r.createFlows(map[string][]uint32{"busy": {1}, "idle": {2}})
	r.settle()
	for _, name := range []string{"busy", "idle"} {
		if cats := catalogObjects(t, r.bucket, name)[ids[name]]; len(cats) == 0 {
			t.Fatalf("flow %s has no catalog after its create", name)
		}
	}
	before := bucket.snapshot()
	for i := range 5 {
		r.produceBatch(putBatch(1, 1, int64(i)*10, 3, int64(i)*10))
		r.waitHandled(int64(i + 2))
		r.flush()
	}
	if got := bucket.since(before); got["catalog"] != 0 || got["data"] != 5 {
		t.Fatalf("5 cycles of data uploaded %v, want 5 data objects and no catalog", got)
	}

	idleBefore := len(catalogObjects(t, r.bucket, "idle")[ids["idle"]])
	r.produce(testenv.DDLTopic, "busy", ddl("replace", "busy", 3), "application/json")
	r.produceBatch(putBatch(1, 3, 100, 3, 100))
	r.waitHandled(7)
	r.settle()
	if n := len(catalogObjects(t, r.bucket, "idle")[ids["idle"]]); n != idleBefore {
		t.Errorf("the idle flow got %d new catalogs from another flow's replace", n-idleBefore)
	}
	cats := catalogObjects(t, r.bucket, "busy")[ids["busy"]]
	newest := cats[len(cats)-1]
	cur, hist, err := r.store.Windows(context.Background(), ids["busy"])
	if err != nil {
		t.Fatal(err)
	}
	if len(newest.Windows) != len(cur) || len(newest.History) != len(hist) {
		t.Fatalf("newest catalog rev %d: windows %+v history %+v, want Redis's %v and %v", newest.Rev, newest.Windows, newest.History, cur, hist)
	}
	for _, w := range newest.Windows {
		rw := cur[w.TableID]
		if rw.Since != w.Since || (rw.Until == nil) != (w.Until == nil) || rw.Until != nil && *rw.Until != *w.Until {
			t.Errorf("catalog window of table %d %+v, Redis %+v", w.TableID, w, rw)
		}
	}
	if w := cur[1]; w.Until == nil {
		t.Errorf("table 1 removed by the replace still has an open window: %+v", w)
	}
	var info meta.FlowInfo
	if err := json.Unmarshal(newest.Info, &info); err != nil || len(info.SourceTableIDs) != 1 || info.SourceTableIDs[0] != 3 {
		t.Errorf("newest catalog info %s (%v), want the replaced definition", newest.Info, err)
	}
	before = bucket.snapshot()
	r.flush()
	r.flush()
	if got := bucket.since(before); got["catalog"] != 0 {
		t.Errorf("cycles after the change uploaded %d more catalogs", got["catalog"])
	}
}

// A v1 backup continues under layout v2 without a rewrite: the flow's
// metas:<id> lists its v1 metas and then v2 ones, every event is read back
// once through both, the v1 objects stay as they were, and the flow (made
// before catalogs existed) gets a catalog.
func TestV2ContinuesV1Backup(t *testing.T) {
	bucket := newCountingBucket()
	r := newRig(t, 1, bucket, func(c *pipeline.Config) { c.Layout = pipeline.LayoutV1 })
	r.start()
	id := r.createFlow("migrated", 1)
	want := map[string]int{}
	first := putBatch(1, 1, 0, 5, 0)
	r.produceBatch(first)
	r.waitHandled(1)
	r.flush()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for _, kv := range keysOf(first) {
		want[string(kv)] = 1
	}
	v1Objects := bucket.snapshot()
	if v1Objects["v1 data"] == 0 || v1Objects["data"] != 0 {
		t.Fatalf("the v1 run uploaded %v, want v1 objects only", v1Objects)
	}
	// What an older version's Redis holds: no catalog revisions at all.
	ctx := context.Background()
	rdb := r.redis.Client(t)
	keys, err := rdb.Keys(ctx, "flowlog:{flowlog}:catalog:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}

	r.cfg.Layout = pipeline.LayoutV2
	r.start()
	second := putBatch(1, 1, 100, 5, 100)
	r.produceBatch(second)
	r.waitHandled(2)
	r.flush()
	for _, kv := range keysOf(second) {
		want[string(kv)] = 1
	}
	metas, got := r.entries(id)
	versions := map[int]int{}
	for _, m := range metas {
		versions[m.Version]++
	}
	if versions[sink.MetaVersion] == 0 || versions[sink.MetaVersion2] == 0 {
		t.Fatalf("metas:%d lists metas of versions %v, want the v1 ones and a v2 one", id, versions)
	}
	checkOnce(t, got, want)
	if after := bucket.snapshot(); after["v1 data"] != v1Objects["v1 data"] || after["v1 meta"] != v1Objects["v1 meta"] {
		t.Errorf("v1 objects uploaded under v2: %v, before %v", after, v1Objects)
	}
	r.settle()
	if cats := catalogObjects(t, r.bucket, "migrated")[id]; len(cats) == 0 {
		t.Error("the flow made before catalogs existed got no catalog under v2")
	}
	if got := checkpointObject(t, r, "migrated", id); got != ts(104) {
		t.Errorf("v2 global checkpoint object %d, want %d", got, ts(104))
	}
}

// A layout v2 cycle whose objects are older than --max-commit-age when it
// is about to commit (here every cycle: the age is 1ns) uploads its data
// object and meta again under renamed names and commits those: the data
// object uploaded first is never listed, and gc may take it.
func TestV2LateCommitRenames(t *testing.T) {
	bucket := newCountingBucket()
	r := newRig(t, 1, bucket, func(c *pipeline.Config) {
		c.Layout, c.MaxCommitAge = pipeline.LayoutV2, time.Nanosecond
	})
	r.start()
	id := r.createFlow("late", 1)
	r.produceBatch(putBatch(1, 1, 1, 5, 10))
	r.waitHandled(1)
	r.flush()
	metas, got := r.entries(id)
	if len(got) != 5 {
		t.Fatalf("read back %d entries, want 5", len(got))
	}
	listed := map[string]bool{}
	for _, m := range metas {
		listed[m.DataPath] = true
		if len(m.Files) > 0 && !strings.HasSuffix(m.CycleID, "-r1") {
			t.Fatalf("committed cycle %s, want it renamed once", m.CycleID)
		}
	}
	var unlisted int
	_ = bucket.Iter(context.Background(), sink.V2LogDir("backup"), func(o string) error {
		if !listed[o] {
			unlisted++
		}
		return nil
	})
	if unlisted != 1 {
		t.Fatalf("%d data objects outside the committed metas, want the one uploaded before the rename", unlisted)
	}
}
