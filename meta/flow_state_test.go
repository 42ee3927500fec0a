package meta_test

import (
	"context"
	"errors"
	"testing"

	"github.com/flowlog/flowlog/meta"
)

func TestFlowState(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	info, routes := testFlow()
	if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
		t.Fatal(err)
	}
	stateKey := s.Keys().FlowState(10)

	t.Run("fatal then active", func(t *testing.T) {
		if err := s.SetFlowFatal(ctx, 10, "upload failed 30 times"); err != nil {
			t.Fatal(err)
		}
		st, err := s.FlowState(ctx, 10)
		if err != nil || st.Status != meta.StatusFatal || st.Error != "upload failed 30 times" {
			t.Fatalf("FlowState = %+v, %v", st, err)
		}
		if err := s.SetFlowActive(ctx, 10); err != nil {
			t.Fatal(err)
		}
		if got := rdb.HGetAll(ctx, stateKey).Val(); got["status"] != "active" || len(got) != 1 {
			t.Fatalf("state hash = %v, want only status=active", got)
		}
	})

	t.Run("checkpoint never moves backwards", func(t *testing.T) {
		for _, c := range []struct {
			ts       uint64
			advanced bool
			stored   uint64
		}{{100, true, 100}, {50, false, 100}, {100, false, 100}, {101, true, 101}} {
			ok, err := s.AdvanceCheckpoint(ctx, 10, c.ts)
			if err != nil || ok != c.advanced {
				t.Fatalf("AdvanceCheckpoint(%d) = %v, %v; want %v", c.ts, ok, err, c.advanced)
			}
			st, err := s.FlowState(ctx, 10)
			if err != nil || st.CheckpointTS != c.stored {
				t.Fatalf("after %d: state %+v, %v; want checkpoint %d", c.ts, st, err, c.stored)
			}
		}
	})

	t.Run("last flush", func(t *testing.T) {
		if err := s.SetLastFlush(ctx, 10, 777); err != nil {
			t.Fatal(err)
		}
		if st, err := s.FlowState(ctx, 10); err != nil || st.LastFlushTS != 777 {
			t.Fatalf("FlowState = %+v, %v", st, err)
		}
	})

	t.Run("missing flow", func(t *testing.T) {
		if _, err := s.FlowState(ctx, 99); !errors.Is(err, meta.ErrFlowNotFound) {
			t.Fatalf("FlowState(99) err = %v", err)
		}
		for name, err := range map[string]error{
			"fatal":  s.SetFlowFatal(ctx, 99, "x"),
			"active": s.SetFlowActive(ctx, 99),
			"flush":  s.SetLastFlush(ctx, 99, 1),
		} {
			if !errors.Is(err, meta.ErrFlowNotFound) {
				t.Fatalf("%s on missing flow: err = %v", name, err)
			}
		}
		ok, err := s.AdvanceCheckpoint(ctx, 99, 5)
		if err != nil || ok {
			t.Fatalf("AdvanceCheckpoint(missing) = %v, %v", ok, err)
		}
		if n := rdb.Exists(ctx, s.Keys().FlowState(99)).Val(); n != 0 {
			t.Fatal("state key created for a missing flow")
		}
	})
}
