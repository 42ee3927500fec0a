package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// v2Metas decodes every layout v2 meta in the rig's bucket, by name.
func v2Metas(t *testing.T, r *rig) map[string]sink.Meta {
	t.Helper()
	ctx := context.Background()
	out := map[string]sink.Meta{}
	err := r.bucket.Iter(ctx, sink.V2MetaDir("backup"), func(name string) error {
		rc, err := r.bucket.Get(ctx, name)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		m, err := sink.DecodeMeta(b)
		if err != nil {
			return err
		}
		out[name] = m
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The cycle that carries only the coverage reports opening a new flow's
// windows writes a meta without a data object; its commit lists it under
// every flow the meta names, as it lists a meta with chunks, so that gc
// keeps it and recovery reads its reports (docs/FORMAT.md, "Meta objects,
// version 2"). No meta a committed cycle wrote is listed by no flow.
func TestV2CoverageOnlyMetaListed(t *testing.T) {
	r := newRig(t, 1, newCountingBucket(), func(c *pipeline.Config) { c.Layout = pipeline.LayoutV2 })
	r.start()
	r.heartbeats(1, 0)
	r.waitHandled(1)
	r.flush()
	id := r.createFlow("cov", 1)
	r.settle()

	refs, err := r.store.Metas(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, ref := range refs {
		listed[ref.Path] = true
	}
	covOnly := 0
	for name, m := range v2Metas(t, r) {
		if len(m.Files) == 0 && len(m.Coverage) > 0 {
			covOnly++
			if m.DataPath != "" {
				t.Errorf("meta %s of coverage reports only names data object %q", name, m.DataPath)
			}
		}
		if !listed[name] {
			t.Errorf("meta %s (%d files, %d coverage reports) is listed by no flow", name, len(m.Files), len(m.Coverage))
		}
	}
	if covOnly == 0 {
		t.Fatal("no cycle carried coverage reports alone: the test shows nothing")
	}
}

// A cycle of coverage reports only that cannot upload its meta counts a
// failed cycle against the flows of its reports: after --fatal-after of
// them the new flow is fatal (fetching stops, later cycles wait for no
// end of retries otherwise), and the commit once storage heals makes it
// active again (docs/OPERATING.md, "Recover a fatal flow").
func TestV2CoverageOnlyCycleFailingMakesFlowFatal(t *testing.T) {
	fb := &faultyBucket{Bucket: sink.NewMemBucket()}
	r := newRig(t, 1, fb, func(c *pipeline.Config) { c.Layout, c.FatalAfter = pipeline.LayoutV2, 3 })
	r.start()
	r.heartbeats(1, 0)
	r.waitHandled(1)
	r.flush()
	fb.setFail(func(int) bool { return true })
	id := r.createFlow("covfail", 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.cons.Flush(ctx)
	}()
	ctx := context.Background()
	r.eventually(30*time.Second, func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.Status == meta.StatusFatal
	}, "flow fatal in Redis")
	if v := testutil.ToFloat64(r.cons.MetricFlowFatal("default/covfail")); v != 1 {
		t.Fatalf("flow_fatal = %v, want 1", v)
	}
	fb.setFail(nil)
	r.eventually(30*time.Second, func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.Status == meta.StatusActive
	}, "flow active again after the cycle committed")
	if v := testutil.ToFloat64(r.cons.MetricFlowFatal("default/covfail")); v != 0 {
		t.Fatalf("flow_fatal = %v after the commit, want 0", v)
	}
}

// An idle layout v2 cycle (no chunk, no coverage report: heartbeats only)
// uploads no meta: its partition offsets and checkpoints are committed to
// Redis and to Kafka only, and recovery takes what no meta says from
// Kafka's committed offsets (docs/FORMAT.md, "Keys consumer recover
// writes"). So every meta in the bucket is listed by a flow, and gc finds
// no meta or data object unreferenced, however long the consumer idles.
func TestV2IdleCyclesWriteNoMeta(t *testing.T) {
	bucket := newCountingBucket()
	r := newRig(t, 1, bucket, func(c *pipeline.Config) { c.Layout = pipeline.LayoutV2 })
	r.start()
	r.heartbeats(1, 0)
	id := r.createFlow("idle", 1)
	r.settle()
	r.produceBatch(putBatch(1, 1, 10, 3, 10))
	r.flush()
	before := bucket.snapshot()
	for i := range int64(3) {
		r.heartbeats(1, 100+i*10)
		r.flush()
	}
	if got := bucket.since(before); got["meta"] != 0 || got["data"] != 0 {
		t.Errorf("idle cycles uploaded %v, want no meta and no data object", got)
	}
	refs, err := r.store.Metas(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) == 0 {
		t.Fatal("nothing committed: the test shows nothing")
	}
	plan, err := sink.PlanGC(context.Background(), bucket, sink.GCOptions{Prefix: "backup", Group: "g", Grace: 0, Parallel: 2, Refs: backup.GCRefs(r.store)})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range plan.Delete {
		if o.Kind == sink.GCMeta || o.Kind == sink.GCData {
			t.Errorf("gc would delete %s %s of a consumer that only committed", o.Kind, o.Name)
		}
	}
}

// concurrencyBucket records how many catalog uploads were in flight at
// once, holding each for a moment so that they overlap.
type concurrencyBucket struct {
	*sink.MemBucket
	mu       sync.Mutex
	now, max int
}

func (b *concurrencyBucket) Upload(ctx context.Context, obj sink.Object) error {
	if !strings.Contains(obj.Name, "/catalog/") {
		return b.MemBucket.Upload(ctx, obj)
	}
	b.mu.Lock()
	b.now++
	b.max = max(b.max, b.now)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.now--
		b.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Millisecond):
	}
	return b.MemBucket.Upload(ctx, obj)
}

func (b *concurrencyBucket) Overwrite(ctx context.Context, obj sink.Object) error {
	return b.MemBucket.Overwrite(ctx, obj)
}

// The first advance after many creates uploads one catalog per flow, 16 at
// a time when --upload-parallelism is lower (here 2), never more.
func TestV2CatalogsUploadedSixteenAtATime(t *testing.T) {
	bucket := &concurrencyBucket{MemBucket: sink.NewMemBucket()}
	r := newRig(t, 1, bucket, func(c *pipeline.Config) { c.Layout, c.UploadParallel = pipeline.LayoutV2, 2 })
	r.start()
	r.heartbeats(1, 0)
	flows := map[string][]uint32{}
	for i := range 48 {
		flows[fmt.Sprintf("c%02d", i)] = []uint32{uint32(i + 1)}
	}
	r.createFlows(flows)
	r.settle()
	bucket.mu.Lock()
	peak := bucket.max
	bucket.mu.Unlock()
	if peak > 16 || peak <= 2 {
		t.Errorf("%d catalogs uploaded at once at most, want more than --upload-parallelism 2 and at most 16", peak)
	}
}
