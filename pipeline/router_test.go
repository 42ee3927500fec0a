package pipeline_test

import (
	"context"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
)

// routerWith registers flows (name -> source tables) in a real Redis and
// returns a router over a refreshed registry.
func routerWith(t *testing.T, flows map[string][]uint32) *pipeline.Router {
	t.Helper()
	ctx := context.Background()
	store := meta.NewStore(testenv.StartRedis(t).Client(t), "flowlog", nil)
	id := meta.FlowID(1)
	for _, name := range []string{"a", "b", "c"} {
		tables, ok := flows[name]
		if !ok {
			continue
		}
		info := meta.FlowInfo{CatalogName: "default", FlowName: name, SourceTableIDs: tables, FlownodeIDs: map[uint32]uint64{0: 1}}
		if err := store.CreateFlow(ctx, id, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1}}}); err != nil {
			t.Fatal(err)
		}
		id++
	}
	reg := meta.NewRegistry(store)
	if err := reg.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	return pipeline.NewRouter(reg)
}

func names(fs []*meta.Flow) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Info.FlowName)
	}
	return out
}

func enc(raw []byte) []byte { return event.EncodeBytes(nil, raw) }

// Mirrors TiKV's router test of lookups by key around two registered ranges:
// before the first, inside the first, between them, inside the second,
// after the second.
func TestRouterKeyLookupAroundTwoRanges(t *testing.T) {
	r := routerWith(t, map[string][]uint32{"a": {10}, "b": {20}})
	for _, tc := range []struct {
		name string
		key  []byte
		want string
	}{
		{"before the first range", event.RowKey(5, 1), ""},
		{"start of the first range", event.TablePrefix(10), "a"},
		{"inside the first range", event.RowKey(10, 1<<40), "a"},
		{"between the ranges", event.RowKey(15, 1), ""},
		{"inside the second range", event.RowKey(20, -7), "b"},
		{"after the second range", event.RowKey(21, 0), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flows, _, _, reason := r.Route(enc(tc.key))
			routed := names(flows)
			want := []string(nil)
			if tc.want != "" {
				want = []string{tc.want}
			}
			if !equal(routed, want) {
				t.Fatalf("Route = %v (reason %q); want %v", routed, reason, want)
			}
		})
	}
}

func TestRouterSkipReasons(t *testing.T) {
	r := routerWith(t, map[string][]uint32{"a": {1}, "b": {2}})
	for _, tc := range []struct {
		name   string
		raw    []byte
		flows  []string
		meta   bool
		reason string
	}{
		{"covered table", event.RowKey(1, 1), []string{"a"}, false, ""},
		{"table of no flow", event.RowKey(3, 1), nil, false, "no_flow"},
		{"meta key goes to every flow", []byte("mDDLJobList"), []string{"a", "b"}, true, ""},
		{"neither table nor meta", []byte("zzz"), nil, false, "no_table"},
		{"table prefix too short", []byte("t\x80"), nil, false, "bad_key"}, // not a skip: the record goes to the DLQ
	} {
		t.Run(tc.name, func(t *testing.T) {
			flows, _, isMeta, reason := r.Route(enc(tc.raw))
			if !equal(names(flows), tc.flows) || isMeta != tc.meta || reason != tc.reason {
				t.Fatalf("Route = %v meta=%v reason=%q; want %v meta=%v reason=%q",
					names(flows), isMeta, reason, tc.flows, tc.meta, tc.reason)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
