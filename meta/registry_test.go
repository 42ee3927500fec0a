package meta_test

import (
	"context"
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
