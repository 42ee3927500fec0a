package meta_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// newStore starts a private redis-server and returns a store on it with the
// default prefix.
func newStore(t *testing.T) (*meta.Store, *redis.Client) {
	t.Helper()
	rdb := startRedis(t).Client(t)
	return meta.NewStore(rdb, "", nil), rdb
}

func startRedis(t *testing.T) *testenv.Redis { return testenv.StartRedis(t) }

// dump returns every key under base (SCAN is fine in tests) with its
// content: strings as string, hashes as map[string]string, sets and sorted
// sets as sorted []string.
func dump(t *testing.T, rdb *redis.Client, base string) map[string]any {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	iter := rdb.Scan(ctx, 0, base+"*", 100).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		if rest := strings.TrimPrefix(key, base); strings.HasPrefix(rest, "coverage:") || strings.HasPrefix(rest, "catalog:") {
			continue // coverage and catalog revisions have tests of their own (coverage_test.go, catalog_test.go)
		}
		typ, err := rdb.Type(ctx, key).Result()
		if err != nil {
			t.Fatalf("type %s: %v", key, err)
		}
		var v any
		switch typ {
		case "string":
			v, err = rdb.Get(ctx, key).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, key).Result()
		case "set":
			var m []string
			m, err = rdb.SMembers(ctx, key).Result()
			slices.Sort(m)
			v = m
		case "zset":
			v, err = rdb.ZRange(ctx, key, 0, -1).Result()
		default:
			t.Fatalf("key %s has unexpected type %s", key, typ)
		}
		if err != nil {
			t.Fatalf("read %s: %v", key, err)
		}
		out[strings.TrimPrefix(key, base)] = v
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scan: %v", err)
	}
	return out
}

func assertDump(t *testing.T, got, want map[string]any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		gj, _ := json.MarshalIndent(got, "", "  ")
		wj, _ := json.MarshalIndent(want, "", "  ")
		t.Fatalf("redis content:\n%s\nwant:\n%s", gj, wj)
	}
}

func i64(v int64) *int64 { return &v }

// testFlow mirrors GreptimeDB's test flow: two partitions on flownodes 1 and
// 2 over tables 1024 and 1025.
func testFlow() (meta.FlowInfo, map[uint32]meta.Route) {
	ts := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	info := meta.FlowInfo{
		CatalogName:     "greptime",
		FlowName:        "flow",
		SourceTableIDs:  []uint32{1024, 1025},
		SinkTableName:   meta.TableName{CatalogName: "greptime", SchemaName: "public", TableName: "sink_table"},
		FlownodeIDs:     map[uint32]uint64{0: 1, 1: 2},
		RawSQL:          "raw",
		ExpireAfterSecs: i64(300),
		Comment:         "hi",
		Options:         map[string]string{"b": "2", "a": "1"},
		CreatedTime:     ts,
		UpdatedTime:     ts,
	}
	routes := map[uint32]meta.Route{
		0: {Peer: meta.Peer{ID: 1, Addr: "1.1.1.1:3001"}},
		1: {Peer: meta.Peer{ID: 2, Addr: "2.2.2.2:3002"}},
	}
	return info, routes
}

func routeJSON(id uint64, addr string) string {
	b, _ := json.Marshal(meta.Route{Peer: meta.Peer{ID: id, Addr: addr}})
	return string(b)
}

func TestCreateFlowKeyLayout(t *testing.T) {
	s, rdb := newStore(t)
	ctx := context.Background()
	info, routes := testFlow()
	if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
		t.Fatal(err)
	}
	infoJSON, _ := json.Marshal(info)
	r0, r1 := routeJSON(1, "1.1.1.1:3001"), routeJSON(2, "2.2.2.2:3002")
	if r0 != `{"peer":{"id":1,"addr":"1.1.1.1:3001"}}` {
		t.Fatalf("route JSON = %s", r0)
	}
	if !strings.Contains(string(infoJSON), `"options":{"a":"1","b":"2"}`) {
		t.Fatalf("info JSON map keys not sorted: %s", infoJSON)
	}
	assertDump(t, dump(t, rdb, "flowlog:{flowlog}:"), map[string]any{
		"flow:name:greptime:flow": "10",
		"flow:info:10":            string(infoJSON),
		"flow:routes:10":          map[string]string{"0": r0, "1": r1},
		"flownode:1":              []string{"10/0"},
		"flownode:2":              []string{"10/1"},
		"table:1024":              map[string]string{"1/10/0": r0, "2/10/1": r1},
		"table:1025":              map[string]string{"1/10/0": r0, "2/10/1": r1},
		"flows":                   []string{"10"},
		"flow:state:10":           map[string]string{"status": "active"},
	})
}

func TestFlowMetadataParity(t *testing.T) {
	ctx := context.Background()
	base := "flowlog:{flowlog}:"

	t.Run("create and lookups", func(t *testing.T) {
		s, _ := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		// Creating again with the same id and info is idempotent.
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatalf("idempotent create: %v", err)
		}
		id, ok, err := s.FlowIDByName(ctx, "greptime", "flow")
		if err != nil || !ok || id != 10 {
			t.Fatalf("FlowIDByName = %d, %v, %v", id, ok, err)
		}
		if _, ok, err := s.FlowIDByName(ctx, "greptime", "nope"); err != nil || ok {
			t.Fatalf("FlowIDByName(missing) = %v, %v", ok, err)
		}
		got, ok, err := s.FlowInfo(ctx, 10)
		if err != nil || !ok || !reflect.DeepEqual(got, info) {
			t.Fatalf("FlowInfo = %+v, %v, %v", got, ok, err)
		}
		gotRoutes, err := s.FlowRoutes(ctx, 10)
		if err != nil || !reflect.DeepEqual(gotRoutes, routes) {
			t.Fatalf("FlowRoutes = %v, %v", gotRoutes, err)
		}
		for node, want := range map[uint64][]meta.FlowPartition{1: {{10, 0}}, 2: {{10, 1}}, 3: {}} {
			got, err := s.FlownodeFlows(ctx, node)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("FlownodeFlows(%d) = %v, %v; want %v", node, got, err, want)
			}
		}
		wantTable := []meta.TableRoute{
			{FlownodeID: 1, FlowID: 10, PartitionID: 0, Route: routes[0]},
			{FlownodeID: 2, FlowID: 10, PartitionID: 1, Route: routes[1]},
		}
		for _, table := range []uint32{1024, 1025} {
			got, err := s.TableFlows(ctx, table)
			if err != nil || !reflect.DeepEqual(got, wantTable) {
				t.Fatalf("TableFlows(%d) = %v, %v", table, got, err)
			}
		}
		all, err := s.AllFlows(ctx)
		if err != nil || !reflect.DeepEqual(all, []meta.FlowID{10}) {
			t.Fatalf("AllFlows = %v, %v", all, err)
		}
	})

	t.Run("create again with another id", func(t *testing.T) {
		s, _ := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		err := s.CreateFlow(ctx, 11, info, routes)
		if !errors.Is(err, meta.ErrFlowAlreadyExists) {
			t.Fatalf("err = %v, want ErrFlowAlreadyExists", err)
		}
		if _, ok, _ := s.FlowInfo(ctx, 11); ok {
			t.Fatal("flow 11 was written")
		}
	})

	t.Run("create same id different value", func(t *testing.T) {
		s, _ := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		other := info
		other.SourceTableIDs = []uint32{1024, 1026}
		err := s.CreateFlow(ctx, 10, other, routes)
		var uv *meta.UnexpectedValueError
		if !errors.Is(err, meta.ErrUnexpectedValue) || !errors.As(err, &uv) || !strings.Contains(err.Error(), "unexpected value") {
			t.Fatalf("err = %v, want unexpected value", err)
		}
		if uv.Key != base+"flow:info:10" {
			t.Fatalf("UnexpectedValueError.Key = %q", uv.Key)
		}
		if got, _, _ := s.FlowInfo(ctx, 10); !reflect.DeepEqual(got, info) {
			t.Fatalf("stored info changed: %+v", got)
		}
	})

	t.Run("destroy twice leaves only metas", func(t *testing.T) {
		s, rdb := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		other, otherRoutes := testFlow()
		other.FlowName = "other"
		if err := s.CreateFlow(ctx, 11, other, otherRoutes); err != nil {
			t.Fatal(err)
		}
		rdb.ZAdd(ctx, base+"metas:10", redis.Z{Score: 1, Member: "a/b.meta"})
		before11 := dump(t, rdb, base)
		for i := range 2 {
			if err := s.DestroyFlow(ctx, 10, info); err != nil {
				t.Fatalf("destroy %d: %v", i, err)
			}
		}
		// Only flow 11's keys and flow 10's metas remain.
		s2, rdb2 := newStore(t)
		if err := s2.CreateFlow(ctx, 11, other, otherRoutes); err != nil {
			t.Fatal(err)
		}
		want := dump(t, rdb2, base)
		want["metas:10"] = []string{"a/b.meta"}
		assertDump(t, dump(t, rdb, base), want)
		if len(before11) <= len(want) {
			t.Fatalf("destroy removed nothing: before %d keys, after %d", len(before11), len(want))
		}
		if _, ok, _ := s.FlowIDByName(ctx, "greptime", "flow"); ok {
			t.Fatal("name still maps")
		}
	})

	t.Run("update replaces routes and indexes", func(t *testing.T) {
		s, rdb := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		next := info
		next.SourceTableIDs = []uint32{1025, 1026}
		next.FlownodeIDs = map[uint32]uint64{0: 1, 1: 2}
		newRoutes := map[uint32]meta.Route{
			0: {Peer: meta.Peer{ID: 1, Addr: "1.1.1.1:4001"}},
			1: {Peer: meta.Peer{ID: 2, Addr: "2.2.2.2:4002"}},
		}
		if err := s.UpdateFlow(ctx, 10, info, next, newRoutes); err != nil {
			t.Fatal(err)
		}
		nextJSON, _ := json.Marshal(next)
		r0, r1 := routeJSON(1, "1.1.1.1:4001"), routeJSON(2, "2.2.2.2:4002")
		assertDump(t, dump(t, rdb, base), map[string]any{
			"flow:name:greptime:flow": "10",
			"flow:info:10":            string(nextJSON),
			"flow:routes:10":          map[string]string{"0": r0, "1": r1},
			"flownode:1":              []string{"10/0"},
			"flownode:2":              []string{"10/1"},
			"table:1025":              map[string]string{"1/10/0": r0, "2/10/1": r1},
			"table:1026":              map[string]string{"1/10/0": r0, "2/10/1": r1},
			"flows":                   []string{"10"},
			"flow:state:10":           map[string]string{"status": "active"},
		})
	})

	t.Run("update moves partitions to other flownodes", func(t *testing.T) {
		s, _ := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		next := info
		next.FlownodeIDs = map[uint32]uint64{0: 3, 1: 4}
		newRoutes := map[uint32]meta.Route{
			0: {Peer: meta.Peer{ID: 3, Addr: "3.3.3.3:3003"}},
			1: {Peer: meta.Peer{ID: 4, Addr: "4.4.4.4:3004"}},
		}
		if err := s.UpdateFlow(ctx, 10, info, next, newRoutes); err != nil {
			t.Fatal(err)
		}
		for node, want := range map[uint64][]meta.FlowPartition{1: {}, 2: {}, 3: {{10, 0}}, 4: {{10, 1}}} {
			got, err := s.FlownodeFlows(ctx, node)
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("FlownodeFlows(%d) = %v, %v; want %v", node, got, err, want)
			}
		}
		got, err := s.TableFlows(ctx, 1024)
		want := []meta.TableRoute{
			{FlownodeID: 3, FlowID: 10, PartitionID: 0, Route: newRoutes[0]},
			{FlownodeID: 4, FlowID: 10, PartitionID: 1, Route: newRoutes[1]},
		}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("TableFlows(1024) = %v, %v", got, err)
		}
	})

	t.Run("update with a different flow id", func(t *testing.T) {
		s, _ := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		other := info
		other.FlowName = "other"
		if err := s.CreateFlow(ctx, 11, other, routes); err != nil {
			t.Fatal(err)
		}
		next := other
		next.FlowName = "flow" // taken by flow 10
		err := s.UpdateFlow(ctx, 11, other, next, routes)
		if !errors.Is(err, meta.ErrDifferentFlowID) || !strings.Contains(err.Error(), "different flow id") {
			t.Fatalf("err = %v, want ErrDifferentFlowID", err)
		}
		if got, _, _ := s.FlowInfo(ctx, 11); !reflect.DeepEqual(got, other) {
			t.Fatalf("flow 11 changed: %+v", got)
		}
	})

	t.Run("update with stale current", func(t *testing.T) {
		s, _ := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		stale := info
		stale.Comment = "stale"
		next := info
		next.Comment = "next"
		err := s.UpdateFlow(ctx, 10, stale, next, routes)
		if !errors.Is(err, meta.ErrUnexpectedValue) || !strings.Contains(err.Error(), "unexpected value") {
			t.Fatalf("err = %v, want unexpected value", err)
		}
		if got, _, _ := s.FlowInfo(ctx, 10); !reflect.DeepEqual(got, info) {
			t.Fatalf("flow changed: %+v", got)
		}
	})

	t.Run("update renames", func(t *testing.T) {
		s, _ := newStore(t)
		info, routes := testFlow()
		if err := s.CreateFlow(ctx, 10, info, routes); err != nil {
			t.Fatal(err)
		}
		next := info
		next.FlowName = "renamed"
		if err := s.UpdateFlow(ctx, 10, info, next, routes); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := s.FlowIDByName(ctx, "greptime", "flow"); ok {
			t.Fatal("old name still maps")
		}
		if id, ok, _ := s.FlowIDByName(ctx, "greptime", "renamed"); !ok || id != 10 {
			t.Fatalf("new name = %d, %v", id, ok)
		}
	})
}
