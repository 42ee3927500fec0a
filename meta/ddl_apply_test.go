package meta_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"

	"github.com/flowlog/flowlog/meta"
)

const ddlTopic = "flowlog.ddl"

func newDDL(op, name string, tables ...uint32) meta.DDL {
	return meta.DDL{Op: op, Flow: meta.FlowInfo{FlowName: name, SourceTableIDs: tables}}
}

func at(next int64) meta.DDLPosition {
	return meta.DDLPosition{Topic: ddlTopic, Partition: 0, NextOffset: next}
}

// apply applies d and fails the test on an error.
func apply(t *testing.T, s *meta.Store, d meta.DDL, pos meta.DDLPosition) meta.Applied {
	t.Helper()
	res, err := s.ApplyDDL(context.Background(), d, pos)
	if err != nil {
		t.Fatalf("ApplyDDL(%s %s @%d): %v", d.Op, d.Flow.FlowName, pos.NextOffset, err)
	}
	return res
}

func assertOffset(t *testing.T, s *meta.Store, want int64) {
	t.Helper()
	got, ok, err := s.DDLOffset(context.Background(), ddlTopic, 0)
	if err != nil || !ok || got != want {
		t.Fatalf("DDLOffset = %d, %v, %v; want %d", got, ok, err, want)
	}
}

func TestApplyDDL(t *testing.T) {
	ctx := context.Background()
	base := "flowlog:{flowlog}:"

	t.Run("exactly once", func(t *testing.T) {
		s, rdb := newStore(t)
		d := newDDL(meta.OpCreate, "f", 1, 2)
		res := apply(t, s, d, at(1))
		if !res.Changed || res.Skipped || res.FlowID != 1 || res.Catalog != "default" || res.Name != "f" {
			t.Fatalf("first apply = %+v", res)
		}
		before := dump(t, rdb, base)
		if before["flow:seq"] != "1" || before["ddl:offset:flowlog.ddl:0"] != "1" {
			t.Fatalf("seq/offset after create: %v / %v", before["flow:seq"], before["ddl:offset:flowlog.ddl:0"])
		}
		for _, d := range []meta.DDL{d, newDDL(meta.OpDrop, "f")} {
			res = apply(t, s, d, at(1)) // a redelivery of offset 0, whatever it says
			if !res.Skipped || res.Changed {
				t.Fatalf("redelivery = %+v, want skipped", res)
			}
		}
		assertDump(t, dump(t, rdb, base), before)
	})

	t.Run("create existing", func(t *testing.T) {
		s, _ := newStore(t)
		apply(t, s, newDDL(meta.OpCreate, "f", 1), at(1))
		info, _, _ := s.FlowInfo(ctx, 1)

		d := newDDL(meta.OpCreate, "f", 2)
		d.IfNotExists = true
		if res := apply(t, s, d, at(2)); res.Changed || res.Skipped || res.FlowID != 1 {
			t.Fatalf("if_not_exists = %+v", res)
		}
		assertOffset(t, s, 2)

		d.IfNotExists = false
		if _, err := s.ApplyDDL(ctx, d, at(3)); !errors.Is(err, meta.ErrFlowAlreadyExists) {
			t.Fatalf("err = %v, want ErrFlowAlreadyExists", err)
		}
		assertOffset(t, s, 2) // a rejected DDL writes nothing ...
		if err := s.AdvanceDDLOffset(ctx, at(3)); err != nil {
			t.Fatal(err)
		}
		assertOffset(t, s, 3) // ... until the caller advances it
		if err := s.AdvanceDDLOffset(ctx, at(2)); err != nil {
			t.Fatal(err)
		}
		assertOffset(t, s, 3) // never backwards
		if got, _, _ := s.FlowInfo(ctx, 1); !reflect.DeepEqual(got, info) {
			t.Fatalf("info changed: %+v", got)
		}
	})

	t.Run("replace keeps id and created time", func(t *testing.T) {
		s, rdb := newStore(t)
		apply(t, s, newDDL(meta.OpCreate, "other", 9), at(1))
		apply(t, s, newDDL(meta.OpCreate, "f", 1, 2), at(2))
		before, _, _ := s.FlowInfo(ctx, 2)
		d := newDDL(meta.OpReplace, "f", 2, 3)
		d.Flow.Comment = "v2"
		d.Routes = map[string]meta.Route{"0": {Peer: meta.Peer{ID: 5, Addr: "n5:1"}}}
		res := apply(t, s, d, at(3))
		if !res.Changed || res.FlowID != 2 {
			t.Fatalf("replace = %+v", res)
		}
		after, _, _ := s.FlowInfo(ctx, 2)
		if !after.CreatedTime.Equal(before.CreatedTime) || after.UpdatedTime.Before(before.UpdatedTime) || after.Comment != "v2" {
			t.Fatalf("after replace: %+v (before %+v)", after, before)
		}
		if !reflect.DeepEqual(after.FlownodeIDs, map[uint32]uint64{0: 5}) {
			t.Fatalf("flownode_ids = %v", after.FlownodeIDs)
		}
		got := dump(t, rdb, base)
		r := routeJSON(5, "n5:1")
		for key, want := range map[string]any{
			"table:1":    nil,
			"table:2":    map[string]string{"5/2/0": r},
			"table:3":    map[string]string{"5/2/0": r},
			"flownode:0": []string{"1/0"}, // flow "other" only: f's default partition 0 is gone
			"flownode:5": []string{"2/0"},
			"flow:seq":   "2",
		} {
			if !reflect.DeepEqual(got[key], want) {
				t.Fatalf("%s = %v, want %v", key, got[key], want)
			}
		}

		id := meta.FlowID(7)
		d.FlowID = &id
		if _, err := s.ApplyDDL(ctx, d, at(4)); !errors.Is(err, meta.ErrDifferentFlowID) {
			t.Fatalf("replace with another flow_id: err = %v", err)
		}
	})

	t.Run("replace of a missing flow creates it", func(t *testing.T) {
		s, _ := newStore(t)
		res := apply(t, s, newDDL(meta.OpReplace, "f", 1), at(1))
		if !res.Changed || res.FlowID != 1 {
			t.Fatalf("replace = %+v", res)
		}
		if flows, _ := s.TableFlows(ctx, 1); len(flows) != 1 || flows[0].FlowID != 1 {
			t.Fatalf("TableFlows(1) = %v", flows)
		}
	})

	t.Run("drop twice", func(t *testing.T) {
		s, rdb := newStore(t)
		apply(t, s, newDDL(meta.OpCreate, "f", 1), at(1))
		if res := apply(t, s, newDDL(meta.OpDrop, "f"), at(2)); !res.Changed || res.FlowID != 1 {
			t.Fatalf("drop = %+v", res)
		}
		if res := apply(t, s, newDDL(meta.OpDrop, "f"), at(3)); res.Changed || res.Skipped {
			t.Fatalf("second drop = %+v", res)
		}
		assertDump(t, dump(t, rdb, base), map[string]any{"flow:seq": "1", "ddl:offset:flowlog.ddl:0": "3"})
	})

	t.Run("resume", func(t *testing.T) {
		s, rdb := newStore(t)
		if _, err := s.ApplyDDL(ctx, newDDL(meta.OpResume, "f"), at(1)); !errors.Is(err, meta.ErrFlowNotFound) {
			t.Fatalf("resume missing: err = %v", err)
		}
		apply(t, s, newDDL(meta.OpCreate, "f", 1), at(1))
		if res := apply(t, s, newDDL(meta.OpResume, "f"), at(2)); res.Changed {
			t.Fatalf("resume of active flow = %+v", res)
		}
		if err := s.SetFlowFatal(ctx, 1, "boom"); err != nil {
			t.Fatal(err)
		}
		if res := apply(t, s, newDDL(meta.OpResume, "f"), at(3)); !res.Changed {
			t.Fatalf("resume of fatal flow = %+v", res)
		}
		if got := rdb.HGetAll(ctx, s.Keys().FlowState(1)).Val(); !reflect.DeepEqual(got, map[string]string{"status": "active"}) {
			t.Fatalf("state = %v", got)
		}
		assertOffset(t, s, 3)
	})

	t.Run("flow ids", func(t *testing.T) {
		s, rdb := newStore(t)
		d := newDDL(meta.OpCreate, "explicit", 1)
		id := meta.FlowID(5)
		d.FlowID = &id
		if res := apply(t, s, d, at(1)); res.FlowID != 5 {
			t.Fatalf("explicit id = %+v", res)
		}
		if seq := rdb.Get(ctx, s.Keys().FlowSeq()).Val(); seq != "5" {
			t.Fatalf("flow:seq = %s, want 5", seq)
		}
		rdb.Set(ctx, s.Keys().FlowSeq(), "3", 0) // as if ids 4 and 5 were handed out elsewhere
		var got []meta.FlowID
		for i, name := range []string{"a", "b", "c"} {
			got = append(got, apply(t, s, newDDL(meta.OpCreate, name, 1), at(int64(i+2))).FlowID)
		}
		if !reflect.DeepEqual(got, []meta.FlowID{4, 6, 7}) {
			t.Fatalf("ids = %v, want [4 6 7] (5 is taken)", got)
		}
		all, _ := s.AllFlows(ctx)
		if !reflect.DeepEqual(all, []meta.FlowID{4, 5, 6, 7}) {
			t.Fatalf("AllFlows = %v", all)
		}
	})

	t.Run("invalid ddl writes nothing", func(t *testing.T) {
		s, rdb := newStore(t)
		_, err := s.ApplyDDL(ctx, newDDL(meta.OpCreate, "../x", 1), at(1))
		var ve *meta.ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("err = %v, want *ValidationError", err)
		}
		assertDump(t, dump(t, rdb, base), map[string]any{})
	})
}

// TestApplyDDLRace races a create and a replace of one name from two stores
// (two instances) and checks that every round ends in exactly one
// consistent flow: the replace's definition, under a fresh id.
func TestApplyDDLRace(t *testing.T) {
	ctx := context.Background()
	r := startRedis(t)
	a := meta.NewStore(r.Client(t), "", nil)
	b := meta.NewStore(r.Client(t), "", nil)
	const rounds = 200
	for i := range rounds {
		var wg sync.WaitGroup
		var errA, errB error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, errA = a.ApplyDDL(ctx, newDDL(meta.OpCreate, "race", 1), meta.DDLPosition{Topic: "ta", NextOffset: int64(i + 1)})
		}()
		go func() {
			defer wg.Done()
			_, errB = b.ApplyDDL(ctx, newDDL(meta.OpReplace, "race", 2, 3), meta.DDLPosition{Topic: "tb", NextOffset: int64(i + 1)})
		}()
		wg.Wait()
		if errB != nil || (errA != nil && !errors.Is(errA, meta.ErrFlowAlreadyExists)) {
			t.Fatalf("round %d: create err %v, replace err %v", i, errA, errB)
		}
		checkRaceRound(t, a, meta.FlowID(i+1))
		if _, err := a.ApplyDDL(ctx, newDDL(meta.OpDrop, "race"), meta.DDLPosition{Topic: "tc", NextOffset: int64(i + 1)}); err != nil {
			t.Fatalf("round %d: drop: %v", i, err)
		}
		if all, _ := a.AllFlows(ctx); len(all) != 0 {
			t.Fatalf("round %d: flows after drop = %v", i, all)
		}
	}
}

func checkRaceRound(t *testing.T, s *meta.Store, wantID meta.FlowID) {
	t.Helper()
	ctx := context.Background()
	id, ok, err := s.FlowIDByName(ctx, "default", "race")
	if err != nil || !ok || id != wantID {
		t.Fatalf("name -> %d, %v, %v; want %d", id, ok, err, wantID)
	}
	if seq := s.Client().Get(ctx, s.Keys().FlowSeq()).Val(); seq != fmt.Sprint(wantID) {
		t.Fatalf("flow:seq = %s, want %d", seq, wantID)
	}
	info, ok, err := s.FlowInfo(ctx, id)
	if err != nil || !ok || !slices.Equal(info.SourceTableIDs, []uint32{2, 3}) || info.FlowName != "race" {
		t.Fatalf("info = %+v, %v, %v", info, ok, err)
	}
	all, err := s.AllFlows(ctx)
	if err != nil || !reflect.DeepEqual(all, []meta.FlowID{id}) {
		t.Fatalf("AllFlows = %v, %v", all, err)
	}
	want := []meta.TableRoute{{FlownodeID: 0, FlowID: id, PartitionID: 0, Route: meta.Route{}}}
	for table, w := range map[uint32][]meta.TableRoute{1: {}, 2: want, 3: want} {
		got, err := s.TableFlows(ctx, table)
		if err != nil || !reflect.DeepEqual(got, w) {
			t.Fatalf("TableFlows(%d) = %v, %v; want %v", table, got, err, w)
		}
	}
	if got, _ := s.FlownodeFlows(ctx, 0); !reflect.DeepEqual(got, []meta.FlowPartition{{FlowID: id}}) {
		t.Fatalf("FlownodeFlows(0) = %v", got)
	}
}
