package meta_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// roundTrips counts the requests a client sends (a pipeline is one) and
// runs after once, after the first pipeline that holds an HMGET (the
// commit's reads).
type roundTrips struct {
	n     atomic.Int64
	after func()
	fired atomic.Bool
}

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		err := next(ctx, cmds)
		if h.after != nil && len(cmds) > 0 && cmds[0].Name() == "hmget" && !h.fired.Swap(true) {
			h.after()
		}
		return err
	}
}

// A commit reads its leases, offsets and flows in one round trip, however
// many partitions and flows the cycle has, and a lease taken between those
// reads and EXEC still fences it: the EXEC fails on the WATCHed lease and
// the retry reads the new holder.
func TestCommitReadsInOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	admin := meta.NewStore(r.Client(t), "", nil)
	const topic = "flowlog.apply"
	const parts, flows = 64, 20
	for i := range flows {
		info := meta.FlowInfo{CatalogName: "c", FlowName: fmt.Sprintf("f%d", i), SourceTableIDs: []uint32{uint32(i + 1)}}
		if err := admin.CreateFlow(ctx, meta.FlowID(i+1), info, nil); err != nil {
			t.Fatal(err)
		}
	}
	hook := &roundTrips{}
	rdb := r.Client(t)
	rdb.AddHook(hook)
	s := meta.NewStore(rdb, "", nil)
	commit := func(from, next int64) meta.Commit {
		var c meta.Commit
		for p := range int32(parts) {
			l, _, err := s.LeaseHolder(ctx, topic, p)
			if err != nil {
				t.Fatal(err)
			}
			c.Leases = append(c.Leases, l)
			c.Partitions = append(c.Partitions, meta.PartitionCommit{Topic: topic, Partition: p, NextOffset: next,
				Checkpoint: uint64(next), HasCheckpoint: true, CheckFrom: true, From: from})
		}
		for i := range flows {
			c.Flows = append(c.Flows, meta.FlowID(i+1))
			c.Metas = append(c.Metas, meta.MetaRef{FlowID: meta.FlowID(i + 1), Path: fmt.Sprintf("m-%d-%d", i, next)})
		}
		c.LastFlushTS = uint64(next)
		return c
	}
	for p := range int32(parts) {
		if _, err := s.AcquireLease(ctx, topic, p, "A"); err != nil {
			t.Fatal(err)
		}
	}

	c := commit(-1, 100)
	hook.n.Store(0)
	if err := s.Commit(ctx, c); err != nil {
		t.Fatalf("commit: %v", err)
	}
	// WATCH, the reads, MULTI..EXEC, UNWATCH on release: a handful,
	// where reading one key at a time took 2 x 64 + 1.
	if n := hook.n.Load(); n > 5 {
		t.Errorf("commit of %d partitions and %d flows took %d round trips, want at most 5", parts, flows, n)
	}

	c = commit(100, 200)
	hook.after = func() {
		if _, err := admin.AcquireLease(ctx, topic, parts-1, "B"); err != nil {
			t.Errorf("take over: %v", err)
		}
	}
	err := s.Commit(ctx, c)
	var lost *meta.LeaseLostError
	if !errors.As(err, &lost) || lost.Lease.Partition != parts-1 || lost.HolderMember != "B" {
		t.Fatalf("commit with a lease taken between its reads and EXEC = %v, want the lease of %d lost to B", err, parts-1)
	}
	for p := range int32(parts) {
		if off, ok, err := admin.Offset(ctx, topic, p); err != nil || !ok || off != 100 {
			t.Fatalf("offset of %d after the fenced commit = %d %v %v, want 100", p, off, ok, err)
		}
	}
	if metas, err := admin.Metas(ctx, 1); err != nil || len(metas) != 1 {
		t.Fatalf("metas after the fenced commit = %v %v, want the first commit's alone", metas, err)
	}
}

// A commit learns which of its flows exist from the flows set, WATCHed as
// one key: a replace landing between its reads and EXEC changes no flow's
// existence and makes it retry nothing, while a drop there fails the EXEC,
// and the retry leaves the dropped flow's last_flush_ts out and still lists
// the cycle's meta under it (docs/FORMAT.md, "The commit transaction").
func TestCommitWatchesTheFlowsSet(t *testing.T) {
	ctx := context.Background()
	r := testenv.StartRedis(t)
	admin := meta.NewStore(r.Client(t), "", nil)
	const topic = "flowlog.apply"
	infos := map[meta.FlowID]meta.FlowInfo{}
	for _, id := range []meta.FlowID{1, 2} {
		infos[id] = meta.FlowInfo{CatalogName: "c", FlowName: fmt.Sprintf("f%d", id), SourceTableIDs: []uint32{uint32(id)}}
		if err := admin.CreateFlow(ctx, id, infos[id], nil); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := admin.AcquireLease(ctx, topic, 0, "A")
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name        string
		between     func() error // between the commit's reads and its EXEC
		wantRetries float64
		wantFlush   map[string]string // last_flush after the commit
	}{
		{"replace", func() error {
			next := infos[1]
			next.SourceTableIDs = []uint32{1, 99}
			return admin.UpdateFlow(ctx, 1, infos[1], next, nil)
		}, 0, map[string]string{"1": "10", "2": "10"}},
		{"drop", func() error { return admin.DestroyFlow(ctx, 2, infos[2]) },
			1, map[string]string{"1": "20"}},
	}
	from := int64(-1)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hook := &roundTrips{}
			hook.after = func() {
				if err := tt.between(); err != nil {
					t.Errorf("%s between the reads and EXEC: %v", tt.name, err)
				}
			}
			rdb := r.Client(t)
			rdb.AddHook(hook)
			reg := prometheus.NewRegistry()
			s := meta.NewStore(rdb, "", reg)
			next := int64(10 * (i + 1))
			path := fmt.Sprintf("v2/meta/%020d-A-%d.meta", next, i)
			c := meta.Commit{Leases: []meta.Lease{lease}, LastFlushTS: uint64(next), Flows: []meta.FlowID{1, 2},
				Partitions: []meta.PartitionCommit{{Topic: topic, Partition: 0, NextOffset: next, CheckFrom: true, From: from}},
				Metas:      []meta.MetaRef{{FlowID: 1, Path: path}, {FlowID: 2, Path: path}}}
			if err := s.Commit(ctx, c); err != nil {
				t.Fatalf("commit: %v", err)
			}
			from = next
			if got := txnRetries(t, reg, "commit"); got != tt.wantRetries {
				t.Errorf("commit retried %v times, want %v", got, tt.wantRetries)
			}
			if got := rdb.HGetAll(ctx, s.Keys().LastFlush()).Val(); !maps.Equal(got, tt.wantFlush) {
				t.Errorf("last_flush = %v, want %v", got, tt.wantFlush)
			}
			for _, id := range []meta.FlowID{1, 2} {
				metas, err := admin.Metas(ctx, id)
				if err != nil || len(metas) != i+1 || metas[i].Path != path {
					t.Errorf("metas of flow %d = %v, %v; want %d, the last %s", id, metas, err, i+1, path)
				}
			}
		})
	}
}
