package replay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/replay"
)

// A target broker that goes away fails the replay's writes with an error
// once the delivery timeout passes: the run ends and can be re-run, it
// does not wait for the broker for good.
func TestDeadTargetFailsTheRun(t *testing.T) {
	c := kafka(t, 1, "out")
	defer replay.SetDeliveryTimeout(time.Second)()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tg, err := replay.NewKafkaTarget(ctx, replay.KafkaTargetConfig{Topic: "out", MaxBuffered: 1 << 20}, kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if _, err := tg.Partitions(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := tg.Produce(ctx, &kgo.Record{Partition: 0, Value: []byte("v")}); err != nil {
		t.Fatalf("produce queued behind no failure: %v", err)
	}
	err = tg.Flush(ctx)
	if err == nil {
		t.Fatal("flush to a closed broker succeeded")
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		t.Fatalf("flush waited for the test's own deadline instead of failing on the delivery timeout: %v", err)
	}
	t.Logf("flush: %v", err)
}
