package meta_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// One member holds the advance turn at a time, for the TTL; it may take it
// again while it holds it, and once the TTL is over the next member
// takes it.
func TestAdvanceTurn(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	take := func(member string, ttl time.Duration) bool {
		t.Helper()
		ok, err := s.TakeAdvanceTurn(ctx, member, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !take("a", time.Hour) {
		t.Fatal("a did not get a free turn")
	}
	if !take("a", time.Hour) {
		t.Fatal("a lost the turn it holds to itself")
	}
	if take("b", time.Hour) {
		t.Fatal("b took the turn a holds")
	}
	if ttl := rdb.PTTL(ctx, s.Keys().AdvanceTurn()).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("turn TTL = %v, want at most the hour it was taken for", ttl)
	}
	if err := rdb.PExpire(ctx, s.Keys().AdvanceTurn(), 20*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !take("b", time.Hour) {
		if time.Now().After(deadline) {
			t.Fatal("b never took the turn after a's expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if take("a", time.Hour) {
		t.Fatal("a took the turn b holds now")
	}
}

// Advances from many replicas at once, with commits of every flow between
// them, leave each flow's checkpoint and the global one at the largest
// value any of them advanced to, and no reader ever sees one move back.
func TestAdvanceCheckpointsConcurrently(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	var ids []meta.FlowID
	for i := range 5 {
		id := meta.FlowID(i + 1)
		info := meta.FlowInfo{CatalogName: "c", FlowName: fmt.Sprintf("f%d", i), SourceTableIDs: []uint32{uint32(i + 1)}}
		if err := s.CreateFlow(ctx, id, info, nil); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	lease, err := s.AcquireLease(ctx, "apply", 0, "m")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	backwards := make(chan string, 1)
	var readers sync.WaitGroup
	readers.Go(func() {
		last := map[meta.FlowID]uint64{}
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, id := range ids {
				st, err := s.FlowState(ctx, id)
				if err != nil {
					continue
				}
				if st.CheckpointTS < last[id] {
					select {
					case backwards <- fmt.Sprintf("flow %d went from %d to %d", id, last[id], st.CheckpointTS):
					default:
					}
				}
				last[id] = st.CheckpointTS
			}
		}
	})
	const replicas, rounds = 4, 25
	var wg sync.WaitGroup
	for r := range replicas {
		wg.Go(func() {
			for i := range rounds {
				ts := uint64(1000 + i*replicas + r)
				if _, _, err := s.AdvanceCheckpoints(ctx, ids, ts, 1<<62); err != nil {
					t.Errorf("replica %d advance to %d: %v", r, ts, err)
					return
				}
				if err := s.Commit(ctx, meta.Commit{Leases: []meta.Lease{lease}, Flows: ids, LastFlushTS: ts}); err != nil {
					t.Errorf("commit: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	select {
	case msg := <-backwards:
		t.Fatal(msg)
	default:
	}
	want := uint64(1000 + (rounds-1)*replicas + replicas - 1)
	for _, id := range ids {
		if st, err := s.FlowState(ctx, id); err != nil || st.CheckpointTS != want {
			t.Errorf("flow %d = %+v, %v; want checkpoint %d", id, st, err, want)
		}
	}
	if g, ok, err := s.GlobalCheckpointTS(ctx); err != nil || !ok || g != want {
		t.Errorf("global checkpoint = %d %v %v, want %d", g, ok, err, want)
	}
	if n := rdb.HLen(ctx, s.Keys().LastFlush()).Val(); n != int64(len(ids)) {
		t.Errorf("last_flush holds %d flows, want %d", n, len(ids))
	}
}
