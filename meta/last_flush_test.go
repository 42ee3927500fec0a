package meta_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// onCommand runs fn once, right after the first command named name.
type onCommand struct {
	name  string
	fn    func()
	fired atomic.Bool
}

func (h *onCommand) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *onCommand) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == h.name && !h.fired.Swap(true) {
			h.fn()
		}
		return err
	}
}

func (h *onCommand) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A commit's last_flush_ts goes to the last_flush hash, one field per flow
// of the cycle that still exists, and never to the flow:state hash that
// the checkpoint advance WATCHes: a commit landing between an advance's
// read and its EXEC no longer makes the advance retry. A dropped flow's
// field goes with the flow, and a later commit does not bring it back.
func TestLastFlushBesideTheAdvance(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	rdb := r.Client(t)
	committer := meta.NewStore(rdb, "", nil)
	k := committer.Keys()
	const topic = "flowlog.apply"
	for _, id := range []meta.FlowID{1, 2} {
		info := meta.FlowInfo{CatalogName: "c", FlowName: "f" + string(rune('0'+id)), SourceTableIDs: []uint32{id}}
		if err := committer.CreateFlow(ctx, id, info, nil); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := committer.AcquireLease(ctx, topic, 0, "A")
	if err != nil {
		t.Fatal(err)
	}
	next := int64(0)
	commit := func(ts uint64, flows ...meta.FlowID) {
		t.Helper()
		c := meta.Commit{Leases: []meta.Lease{lease}, LastFlushTS: ts, Flows: flows,
			Partitions: []meta.PartitionCommit{{Topic: topic, Partition: 0, NextOffset: next + 10, CheckFrom: true, From: next}}}
		if next == 0 {
			c.Partitions[0].From = -1
		}
		if err := committer.Commit(ctx, c); err != nil {
			t.Fatalf("commit: %v", err)
		}
		next += 10
	}

	reg := prometheus.NewRegistry()
	hooked := r.Client(t)
	hooked.AddHook(&onCommand{name: "hget", fn: func() { commit(500, 1, 2) }})
	advancer := meta.NewStore(hooked, "", reg)
	if ok, err := advancer.AdvanceCheckpoint(ctx, 1, 400); err != nil || !ok {
		t.Fatalf("advance with a commit between its read and EXEC = %v, %v; want advanced", ok, err)
	}
	if retries := txnRetries(t, reg, "advance_checkpoint"); retries != 0 {
		t.Errorf("the advance retried %v times for a commit that changed nothing it read", retries)
	}
	for id, want := range map[meta.FlowID]uint64{1: 500, 2: 500} {
		if st, err := committer.FlowState(ctx, id); err != nil || st.LastFlushTS != want || id == 1 && st.CheckpointTS != 400 {
			t.Errorf("flow %d state = %+v, %v; want last flush %d", id, st, err, want)
		}
		if v := rdb.HGet(ctx, k.FlowState(id), "last_flush_ts").Val(); v != "" {
			t.Errorf("flow:state:%d holds last_flush_ts %q", id, v)
		}
	}

	info, _, err := committer.FlowInfo(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := committer.DestroyFlow(ctx, 2, info); err != nil {
		t.Fatal(err)
	}
	commit(600, 1, 2)
	if got := rdb.HGetAll(ctx, k.LastFlush()).Val(); len(got) != 1 || got["1"] != "600" {
		t.Errorf("last_flush after dropping flow 2 and a commit naming it = %v, want flow 1 alone at 600", got)
	}
}

// A flow whose last_flush_ts an earlier version left in flow:state reads
// it from there until a commit writes the last_flush hash.
func TestLastFlushLegacyField(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	info, routes := testFlow()
	if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, s.Keys().FlowState(10), "last_flush_ts", "123").Err(); err != nil {
		t.Fatal(err)
	}
	if st, err := s.FlowState(ctx, 10); err != nil || st.LastFlushTS != 123 {
		t.Fatalf("legacy state = %+v, %v; want last flush 123", st, err)
	}
	if err := s.SetLastFlush(ctx, 10, 456); err != nil {
		t.Fatal(err)
	}
	if st, err := s.FlowState(ctx, 10); err != nil || st.LastFlushTS != 456 {
		t.Fatalf("state = %+v, %v; want last flush 456 from the last_flush hash", st, err)
	}
}

// txnRetries is flowlog_redis_txn_retries_total{op} on reg.
func txnRetries(t *testing.T, reg *prometheus.Registry, op string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "flowlog_redis_txn_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
