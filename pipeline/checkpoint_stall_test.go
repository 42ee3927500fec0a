package pipeline_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// produceTo publishes b to partition p of the apply topic.
func produceTo(t *testing.T, cl *kgo.Client, p int32, b *event.Batch) {
	t.Helper()
	rec := &kgo.Record{Topic: testenv.ApplyTopic, Partition: p, Key: []byte(strconv.FormatUint(b.RegionID, 10)), Value: event.EncodeBatch(nil, b)}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatalf("produce to partition %d: %v", p, err)
	}
}

// heartbeatsUntil sends heartbeats of region on partition p with a rising
// resolved ts until cond holds or the deadline passes; it reports cond.
func heartbeatsUntil(t *testing.T, cl *kgo.Client, p int32, region uint64, from int64, d time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for ms := from; time.Now().Before(deadline); ms += 100 {
		produceTo(t, cl, p, &event.Batch{RegionID: region, ResolvedTS: ts(ms)})
		if cond() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cond()
}

// A partition whose regions have all gone silent for --region-ttl no
// longer holds the global checkpoint back: it commits ckpt "idle" and is
// left out, so one quiet partition cannot stop every flow's checkpoint
// (docs/FORMAT.md, "Checkpoint rule").
func TestSilentPartitionStopsHoldingTheCheckpoint(t *testing.T) {
	r := newRig(t, 2, sink.NewMemBucket(), func(c *pipeline.Config) {
		c.RegionTTL, c.FlushInterval = time.Second, 300*time.Millisecond
	})
	cl := r.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	r.start()
	id := r.createFlow("silent", 1)
	produceTo(t, cl, 1, &event.Batch{RegionID: 2, ResolvedTS: ts(1000)}) // then silent
	ctx := context.Background()
	past := func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.CheckpointTS > ts(1000)
	}
	if !heartbeatsUntil(t, cl, 0, 1, 2000, 30*time.Second, past) {
		st, _ := r.store.FlowState(ctx, id)
		t.Fatalf("checkpoint %d stayed at or below the silent partition's %d", st.CheckpointTS, ts(1000))
	}
	// When the region speaks again, its partition counts again.
	produceTo(t, cl, 1, &event.Batch{RegionID: 2, ResolvedTS: ts(1_000_000)})
	r.eventually(10*time.Second, func() bool {
		v, err := r.redis.Client(t).Get(ctx, "flowlog:{flowlog}:ckpt:"+testenv.ApplyTopic+":1").Result()
		return err == nil && v == strconv.FormatUint(ts(1_000_000), 10)
	}, "the partition's checkpoint back once its region speaks")
}

// A partition whose end offset is above 0 but whose records were all
// removed by retention before anyone read them does not stall the global
// checkpoint: no record can ever be routed from it, so waiting for its
// ckpt would wait for good.
func TestEmptiedPartitionDoesNotStallTheCheckpoint(t *testing.T) {
	r := newRig(t, 2, sink.NewMemBucket(), func(c *pipeline.Config) { c.FlushInterval = 300 * time.Millisecond })
	cl := r.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	produceTo(t, cl, 1, &event.Batch{RegionID: 2, ResolvedTS: ts(500)})
	var del kadm.Offsets
	del.AddOffset(testenv.ApplyTopic, 1, 1, -1)
	resp, err := kadm.NewClient(r.kafka.Client(t)).DeleteRecords(context.Background(), del)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete records: %v", err)
	}
	r.start()
	id := r.createFlow("emptied", 1)
	ctx := context.Background()
	ok := heartbeatsUntil(t, cl, 0, 1, 2000, 30*time.Second, func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.CheckpointTS >= ts(2000)
	})
	if !ok {
		t.Fatal("the global checkpoint never advanced: the emptied partition holds it back")
	}
}
