package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// touchesFlowState reports whether cmd names a flow:state key.
func touchesFlowState(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, ":flow:state:") {
			return true
		}
	}
	return false
}

// In layout v2 the checkpoint advances of a session after its first touch
// no flow's state, however many flows sit idle: the idle flows' own
// checkpoint_ts stays where the first advance put it, and their checkpoint
// (the effective one, docs/FORMAT.md "Checkpoint rule") follows the global
// checkpoint.
func TestV2AdvanceLeavesIdleFlowsAlone(t *testing.T) {
	if testLayout() != pipeline.LayoutV2 {
		t.Skip("layout v1 advances every flow's checkpoint_ts")
	}
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	// touches counts the consumer's commands that name a flow:state key,
	// each command of a pipeline or MULTI on its own.
	var touches atomic.Int64
	cl := r.redis.Client(t)
	cl.AddHook(testenv.CommandHook(func(cmd redis.Cmder) {
		if touchesFlowState(cmd) {
			touches.Add(1)
		}
	}))
	r.store = meta.NewStore(cl, "flowlog", nil)
	r.reg = meta.NewRegistry(r.store)
	reader := meta.NewStore(r.redis.Client(t), "flowlog", nil)
	ctx := context.Background()
	rdb := r.redis.Client(t)
	k := reader.Keys()

	r.start()
	busy := r.createFlow("busy", 1)
	const idleFlows = 20
	var idle []meta.FlowID
	for i := range idleFlows {
		idle = append(idle, r.createFlow(fmt.Sprintf("idle%d", i), uint32(100+i)))
	}
	r.produceBatch(putBatch(1, 1, 0, 5, 1000))
	r.waitHandled(1)
	r.flush()
	first := ts(1004)
	for _, id := range idle {
		if st, err := reader.FlowState(ctx, id); err != nil || st.CheckpointTS != first {
			t.Fatalf("idle flow %d after the first advance: %+v, %v; want checkpoint %d", id, st, err, first)
		}
	}

	before := touches.Load()
	if before == 0 {
		t.Fatal("the hook saw no command naming a flow:state key before the first advance: it does not watch the consumer's client")
	}
	for i := range int64(5) {
		r.produceBatch(putBatch(1, 1, 10*(i+1), 5, 2000+1000*i))
		r.waitHandled(2 + i)
		r.flush()
	}
	last := ts(2000 + 1000*4 + 4)
	if n := touches.Load() - before; n != 0 {
		t.Errorf("5 cycles of the busy flow sent %d commands naming a flow:state key; want none", n)
	}
	if g, err := rdb.Get(ctx, k.GlobalCheckpoint()).Uint64(); err != nil || g != last {
		t.Fatalf("global_checkpoint = %d, %v; want %d", g, err, last)
	}
	for _, id := range append([]meta.FlowID{busy}, idle...) {
		if own, err := rdb.HGet(ctx, k.FlowState(id), "checkpoint_ts").Uint64(); err != nil || own != first {
			t.Errorf("flow %d checkpoint_ts = %d, %v; want it left at the first advance's %d", id, own, err, first)
		}
		if st, err := reader.FlowState(ctx, id); err != nil || st.CheckpointTS != last {
			t.Errorf("flow %d state %+v, %v; want the global checkpoint %d", id, st, err, last)
		}
	}
}
