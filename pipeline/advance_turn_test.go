package pipeline_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// checkpointGauge is flowlog_checkpoint_ts of flow label, -1 if absent.
func checkpointGauge(t *testing.T, g prometheus.Gatherer, label string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flowlog_checkpoint_ts" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "flow" && l.GetValue() == label {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// A replica whose turn it is not commits its cycles and leaves the
// checkpoint advance to the member holding the turn: it shows the global
// checkpoint Redis holds and moves no checkpoint. Once the turn is
// free it takes it and advances.
func TestAdvanceTurnHeldElsewhere(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), func(c *pipeline.Config) { c.FlushInterval = 200 * time.Millisecond })
	ctx := context.Background()
	rdb := r.redis.Client(t)
	k := r.store.Keys()
	if err := rdb.Set(ctx, k.AdvanceTurn(), "other-replica", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r.start()
	id := r.createFlow("turn", 1)
	r.produceBatch(&event.Batch{RegionID: 1, ResolvedTS: ts(3000)})
	ckptKey := k.Ckpt(testenv.ApplyTopic, 0)
	r.eventually(30*time.Second, func() bool {
		v, err := rdb.Get(ctx, ckptKey).Result()
		return err == nil && v == strconv.FormatUint(ts(3000), 10)
	}, "the partition checkpoint committed")

	// The holder's value, set after the commit: a gauge showing it comes
	// from an advance step that ran after the partition checkpoint was
	// committed.
	if err := rdb.Set(ctx, k.GlobalCheckpoint(), strconv.FormatUint(ts(1500), 10), 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.eventually(30*time.Second, func() bool {
		return checkpointGauge(t, r.prom, "default/turn") == float64(ts(1500))
	}, "the gauge showing the holder's global checkpoint")
	// This replica wrote no checkpoint: the flow's own checkpoint_ts is
	// unset and its effective checkpoint is the holder's global one.
	if v, err := rdb.HGet(ctx, k.FlowState(id), "checkpoint_ts").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("flow:state checkpoint_ts = %q, %v; want none while another replica holds the turn", v, err)
	}
	if g, err := rdb.Get(ctx, k.GlobalCheckpoint()).Uint64(); err != nil || g != ts(1500) {
		t.Fatalf("global_checkpoint = %d, %v; want the holder's %d", g, err, ts(1500))
	}
	if st, err := r.store.FlowState(ctx, id); err != nil || st.CheckpointTS != ts(1500) {
		t.Fatalf("flow state = %+v, %v; want the holder's global checkpoint %d", st, err, ts(1500))
	}

	if err := rdb.Del(ctx, k.AdvanceTurn()).Err(); err != nil {
		t.Fatal(err)
	}
	r.produceBatch(&event.Batch{RegionID: 1, ResolvedTS: ts(4000)})
	r.eventually(30*time.Second, func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.CheckpointTS == ts(4000)
	}, "the flow's checkpoint advanced once the turn was free")
}
