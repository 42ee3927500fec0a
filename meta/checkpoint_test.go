package meta_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// idleFlows creates n flows of one table each and returns their ids.
func idleFlows(t *testing.T, s *meta.Store, n int) []meta.FlowID {
	t.Helper()
	ids := make([]meta.FlowID, n)
	for i := range ids {
		ids[i] = meta.FlowID(i + 1)
		info := meta.FlowInfo{CatalogName: "c", FlowName: fmt.Sprintf("f%d", i), SourceTableIDs: []uint32{uint32(i + 1)}}
		if err := s.CreateFlow(context.Background(), ids[i], info, nil); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// The layout v2 advance costs the same number of Redis commands with 3
// flows and with 300, and writes no flow's checkpoint_ts; the per-flow
// advance it replaces grows with the flows.
func TestAdvanceGlobalCheckpointCostsNoFlows(t *testing.T) {
	ctx := context.Background()
	type cost struct{ global, perFlow int64 }
	measure := func(t *testing.T, flows int) cost {
		rdb := startRedis(t).Client(t)
		var n atomic.Int64
		rdb.AddHook(testenv.CommandHook(func(redis.Cmder) { n.Add(1) }))
		s := meta.NewStore(rdb, "", nil)
		ids := idleFlows(t, s, flows)
		var c cost
		// Ten advances that move and one that does not.
		before := n.Load()
		for i := range uint64(10) {
			if g, err := s.AdvanceGlobalCheckpoint(ctx, 100+i, 1<<62); err != nil || g != 100+i {
				t.Fatalf("AdvanceGlobalCheckpoint(%d) = %d, %v", 100+i, g, err)
			}
		}
		if g, err := s.AdvanceGlobalCheckpoint(ctx, 50, 1<<62); err != nil || g != 109 {
			t.Fatalf("AdvanceGlobalCheckpoint(50) = %d, %v; want it kept at 109", g, err)
		}
		c.global = n.Load() - before
		for _, id := range ids {
			if v, err := rdb.HGet(ctx, s.Keys().FlowState(id), "checkpoint_ts").Result(); !errors.Is(err, redis.Nil) {
				t.Fatalf("flow %d checkpoint_ts = %q (%v) after global advances; want none", id, v, err)
			}
		}
		before = n.Load()
		if _, _, err := s.AdvanceCheckpoints(ctx, ids, 200, 1<<62); err != nil {
			t.Fatal(err)
		}
		c.perFlow = n.Load() - before
		return c
	}
	few, many := measure(t, 3), measure(t, 300)
	t.Logf("11 global advances: %d commands with 3 flows, %d with 300; one per-flow advance: %d and %d",
		few.global, many.global, few.perFlow, many.perFlow)
	if few.global != many.global || few.global > 11*8 {
		t.Errorf("11 global advances sent %d commands with 3 flows and %d with 300; want the same, at most 8 each", few.global, many.global)
	}
	if many.perFlow <= few.perFlow {
		t.Errorf("a per-flow advance sent %d commands with 300 flows, %d with 3: the comparison measures nothing", many.perFlow, few.perFlow)
	}
}

// A flow that sits idle through many global advances has the global
// checkpoint as its checkpoint in every reader: FlowState, the catalog
// read, and the ckpt of a step that removes a table. A dropped flow keeps
// the effective checkpoint it had at the drop; a flow whose own
// checkpoint_ts is ahead of the global one (consumer recover writes one)
// keeps its own.
func TestEffectiveCheckpoint(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	k := s.Keys()
	idle := meta.FlowInfo{CatalogName: "c", FlowName: "idle", SourceTableIDs: []uint32{1, 2}}
	gone := meta.FlowInfo{CatalogName: "c", FlowName: "gone", SourceTableIDs: []uint32{3}}
	ahead := meta.FlowInfo{CatalogName: "c", FlowName: "ahead", SourceTableIDs: []uint32{4}}
	for id, info := range map[meta.FlowID]meta.FlowInfo{1: idle, 2: gone, 3: ahead} {
		if err := s.CreateFlow(ctx, id, info, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The first advance of a session moves every flow, then the global
	// checkpoint moves alone.
	if _, _, err := s.AdvanceCheckpoints(ctx, []meta.FlowID{1, 2, 3}, 100, 1<<62); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, k.FlowState(3), "checkpoint_ts", "5000").Err(); err != nil {
		t.Fatal(err)
	}
	advance := func(ts uint64) {
		t.Helper()
		if _, err := s.AdvanceGlobalCheckpoint(ctx, ts, 1<<62); err != nil {
			t.Fatal(err)
		}
	}
	for ts := uint64(200); ts <= 1000; ts += 100 {
		advance(ts)
	}
	checkpoint := func(id meta.FlowID) uint64 {
		t.Helper()
		st, err := s.FlowState(ctx, id)
		if err != nil {
			t.Fatalf("FlowState(%d): %v", id, err)
		}
		cs, err := s.CatalogState(ctx, id)
		if err != nil {
			t.Fatalf("CatalogState(%d): %v", id, err)
		}
		if st.CheckpointTS != cs.CheckpointTS {
			t.Fatalf("flow %d: FlowState says checkpoint %d, the catalog read %d", id, st.CheckpointTS, cs.CheckpointTS)
		}
		return st.CheckpointTS
	}
	if own := rdb.HGet(ctx, k.FlowState(1), "checkpoint_ts").Val(); own != "100" {
		t.Fatalf("idle flow's checkpoint_ts = %q; want it left at 100 by the global advances", own)
	}
	if got := checkpoint(1); got != 1000 {
		t.Errorf("idle flow's checkpoint = %d, want the global 1000", got)
	}
	if got := checkpoint(3); got != 5000 {
		t.Errorf("checkpoint of the flow whose own checkpoint_ts is 5000 = %d, want 5000", got)
	}

	t.Run("fatal", func(t *testing.T) {
		if err := s.SetFlowFatal(ctx, 1, "upload failed"); err != nil {
			t.Fatal(err)
		}
		if st, err := s.FlowState(ctx, 1); err != nil || st.Status != meta.StatusFatal || st.CheckpointTS != 1000 {
			t.Errorf("fatal flow's state = %+v, %v; want checkpoint 1000", st, err)
		}
		if err := s.SetFlowActive(ctx, 1); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("replace that removes a table", func(t *testing.T) {
		next := idle
		next.SourceTableIDs = []uint32{1}
		if err := s.UpdateFlow(ctx, 1, idle, next, nil); err != nil {
			t.Fatal(err)
		}
		removed, err := s.PendingRemoved(ctx, 1)
		if err != nil || len(removed) != 1 || removed[2] != 1000 {
			t.Errorf("PendingRemoved = %v, %v; want table 2 at the global 1000", removed, err)
		}
	})

	t.Run("dropped flow keeps its checkpoint", func(t *testing.T) {
		if err := s.DestroyFlow(ctx, 2, gone); err != nil {
			t.Fatal(err)
		}
		advance(2000)
		advance(3000)
		if _, err := s.FlowState(ctx, 2); !errors.Is(err, meta.ErrFlowNotFound) {
			t.Fatalf("FlowState of the dropped flow: %v, want ErrFlowNotFound", err)
		}
		cs, err := s.CatalogState(ctx, 2)
		if err != nil || cs.Exists || cs.CheckpointTS != 1000 {
			t.Errorf("dropped flow's catalog = exists %v, checkpoint %d (%v); want the 1000 of its drop", cs.Exists, cs.CheckpointTS, err)
		}
		if got := rdb.HGet(ctx, k.CatalogRev(2), "checkpoint_ts").Val(); got != "1000" {
			t.Errorf("catalog:rev checkpoint_ts of the dropped flow = %q, want 1000", got)
		}
		removed, err := s.PendingRemoved(ctx, 2)
		if err != nil || removed[3] != 1000 {
			t.Errorf("PendingRemoved of the drop = %v, %v; want table 3 at 1000", removed, err)
		}
		if got := checkpoint(1); got != 3000 {
			t.Errorf("the live flow's checkpoint = %d, want the global 3000", got)
		}
	})
}
