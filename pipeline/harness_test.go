package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// rig is one consumer wired to a private Redis and kfake broker, writing to
// a bucket the test controls.
type rig struct {
	t       *testing.T
	kafka   *testenv.Kafka
	redis   *testenv.Redis
	store   *meta.Store
	reg     *meta.Registry
	bucket  sink.Bucket
	cfg     pipeline.Config
	prom    *prometheus.Registry
	cons    *pipeline.Consumer
	prod    *kgo.Client
	cancel  context.CancelFunc
	done    chan error
	tempDir string
}

// testLayout is the bucket layout the rig's consumers write:
// FLOWLOG_TEST_LAYOUT (v1 or v2), v2 when unset.
func testLayout() string {
	if l := os.Getenv("FLOWLOG_TEST_LAYOUT"); l != "" {
		return l
	}
	return pipeline.LayoutV2
}

func newRig(t *testing.T, partitions int32, bucket sink.Bucket, tweak func(*pipeline.Config)) *rig {
	t.Helper()
	r := &rig{t: t, kafka: testenv.StartKafka(t, partitions), redis: testenv.StartRedis(t), bucket: bucket}
	r.store = meta.NewStore(r.redis.Client(t), "flowlog", nil)
	r.reg = meta.NewRegistry(r.store)
	r.prod = r.kafka.Client(t, kgo.ProducerLinger(0))
	r.tempDir = t.TempDir()
	r.cfg = pipeline.Config{
		TempDir: r.tempDir, FlushSize: 64 << 20, FlushInterval: time.Hour, MaxTempBytes: 1 << 30,
		MaxValueSize: 1 << 20, RegionTTL: time.Hour, StartOffset: "earliest", StoreID: "test",
		Compression: "zstd", UploadParallel: 2, FatalAfter: 30,
		RetryBackoff: 5 * time.Millisecond, MaxRetryDelay: 20 * time.Millisecond, ShutdownTimeout: 10 * time.Second,
		Layout: testLayout(),
	}
	if tweak != nil {
		tweak(&r.cfg)
	}
	return r
}

func (r *rig) start() {
	t := r.t
	t.Helper()
	r.prom = prometheus.NewRegistry()
	kopts := []kgo.Opt{kgo.SeedBrokers(r.kafka.ListenAddrs()...)}
	dlqCl := r.kafka.Client(t, dlq.ClientOpts(testenv.DLQTopic)...)
	dw := dlq.New(dlqCl, testenv.DLQTopic, r.prom)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	ap, err := meta.NewApplier(r.store, r.reg, meta.ApplierConfig{Topic: testenv.DDLTopic, KafkaOpts: kopts, DLQ: dw, Logger: log, Registerer: r.prom})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ap.Close)
	cons, err := pipeline.New(r.cfg, pipeline.Deps{
		ApplyTopic: testenv.ApplyTopic, Group: "g", KafkaOpts: kopts, Store: r.store, Registry: r.reg,
		Applier: ap, Bucket: r.bucket, GCSPrefix: "backup", DLQ: dw, Logger: log, Registerer: r.prom, RedactLogs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.cons = cons
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.done = make(chan error, 1)
	go func() { r.done <- cons.Run(ctx) }()
	t.Cleanup(func() { r.stop() })
}

// stop cancels the consumer and waits for its graceful stop.
func (r *rig) stop() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(60 * time.Second):
		r.t.Fatal("consumer did not stop in 60s")
		return nil
	}
}

func (r *rig) createFlow(name string, tables ...uint32) meta.FlowID {
	r.t.Helper()
	r.createFlowAsync(name, tables...)
	var id meta.FlowID
	r.eventually(10*time.Second, func() bool {
		got, ok, err := r.store.FlowIDByName(context.Background(), "default", name)
		id = got
		return err == nil && ok
	}, "flow "+name+" created")
	return id
}

// tableIDs are the table ids 1..n.
func tableIDs(n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	return ids
}

// createFlowAsync publishes the create DDL of a flow and does not wait for
// it to be applied.
func (r *rig) createFlowAsync(name string, tables ...uint32) {
	r.t.Helper()
	ddl, _ := json.Marshal(map[string]any{"op": "create", "flow": map[string]any{
		"catalog_name": "default", "flow_name": name, "source_table_ids": tables,
		"sink_table_name": map[string]string{"catalog_name": "default", "schema_name": "public", "table_name": name + "_sink"},
		"flownode_ids":    map[string]uint64{"0": 1},
	}, "routes": map[string]any{"0": map[string]any{"peer": map[string]any{"id": 1, "addr": "n1:4000"}}}})
	r.produce(testenv.DDLTopic, name, ddl, "application/json")
}

func (r *rig) produce(topic, key string, value []byte, contentType string) {
	r.t.Helper()
	rec := &kgo.Record{Topic: topic, Key: []byte(key), Value: value}
	if contentType != "" {
		rec.Headers = []kgo.RecordHeader{{Key: "content-type", Value: []byte(contentType)}}
	}
	if err := r.prod.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		r.t.Fatal(err)
	}
}

// produceBatch publishes one ApplyBatch keyed by its region.
func (r *rig) produceBatch(b *event.Batch) {
	r.t.Helper()
	r.produce(testenv.ApplyTopic, strconv.FormatUint(b.RegionID, 10), event.EncodeBatch(nil, b), "")
}

func (r *rig) flush() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := r.cons.Flush(ctx)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			r.t.Fatalf("flush: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// next0 is the next offset of partition 0 in the consumer's Status, and -2
// while it holds no partition (before its first assignment), so that a poll
// on it reads "not yet" instead of indexing an empty list.
func (r *rig) next0() int64 {
	st := r.cons.Status()
	if len(st.Partitions) == 0 {
		return -2
	}
	return st.Partitions[0].Next
}

func (r *rig) eventually(d time.Duration, cond func() bool, what string) {
	r.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out after %v waiting for: %s", d, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// entries reads back every entry of every chunk of the flow that the
// metas listed in metas:<id> reference: in a layout v2 meta only the chunks
// that hold the flow (sink.Meta.Holds), so that an entry is counted once
// per flow whatever other flows its chunk serves. ReadChunk checks sha256
// on the way.
func (r *rig) entries(id meta.FlowID) (metas []sink.Meta, entries map[string]int) {
	r.t.Helper()
	ctx := context.Background()
	refs, err := r.store.Metas(ctx, id)
	if err != nil {
		r.t.Fatal(err)
	}
	entries = map[string]int{}
	for _, ref := range refs {
		rc, err := r.bucket.Get(ctx, ref.Path)
		if err != nil {
			r.t.Fatalf("meta %s: %v", ref.Path, err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		m, err := sink.DecodeMeta(b)
		if err != nil {
			r.t.Fatalf("decode meta %s: %v", ref.Path, err)
		}
		if !m.Serves(id) {
			r.t.Fatalf("meta %s listed under flow %d does not serve it", ref.Path, id)
		}
		metas = append(metas, m)
		for _, f := range m.Files {
			if !m.Holds(id, &f) {
				continue
			}
			chunk, err := sink.ReadChunk(ctx, r.bucket, m.DataPath, f)
			if err != nil {
				r.t.Fatalf("chunk of %s: %v", m.DataPath, err)
			}
			for len(chunk) > 0 {
				k, v, rest, err := event.NextEntry(chunk)
				if err != nil {
					r.t.Fatal(err)
				}
				entries[string(k)+"\x00"+string(v)]++
				chunk = rest
			}
		}
	}
	return metas, entries
}

func (r *rig) tempFiles() []string {
	var out, spares []string
	_ = filepath.Walk(r.tempDir, func(p string, fi os.FileInfo, err error) error {
		switch {
		case err != nil || fi.IsDir() || fi.Name() == ".flowlog-temp": // not the marker
		case pipeline.SpareName(fi.Name()) && filepath.Dir(p) == r.tempDir:
			spares = append(spares, p)
		default:
			out = append(out, p)
		}
		return nil
	})
	// A running consumer keeps up to MaxSpares released segment files for
	// the next segments to write over; more is a leak, and a stopped one
	// keeps none.
	if len(spares) > pipeline.MaxSpares || r.cancel == nil {
		out = append(out, spares...)
	}
	return out
}

// faultyBucket fails uploads of data and meta objects while fail() says so.
type faultyBucket struct {
	sink.Bucket
	mu      sync.Mutex
	fail    func(n int) bool
	uploads int
	failed  atomic.Int64
}

func (b *faultyBucket) Upload(ctx context.Context, obj sink.Object) error {
	b.mu.Lock()
	b.uploads++
	n, fail := b.uploads, b.fail
	b.mu.Unlock()
	if fail != nil && fail(n) {
		b.failed.Add(1)
		return errors.New("injected storage failure")
	}
	return b.Bucket.Upload(ctx, obj)
}

func (b *faultyBucket) Overwrite(ctx context.Context, obj sink.Object) error {
	return b.Bucket.(sink.Overwriter).Overwrite(ctx, obj)
}

func (b *faultyBucket) setFail(f func(n int) bool) {
	b.mu.Lock()
	b.fail = f
	b.mu.Unlock()
}

// waitHandled waits until the consumer's next offsets, summed over its
// partitions, reach n: every one of n produced records was handled.
func (r *rig) waitHandled(n int64) {
	r.t.Helper()
	r.eventually(60*time.Second, func() bool {
		var next int64
		for _, p := range r.cons.Status().Partitions {
			next += p.Next
		}
		return next == n
	}, "every record handled")
}

// checkOnce fails t unless every entry of want (produced once each) was
// backed up exactly once and nothing else was: got is rig.entries' count.
func checkOnce(t *testing.T, got, want map[string]int) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("backed up %d distinct entries, want %d", len(got), len(want))
	}
	for k, n := range got {
		if want[k] != 1 || n != 1 {
			t.Fatalf("entry backed up %d times (produced %d times)", n, want[k])
		}
	}
}
