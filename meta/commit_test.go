package meta_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// keysUnder lists every key under base (KEYS is fine in a test), sorted.
func keysUnder(t *testing.T, rdb *redis.Client, base string) []string {
	t.Helper()
	ks, err := rdb.Keys(context.Background(), base+"*").Result()
	if err != nil {
		t.Fatalf("keys: %v", err)
	}
	slices.Sort(ks)
	return ks
}

func TestCommitLeaseFencing(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client(t)
	s := meta.NewStore(rdb, "", nil)
	k := s.Keys()
	const topic = "flowlog.apply"
	if err := s.CreateFlow(ctx, 7, meta.FlowInfo{CatalogName: "c", FlowName: "f", SourceTableIDs: []uint32{1}}, map[uint32]meta.Route{0: {}}); err != nil {
		t.Fatalf("create flow: %v", err)
	}

	a, err := s.AcquireLease(ctx, topic, 0, "A")
	if err != nil || a.Epoch != 1 || a.Member != "A" {
		t.Fatalf("A acquire = %+v, %v; want epoch 1", a, err)
	}
	a1, err := s.AcquireLease(ctx, topic, 1, "A")
	if err != nil || a1.Epoch != 1 {
		t.Fatalf("A acquire p1 = %+v, %v", a1, err)
	}
	b, err := s.AcquireLease(ctx, topic, 0, "B")
	if err != nil || b.Epoch != 2 || b.Member != "B" {
		t.Fatalf("B acquire = %+v, %v; want epoch 2", b, err)
	}
	before := keysUnder(t, rdb, k.Base())

	commitOf := func(leases ...meta.Lease) meta.Commit {
		c := meta.Commit{Leases: leases, LastFlushTS: 500, Flows: []meta.FlowID{7, 99}}
		for _, l := range leases {
			c.Partitions = append(c.Partitions, meta.PartitionCommit{Topic: topic, Partition: l.Partition,
				NextOffset: 100 + int64(l.Partition), Checkpoint: 400 + uint64(l.Partition), HasCheckpoint: l.Partition == 0})
		}
		c.Metas = []meta.MetaRef{{FlowID: 7, Path: "p/c/f/v1/backupmeta/x-" + leases[0].Member + ".meta", MinResolvedTS: 400}}
		return c
	}

	t.Run("zombie A is refused and writes nothing", func(t *testing.T) {
		err := s.Commit(ctx, commitOf(a, a1))
		var lost *meta.LeaseLostError
		if !errors.Is(err, meta.ErrLeaseLost) || !errors.As(err, &lost) {
			t.Fatalf("Commit = %v, want ErrLeaseLost", err)
		}
		if lost.Lease != a || lost.HolderMember != "B" || lost.HolderEpoch != 2 {
			t.Errorf("LeaseLostError = %+v", lost)
		}
		if after := keysUnder(t, rdb, k.Base()); !reflect.DeepEqual(after, before) {
			t.Errorf("keys after refused commit:\n%v\nwant\n%v", after, before)
		}
	})

	t.Run("partition without lease is refused", func(t *testing.T) {
		c := commitOf(b)
		c.Partitions = append(c.Partitions, meta.PartitionCommit{Topic: topic, Partition: 5, NextOffset: 1})
		if err := s.Commit(ctx, c); err == nil {
			t.Fatal("Commit of a partition without lease succeeded")
		}
		if after := keysUnder(t, rdb, k.Base()); !reflect.DeepEqual(after, before) {
			t.Errorf("keys changed: %v", after)
		}
	})

	t.Run("owner B commits", func(t *testing.T) {
		if err := s.Commit(ctx, commitOf(b)); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		for key, want := range map[string]string{k.Offset(topic, 0): "100", k.Ckpt(topic, 0): "400"} {
			if got, err := rdb.Get(ctx, key).Result(); err != nil || got != want {
				t.Errorf("%s = %q, %v; want %q", key, got, err, want)
			}
		}
		if off, ok, err := s.Offset(ctx, topic, 0); err != nil || !ok || off != 100 {
			t.Errorf("Offset = %d, %v, %v", off, ok, err)
		}
		if _, ok, err := s.Offset(ctx, topic, 1); err != nil || ok {
			t.Errorf("Offset p1 = %v, %v; want absent", ok, err)
		}
		if st, err := s.FlowState(ctx, 7); err != nil || st.LastFlushTS != 500 {
			t.Errorf("flow 7 state = %+v, %v; want last_flush_ts 500", st, err)
		}
		if n := rdb.Exists(ctx, k.FlowState(99)).Val(); n != 0 {
			t.Errorf("state of missing flow 99 was created")
		}
		metas, err := s.Metas(ctx, 7)
		want := []meta.MetaRef{{FlowID: 7, Path: "p/c/f/v1/backupmeta/x-B.meta", MinResolvedTS: 400}}
		if err != nil || !reflect.DeepEqual(metas, want) {
			t.Errorf("Metas = %+v, %v; want %+v", metas, err, want)
		}
		cps, idle, err := s.PartitionCheckpoints(ctx, topic, []int32{0, 1, 2})
		if err != nil || !reflect.DeepEqual(cps, map[int32]uint64{0: 400}) || len(idle) != 0 {
			t.Errorf("PartitionCheckpoints = %v, idle %v, %v", cps, idle, err)
		}
	})

	t.Run("release", func(t *testing.T) {
		if err := s.ReleaseLease(ctx, a); err != nil {
			t.Fatalf("release stale lease: %v", err)
		}
		if h, ok, err := s.LeaseHolder(ctx, topic, 0); err != nil || !ok || h != b {
			t.Fatalf("holder after stale release = %+v, %v, %v; want B", h, ok, err)
		}
		if err := s.ReleaseLease(ctx, b); err != nil {
			t.Fatalf("release: %v", err)
		}
		if h, ok, err := s.LeaseHolder(ctx, topic, 0); err != nil || ok || h.Epoch != 2 {
			t.Fatalf("holder after release = %+v, %v, %v; want none at epoch 2", h, ok, err)
		}
		if err := s.Commit(ctx, commitOf(b)); !errors.Is(err, meta.ErrLeaseLost) {
			t.Fatalf("commit after release = %v, want ErrLeaseLost", err)
		}
		c, err := s.AcquireLease(ctx, topic, 0, "C")
		if err != nil || c.Epoch != 3 {
			t.Fatalf("acquire after release = %+v, %v; want epoch 3", c, err)
		}
	})
}

func TestMetasOrder(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client(t)
	s := meta.NewStore(rdb, "x", nil)
	l, err := s.AcquireLease(ctx, "t", 0, "m")
	if err != nil {
		t.Fatal(err)
	}
	big := uint64(431656320867237891) // a real TSO, past 2^53
	cycles := [][]meta.MetaRef{
		{{FlowID: 1, Path: "b", MinResolvedTS: 30}, {FlowID: 2, Path: "z", MinResolvedTS: 1}},
		{{FlowID: 1, Path: "a", MinResolvedTS: 30}, {FlowID: 1, Path: "c", MinResolvedTS: 10}},
		{{FlowID: 1, Path: "d", MinResolvedTS: big}, {FlowID: 1, Path: "c", MinResolvedTS: 10}}, // retried path: listed once
	}
	for i, ms := range cycles {
		if err := s.Commit(ctx, meta.Commit{Leases: []meta.Lease{l}, Metas: ms}); err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	got, err := s.Metas(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, m := range got {
		paths = append(paths, m.Path)
	}
	if want := []string{"c", "a", "b", "d"}; !reflect.DeepEqual(paths, want) {
		t.Fatalf("Metas paths = %v, want %v", paths, want)
	}
	if d := got[3].MinResolvedTS; d > big+64 || d+64 < big {
		t.Errorf("big ts came back as %d, want %d within float64 precision", d, big)
	}
	if none, err := s.Metas(ctx, 3); err != nil || len(none) != 0 {
		t.Errorf("Metas of flow without metas = %v, %v", none, err)
	}
}

// A commit is a compare-and-set on each partition's offset: if Redis lost
// the replica's last commit (offset rewound) or the whole key, the next
// commit is refused as fenced and writes nothing, so it cannot skip the
// records in between. A commit retried after it went through passes.
func TestCommitRefusesAMovedOffset(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client(t)
	s := meta.NewStore(rdb, "", nil)
	k := s.Keys()
	const topic = "flowlog.apply"
	l, err := s.AcquireLease(ctx, topic, 0, "A")
	if err != nil {
		t.Fatal(err)
	}
	commit := func(from, next int64, meta_ string) error {
		return s.Commit(ctx, meta.Commit{Leases: []meta.Lease{l},
			Partitions: []meta.PartitionCommit{{Topic: topic, Partition: 0, NextOffset: next, CheckFrom: true, From: from}},
			Metas:      []meta.MetaRef{{FlowID: 7, Path: meta_, MinResolvedTS: uint64(next)}}})
	}
	offset := func() string { v, _ := rdb.Get(ctx, k.Offset(topic, 0)).Result(); return v }
	metas := func() int64 { return rdb.ZCard(ctx, k.Metas(7)).Val() }

	if err := commit(5, 100, "m1"); !errors.Is(err, meta.ErrLeaseLost) {
		t.Fatalf("first commit from 5 with no stored offset = %v, want fenced", err)
	}
	if err := commit(-1, 100, "m1"); err != nil {
		t.Fatalf("first commit from an absent offset: %v", err)
	}
	if err := commit(100, 200, "m2"); err != nil {
		t.Fatalf("second commit: %v", err)
	}
	if err := commit(100, 200, "m2"); err != nil {
		t.Fatalf("second commit retried after it went through: %v", err)
	}

	for _, tc := range []struct {
		name   string
		lose   func() error
		stored int64
	}{
		{"offset rewound", func() error { return rdb.Set(ctx, k.Offset(topic, 0), "100", 0).Err() }, 100},
		{"offset key lost", func() error { return rdb.Del(ctx, k.Offset(topic, 0)).Err() }, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.lose(); err != nil {
				t.Fatal(err)
			}
			before, n := offset(), metas()
			err := commit(200, 300, "m3-"+tc.name)
			var moved *meta.OffsetMovedError
			if !errors.Is(err, meta.ErrLeaseLost) || !errors.As(err, &moved) || moved.From != 200 || moved.Stored != tc.stored {
				t.Fatalf("commit after the loss = %v, want fenced (*OffsetMovedError from 200, stored %d)", err, tc.stored)
			}
			if offset() != before || metas() != n {
				t.Errorf("refused commit wrote: offset %q (was %q), %d metas (was %d)", offset(), before, metas(), n)
			}
		})
	}
}
