package pipeline_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// A backlog larger than a few cycles is committed to its end without
// waiting for the flush interval: once every partition is read up to its
// high watermark, the last cycle freezes (trigger caught_up). The interval
// here is an hour, so without the trigger the backlog's tail would stay
// uncommitted for the whole test.
func TestCatchUpEndsWithItsBacklog(t *testing.T) {
	r := newRig(t, 2, sink.NewMemBucket(), func(c *pipeline.Config) {
		// Fetches (a quarter of 16 MiB, split over the partitions) far
		// smaller than a cycle: a cycle freezes by size at 16 MiB plus at
		// most one poll (about 1.4 MB here, 2.8 MB allowed for).
		c.MaxMemory, c.FlushSize, c.MaxTempBytes = 16<<20, 16<<20, 128<<20
		c.FlushInterval, c.Compression = time.Hour, "none"
	})
	r.createFlowAsync("catchup", 1)
	want := map[string]int{}
	// About 44.6 MB (255 B an event): two cycles by size take 33.6-39.2
	// MB whatever the poll boundaries, so a tail of 5.4-11 MB is left,
	// less than a cycle and more than an eighth of one.
	const batches, perBatch = 700, 250
	value := bytes.Repeat([]byte("x"), 200)
	for i := range batches {
		b := putBatch(uint64(1+i%4), 1, int64(i*perBatch), perBatch, int64(i*perBatch))
		for j := range b.Events {
			w, _ := event.AppendWrite(nil, event.Write{Type: event.WritePut, StartTS: ts(int64(i*perBatch+j)) - 1, ShortValue: value, HasShortValue: true})
			b.Events[j].Value = w
		}
		for _, e := range b.Events {
			want[string(e.Key)+"\x00"+string(e.Value)] = 1
		}
		r.produceBatch(b)
	}
	ctx := context.Background()
	ends, err := kadm.NewClient(r.kafka.Client(t)).ListEndOffsets(ctx, testenv.ApplyTopic)
	if err != nil {
		t.Fatal(err)
	}
	// The whole backlog is in Kafka before the consumer starts.
	r.start()
	r.eventually(60*time.Second, func() bool {
		done := true
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset == 0 {
				return
			}
			got, ok, err := r.store.Offset(ctx, testenv.ApplyTopic, o.Partition)
			if err != nil || !ok || got != o.Offset {
				done = false
			}
		})
		return done
	}, "the whole backlog committed, well before the hour-long interval")
	// The flow's creation freezes a cycle wherever the consumer is then, so
	// the last size cycle may end right at the backlog's end and leave no
	// tail for caught_up: the proof is the backlog committed above, with an
	// interval of an hour.
	t.Logf("cycles by caught_up: %v", testutil.ToFloat64(r.cons.MetricCycles("caught_up", "ok")))
	id, _, err := r.store.FlowIDByName(ctx, "default", "catchup")
	if err != nil {
		t.Fatal(err)
	}
	_, got := r.entries(id)
	checkOnce(t, got, want)
	checkOffsetsCommitted(t, r)
}
