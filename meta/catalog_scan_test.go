package meta_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/meta"
)

// scanned collects what ScanCatalog hands over as a CatalogState.
func scanned(t *testing.T, s *meta.Store, id meta.FlowID, during func(heads int)) (meta.CatalogState, int) {
	t.Helper()
	var got meta.CatalogState
	heads := 0
	st, err := s.ScanCatalog(context.Background(), id, meta.CatalogVisitor{
		Head: func(st meta.CatalogState) error {
			heads++
			got = st
			got.Windows = map[uint32]meta.Window{}
			return nil
		},
		Window: func(w meta.Window) error {
			if during != nil {
				during(heads)
			}
			got.Windows[w.TableID] = w
			return nil
		},
		History: func(w meta.Window) error { got.History = append(got.History, w); return nil },
		Pending: func(p meta.PendingStep) error { got.Pending = append(got.Pending, p); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Rev != got.Rev {
		t.Fatalf("ScanCatalog returned rev %d, handed over %d", st.Rev, got.Rev)
	}
	return got, heads
}

// ScanCatalog hands over, page by page, exactly what CatalogState reads in
// one MULTI: windows in table order, the history (the list of earlier
// versions, then :past by table) and the pending steps with their tables,
// for a flow wider than a page; and a revision that moves during the scan
// makes it start over, so that what it hands over last is of one revision.
func TestScanCatalogMatchesCatalogState(t *testing.T) {
	ctx := context.Background()
	s, rdb := newStore(t)
	const n = 5000
	tables := func(first uint32) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = first + uint32(i)
		}
		return out
	}
	a, err := s.ApplyDDL(ctx, meta.DDL{Op: "create", Flow: meta.FlowInfo{FlowName: "wide", SourceTableIDs: tables(1)}}, meta.DDLPosition{Topic: "ddl", NextOffset: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := a.FlowID
	if _, err := s.ApplyDDL(ctx, meta.DDL{Op: "replace", Flow: meta.FlowInfo{FlowName: "wide", SourceTableIDs: tables(n / 2)}}, meta.DDLPosition{Topic: "ddl", NextOffset: 2}); err != nil {
		t.Fatal(err)
	}
	// Windows and history as finalisations leave them, written directly.
	k := s.Keys()
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		until := uint64(50)
		for i := uint32(1); i <= n; i++ {
			w, _ := json.Marshal(meta.Window{Since: uint64(i)})
			p.HSet(ctx, k.Coverage(id), strconv.FormatUint(uint64(i), 10), w)
			if i%2 == 0 {
				h, _ := json.Marshal([]meta.Window{{Since: 1, Until: &until}, {Since: 2, Until: &until}})
				p.HSet(ctx, k.CoveragePast(id), strconv.FormatUint(uint64(i), 10), h)
			}
			if i%3 == 0 {
				l, _ := json.Marshal(meta.Window{TableID: i, Since: 3, Until: &until})
				p.RPush(ctx, k.CoverageHistory(id), l)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want, err := s.CatalogState(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Windows) != n || len(want.History) < n || len(want.Pending) == 0 {
		t.Fatalf("setup: %d windows, %d history, %d pending", len(want.Windows), len(want.History), len(want.Pending))
	}
	got, heads := scanned(t, s, id, nil)
	if heads != 1 {
		t.Fatalf("ScanCatalog read the head %d times, want once", heads)
	}
	sameCatalogState(t, got, want)

	moved := false
	got, heads = scanned(t, s, id, func(heads int) {
		if !moved {
			moved = true
			if err := s.SkipCatalogRev(ctx, id, want.Rev); err != nil {
				t.Error(err)
			}
		}
	})
	if heads != 2 || got.Rev != want.Rev+1 {
		t.Fatalf("a revision moved during the scan: %d heads, rev %d; want a second scan at rev %d", heads, got.Rev, want.Rev+1)
	}
	want.Rev++
	sameCatalogState(t, got, want)
}

// sameCatalogState fails t where got and want differ.
func sameCatalogState(t *testing.T, got, want meta.CatalogState) {
	t.Helper()
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"windows", got.Windows, want.Windows}, {"history", got.History, want.History}, {"pending", got.Pending, want.Pending},
		{"info", got.Info, want.Info}, {"routes", got.Routes, want.Routes}, {"snapshots", got.Snapshots, want.Snapshots},
		{"scalars", []any{got.ID, got.Rev, got.Exists, got.HasInfo, got.CoverageSeq, got.TruncatedBefore, got.CheckpointTS, got.DDL, got.AnyMeta},
			[]any{want.ID, want.Rev, want.Exists, want.HasInfo, want.CoverageSeq, want.TruncatedBefore, want.CheckpointTS, want.DDL, want.AnyMeta}},
	} {
		if !reflect.DeepEqual(f.got, f.want) {
			t.Errorf("ScanCatalog's %s differ from CatalogState's", f.name)
		}
	}
}
