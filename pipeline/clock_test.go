package pipeline_test

import (
	"context"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// checkpointObject reads the global checkpoint object that holds flow
// name's checkpoint: the flow's own in layout v1, the group's in layout v2.
func checkpointObject(t *testing.T, r *rig, name string, id meta.FlowID) uint64 {
	t.Helper()
	path := sink.CheckpointPath("backup", "default", name, "g", id)
	if r.cfg.Layout == pipeline.LayoutV2 {
		path = sink.CheckpointPathV2("backup", "g")
	}
	rc, err := r.bucket.Get(context.Background(), path)
	if err != nil {
		t.Fatalf("checkpoint object: %v", err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	ts, err := sink.DecodeCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// dlqReasons reads n records of the DLQ topic and returns their
// flowlog-error headers.
func dlqReasons(t *testing.T, r *rig, n int) []string {
	t.Helper()
	cl := r.kafka.Client(t, kgo.ConsumeTopics(testenv.DLQTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []string
	for len(out) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { out = append(out, headerOf(rec, "flowlog-error")) })
	}
	return out
}

// A resolved ts or an event ts further ahead of the consumer's clock than
// --max-clock-skew sends its record to the DLQ (reason ts_future), and the
// record counts toward nothing: heartbeats at 2^64-1 on both partitions do
// not move the checkpoint once the honest regions fall silent, a put at
// 2^63 on a table no flow covers does not move maxts, so a flow created
// after it gets a window that starts now, and the valid event of a record
// with one future event is not written.
func TestFutureTimestampsGoToDLQAndMoveNothing(t *testing.T) {
	r := newRig(t, 2, sink.NewMemBucket(), func(c *pipeline.Config) { c.RegionTTL = 2 * time.Second })
	r.start()
	id := r.createFlow("clock", 1)
	ctx := context.Background()
	cl := r.kafka.Client(t, kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))

	honest0, honest1 := putBatch(1, 1, 0, 5, 0), putBatch(2, 1, 100, 5, 10)
	produceTo(t, cl, 0, honest0)
	produceTo(t, cl, 1, honest1)
	want := ts(4) // min of the honest regions' resolved ts
	sent := int64(2)
	r.eventually(30*time.Second, func() bool {
		r.waitHandled(sent)
		r.flush()
		if st, _ := r.store.FlowState(ctx, id); st.CheckpointTS == want {
			return true
		}
		// A busy machine took longer than --region-ttl: the regions
		// speak again, at the same resolved ts.
		produceTo(t, cl, 0, &event.Batch{RegionID: 1, ResolvedTS: honest0.ResolvedTS})
		produceTo(t, cl, 1, &event.Batch{RegionID: 2, ResolvedTS: honest1.ResolvedTS})
		sent += 2
		return false
	}, "the checkpoint at the honest regions' min resolved ts")

	future := event.ComposeTS(time.Now().Add(time.Hour).UnixMilli(), 0)
	mixed := putBatch(12, 1, 500, 2, 20)
	mixed.Events[1].Key = event.AppendDataKey(nil, event.RowKey(1, 501), future)
	poison := []struct {
		p int32
		b *event.Batch
	}{
		{0, &event.Batch{RegionID: 9, ResolvedTS: math.MaxUint64}},
		{1, &event.Batch{RegionID: 10, ResolvedTS: math.MaxUint64}},
		{0, putBatch(11, 3, 1, 1, 0)},
		{1, mixed},
	}
	poison[2].b.Events[0].Key = event.AppendDataKey(nil, event.RowKey(3, 1), 1<<63)
	poison[2].b.ResolvedTS = 0
	for _, x := range poison {
		produceTo(t, cl, x.p, x.b)
	}
	r.waitHandled(sent + 4)
	reasons := dlqReasons(t, r, 4)
	if len(reasons) != 4 {
		t.Fatalf("DLQ holds %d records, want the 4 with a future ts", len(reasons))
	}
	for _, reason := range reasons {
		if !strings.HasPrefix(reason, "ts_future") || !strings.Contains(reason, "--max-clock-skew") {
			t.Errorf("DLQ reason %q, want ts_future naming --max-clock-skew", reason)
		}
	}
	// 1 event for each heartbeat, whose record counts as one, 1 for the
	// put at 2^63, 2 for the mixed record.
	if n := testutil.ToFloat64(r.cons.MetricEvents("dlq", "ts_future")); n != 5 {
		t.Errorf("events_total{result=dlq,reason=ts_future} = %v, want 5", n)
	}

	// The honest regions fall silent: with the heartbeats counted, the
	// checkpoint would become 2^64-1 now.
	r.eventually(20*time.Second, func() bool {
		r.flush() // a freeze forgets the regions silent for --region-ttl
		regions := 0
		for _, p := range r.cons.Status().Partitions {
			regions += p.Regions
		}
		return regions == 0
	}, "every honest region silent for --region-ttl")
	r.flush()
	bound := event.MaxTS(time.Now(), pipeline.DefaultMaxClockSkew)
	st, err := r.store.FlowState(ctx, id)
	if err != nil || st.CheckpointTS != want {
		t.Fatalf("checkpoint %d (%v) after future heartbeats, want it kept at %d", st.CheckpointTS, err, want)
	}
	if got := checkpointObject(t, r, "clock", id); got != want {
		t.Errorf("global_checkpoint object %d, want %d", got, want)
	}
	maxts, err := r.redis.Client(t).Get(ctx, meta.NewKeys("flowlog").MaxTS(testenv.ApplyTopic, 0)).Uint64()
	if err != nil || maxts != ts(4) {
		t.Errorf("maxts of partition 0 = %d (%v), want %d (the put at 2^63 counts toward nothing)", maxts, err, ts(4))
	}
	_, got := r.entries(id)
	for _, e := range mixed.Events {
		if got[string(e.Key)+"\x00"+string(e.Value)] != 0 {
			t.Errorf("an event of the refused record was backed up")
		}
	}

	// A flow created after the put at 2^63 gets a window that starts at
	// the partitions' honest maxts, not in the future.
	late := r.createFlow("after_future", 3)
	produceTo(t, cl, 0, putBatch(1, 3, 7, 2, 30))
	produceTo(t, cl, 1, putBatch(2, 3, 9, 2, 30))
	r.waitHandled(sent + 6)
	r.eventually(20*time.Second, func() bool {
		r.flush()
		cur, _, err := r.store.Windows(ctx, late)
		return err == nil && len(cur) == 1
	}, "table 3's window of the late flow established")
	cur, _, _ := r.store.Windows(ctx, late)
	if w := cur[3]; w.Since > bound || w.Since != ts(14) {
		t.Errorf("late flow's window since %d, want %d (the honest maxts of partition 1), never past %d", w.Since, ts(14), bound)
	}
}

// State that a version which took any ts stored in Redis (a checkpoint,
// maxts, a partition checkpoint and a region's resolved ts past the clock)
// is repaired by the next cycles instead of poisoning the backup for good.
func TestStoredFutureStateIsRepaired(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("repair", 1)
	ctx := context.Background()
	r.produceBatch(putBatch(1, 1, 0, 5, 0))
	r.waitHandled(1)
	r.flush()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	k := meta.NewKeys("flowlog")
	rdb := r.redis.Client(t)
	huge := strconv.FormatUint(math.MaxUint64, 10)
	for _, err := range []error{
		rdb.HSet(ctx, k.FlowState(id), "checkpoint_ts", huge).Err(),
		rdb.Set(ctx, k.MaxTS(testenv.ApplyTopic, 0), strconv.FormatUint(1<<63, 10), 0).Err(),
		rdb.Set(ctx, k.Ckpt(testenv.ApplyTopic, 0), huge, 0).Err(),
		rdb.HSet(ctx, k.Regions(testenv.ApplyTopic, 0), "99", huge).Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}

	r.start()
	r.produceBatch(putBatch(1, 1, 10, 5, 10))
	r.waitHandled(2)
	r.flush()
	bound := event.MaxTS(time.Now(), pipeline.DefaultMaxClockSkew)
	if st, err := r.store.FlowState(ctx, id); err != nil || st.CheckpointTS != ts(14) {
		t.Errorf("checkpoint %d (%v), want it repaired to %d", st.CheckpointTS, err, ts(14))
	}
	if got := checkpointObject(t, r, "repair", id); got != ts(14) {
		t.Errorf("global_checkpoint object %d, want %d", got, ts(14))
	}
	if maxts, err := rdb.Get(ctx, k.MaxTS(testenv.ApplyTopic, 0)).Uint64(); err != nil || maxts > bound {
		t.Errorf("maxts %d (%v), want it capped at the clock plus the skew (%d)", maxts, err, bound)
	}
	if ck, err := rdb.Get(ctx, k.Ckpt(testenv.ApplyTopic, 0)).Uint64(); err != nil || ck != ts(14) {
		t.Errorf("ckpt of partition 0 = %d (%v), want %d", ck, err, ts(14))
	}
	if n, err := rdb.HExists(ctx, k.Regions(testenv.ApplyTopic, 0), "99").Result(); err != nil || n {
		t.Errorf("region 99 with a resolved ts of 2^64-1 still listed (%v)", err)
	}
}
