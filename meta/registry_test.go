package meta_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

func flowIDs(fs []*meta.Flow) []meta.FlowID {
	out := []meta.FlowID{}
	for _, f := range fs {
		out = append(out, f.ID)
	}
	return out
}

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client(t)
	s := meta.NewStore(rdb, "", nil)
	r := meta.NewRegistry(s)
	info := func(name string, tables ...uint32) meta.FlowInfo {
		return meta.FlowInfo{CatalogName: "c", FlowName: name, SourceTableIDs: tables}
	}
	route := map[uint32]meta.Route{0: {}}

	steps := []struct {
		name   string
		change func() error
		tables map[int64][]meta.FlowID
		all    []meta.FlowID
	}{
		{"empty", func() error { return nil },
			map[int64][]meta.FlowID{1: {}}, []meta.FlowID{}},
		{"create two overlapping", func() error {
			if err := s.CreateFlow(ctx, 2, info("b", 2, 3), route); err != nil {
				return err
			}
			return s.CreateFlow(ctx, 1, info("a", 1, 2), route)
		}, map[int64][]meta.FlowID{1: {1}, 2: {1, 2}, 3: {2}, 4: {}, -1: {}, 1 << 32: {}}, []meta.FlowID{1, 2}},
		{"replace a with other tables", func() error {
			return s.UpdateFlow(ctx, 1, info("a", 1, 2), info("a", 4), route)
		}, map[int64][]meta.FlowID{1: {}, 2: {2}, 3: {2}, 4: {1}}, []meta.FlowID{1, 2}},
		{"drop b", func() error { return s.DestroyFlow(ctx, 2, info("b", 2, 3)) },
			map[int64][]meta.FlowID{2: {}, 3: {}, 4: {1}}, []meta.FlowID{1}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := st.change(); err != nil {
				t.Fatalf("change: %v", err)
			}
			if err := r.Refresh(ctx); err != nil {
				t.Fatalf("Refresh: %v", err)
			}
			for table, want := range st.tables {
				if got := flowIDs(r.ForTable(table)); !slices.Equal(got, want) {
					t.Errorf("ForTable(%d) = %v, want %v", table, got, want)
				}
			}
			if got := flowIDs(r.Flows()); !slices.Equal(got, st.all) {
				t.Errorf("Flows = %v, want %v", got, st.all)
			}
		})
	}

	t.Run("status and lookup", func(t *testing.T) {
		if err := s.SetFlowFatal(ctx, 1, "upload failed"); err != nil {
			t.Fatal(err)
		}
		if err := r.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		f, ok := r.Flow(1)
		if !ok || f.Status != meta.StatusFatal || f.Info.FlowName != "a" {
			t.Errorf("Flow(1) = %+v, %v; want fatal flow a", f, ok)
		}
		if _, ok := r.Flow(2); ok {
			t.Errorf("Flow(2) found after drop")
		}
	})

	t.Run("concurrent readers", func(t *testing.T) {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if fs := r.ForTable(4); len(fs) != 1 || fs[0].ID != 1 {
						t.Errorf("ForTable(4) during refresh = %v", flowIDs(fs))
						return
					}
				}
			})
		}
		for range 20 {
			if err := r.Refresh(ctx); err != nil {
				t.Error(err)
			}
		}
		close(stop)
		wg.Wait()
	})
}

// Tables read by the same flows share one FlowSet, and a refresh that
// leaves a table's flows as they were keeps its set (temp files keyed by it
// go on receiving its events), while one that changes them makes a new one.
func TestRegistryFlowSets(t *testing.T) {
	ctx := context.Background()
	s := meta.NewStore(testenv.StartRedis(t).Client(t), "", nil)
	r := meta.NewRegistry(s)
	info := func(name string, tables ...uint32) meta.FlowInfo {
		return meta.FlowInfo{CatalogName: "c", FlowName: name, SourceTableIDs: tables}
	}
	route := map[uint32]meta.Route{0: {}}
	refresh := func() {
		t.Helper()
		if err := r.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateFlow(ctx, 1, info("a", 1, 2, 3), route); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateFlow(ctx, 2, info("b", 2, 3), route); err != nil {
		t.Fatal(err)
	}
	refresh()
	s1, s2, s3 := r.SetForTable(1), r.SetForTable(2), r.SetForTable(3)
	if s2 != s3 || s1 == s2 || !slices.Equal(s2.IDs, []meta.FlowID{1, 2}) || !slices.Equal(s1.IDs, []meta.FlowID{1}) {
		t.Fatalf("sets of tables 1, 2, 3: %v %v %v, want {1} and one shared {1,2}", s1.IDs, s2.IDs, s3.IDs)
	}
	if r.SetForTable(4) != nil || !slices.Equal(r.AllSet().IDs, []meta.FlowID{1, 2}) {
		t.Fatalf("set of an unread table %v, of every flow %v", r.SetForTable(4), r.AllSet().IDs)
	}
	if err := s.CreateFlow(ctx, 3, info("c", 9), route); err != nil {
		t.Fatal(err)
	}
	refresh()
	if r.SetForTable(1) != s1 || r.SetForTable(2) != s2 {
		t.Fatal("a create of an unrelated flow replaced the sets of tables it does not read")
	}
	if got := r.AllSet().IDs; !slices.Equal(got, []meta.FlowID{1, 2, 3}) {
		t.Fatalf("set of every flow after the create: %v", got)
	}
	if err := s.UpdateFlow(ctx, 2, info("b", 2, 3), info("b", 3), route); err != nil {
		t.Fatal(err)
	}
	refresh()
	if got := r.SetForTable(2); got == s2 || !slices.Equal(got.IDs, []meta.FlowID{1}) || got != r.SetForTable(1) {
		t.Fatalf("table 2 after b dropped it: set %v (shared with table 1: %v)", got.IDs, got == r.SetForTable(1))
	}
	if r.SetForTable(3) != s2 {
		t.Fatal("table 3 is still read by a and b: its set must stay")
	}
}

// A refresh reads the infos and coverage seqs of many flows in batches of
// keys: every flow of a registry larger than one batch is loaded with its
// own definition, status and seq, and a member of the flows set whose info
// is gone is left out.
func TestRegistryRefreshManyFlows(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t).Client(t)
	s := meta.NewStore(rdb, "", nil)
	const n = 2100 // more than two batches
	p := rdb.Pipeline()
	for id := range meta.FlowID(n) {
		id++
		p.SAdd(ctx, s.Keys().Flows(), fmt.Sprint(id))
		if id%7 == 0 {
			continue // listed, its info gone: dropped meanwhile
		}
		info := fmt.Sprintf(`{"catalog_name":"c","flow_name":"f%d","source_table_ids":[%d]}`, id, id)
		p.Set(ctx, s.Keys().FlowInfo(id), info, 0)
		p.Set(ctx, s.Keys().CoverageSeq(id), fmt.Sprint(id*3), 0)
		if id%2 == 0 {
			p.HSet(ctx, s.Keys().FlowState(id), "status", meta.StatusFatal)
		}
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	r := meta.NewRegistry(s)
	if err := r.Refresh(ctx); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	want := n - n/7
	if got := len(r.Flows()); got != want {
		t.Fatalf("%d flows loaded, want %d", got, want)
	}
	for _, f := range r.Flows() {
		status := ""
		if f.ID%2 == 0 {
			status = meta.StatusFatal
		}
		if f.ID%7 == 0 || f.Info.FlowName != fmt.Sprintf("f%d", f.ID) || f.CoverageSeq != uint64(f.ID)*3 ||
			f.Status != status || !slices.Equal(flowIDs(r.ForTable(int64(f.ID))), []meta.FlowID{f.ID}) {
			t.Fatalf("flow %d = %+v (status %q), want its own info, seq %d, status %q", f.ID, f.Info, f.Status, f.ID*3, status)
		}
	}
}
