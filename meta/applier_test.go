package meta_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// ddlEnv is a Kafka cluster and a Redis server for applier tests.
type ddlEnv struct {
	k   *testenv.Kafka
	rdb *redis.Client
	s   *meta.Store
	pr  *kgo.Client
}

func newDDLEnv(t *testing.T) *ddlEnv {
	t.Helper()
	k := testenv.StartKafka(t, 1)
	rdb := testenv.StartRedis(t).Client(t)
	return &ddlEnv{k: k, rdb: rdb, s: meta.NewStore(rdb, "", nil), pr: k.Client(t)}
}

// publish produces values to the DDL topic, in order, and returns their
// offsets.
func (e *ddlEnv) publish(t *testing.T, values ...string) []int64 {
	t.Helper()
	var offs []int64
	for _, v := range values {
		r, err := e.pr.ProduceSync(context.Background(), &kgo.Record{Topic: testenv.DDLTopic, Key: []byte("k"), Value: []byte(v)}).First()
		if err != nil {
			t.Fatalf("produce: %v", err)
		}
		offs = append(offs, r.Offset)
	}
	return offs
}

// applier is an Applier with its own metrics registry.
type applier struct {
	*meta.Applier
	reg *prometheus.Registry
	r   *meta.Registry
}

func (e *ddlEnv) applier(t *testing.T, log *slog.Logger) *applier {
	t.Helper()
	reg := prometheus.NewRegistry()
	r := meta.NewRegistry(e.s)
	a, err := meta.NewApplier(e.s, r, meta.ApplierConfig{
		Topic:      testenv.DDLTopic,
		KafkaOpts:  []kgo.Opt{kgo.SeedBrokers(e.k.ListenAddrs()...)},
		DLQ:        dlq.New(e.k.Client(t), testenv.DLQTopic, reg),
		Logger:     log,
		Registerer: reg,
	})
	if err != nil {
		t.Fatalf("NewApplier: %v", err)
	}
	t.Cleanup(a.Close)
	return &applier{Applier: a, reg: reg, r: r}
}

// results sums flowlog_ddl_applied_total by result.
func (a *applier) results(t *testing.T) map[string]int {
	t.Helper()
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "flowlog_ddl_applied_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					out[l.GetValue()] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

// dlqRecords reads the whole DLQ topic: source offset -> flowlog-error, and
// the number of records.
func (e *ddlEnv) dlqRecords(t *testing.T) (map[int64]string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := e.k.Client(t)
	end, err := adm.ProduceSync(ctx, &kgo.Record{Topic: testenv.DLQTopic, Value: []byte("end-marker")}).First()
	if err != nil {
		t.Fatal(err)
	}
	cl := e.k.Client(t, kgo.ConsumeTopics(testenv.DLQTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	out, n := map[int64]string{}, 0
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read dlq: %v", ctx.Err())
		}
		for _, r := range fs.Records() {
			if r.Offset == end.Offset {
				return out, n
			}
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			if h[event.HeaderSourceTopic] != testenv.DDLTopic || h[event.HeaderSourcePartition] != "0" {
				t.Errorf("dlq record %d: source headers %v", r.Offset, h)
			}
			off, err := strconv.ParseInt(h[event.HeaderSourceOffset], 10, 64)
			if err != nil {
				t.Fatalf("dlq record %d: source offset %q", r.Offset, h[event.HeaderSourceOffset])
			}
			out[off] = h[event.HeaderError]
			n++
		}
	}
}

func ddlJSON(op, name string, tables ...uint32) string {
	d := map[string]any{"op": op, "flow": map[string]any{"flow_name": name, "source_table_ids": tables}}
	b, _ := json.Marshal(d)
	return string(b)
}

// normalizedDump is dump with the times of flow infos zeroed.
func normalizedDump(t *testing.T, rdb *redis.Client) map[string]any {
	t.Helper()
	got := dump(t, rdb, "flowlog:{flowlog}:")
	for k, v := range got {
		if !strings.HasPrefix(k, "flow:info:") {
			continue
		}
		var info meta.FlowInfo
		if err := json.Unmarshal([]byte(v.(string)), &info); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if info.CreatedTime.IsZero() || info.UpdatedTime.Before(info.CreatedTime) {
			t.Errorf("%s: times %v / %v", k, info.CreatedTime, info.UpdatedTime)
		}
		info.CreatedTime, info.UpdatedTime = time.Time{}, time.Time{}
		b, _ := json.Marshal(info)
		got[k] = string(b)
	}
	return got
}

func infoJSON(name string, tables ...uint32) string {
	b, _ := json.Marshal(meta.FlowInfo{CatalogName: "default", FlowName: name, SourceTableIDs: tables,
		FlownodeIDs: map[uint32]uint64{0: 0}})
	return string(b)
}

func TestApplierScriptedSequence(t *testing.T) {
	e := newDDLEnv(t)
	ctx := context.Background()
	offs := e.publish(t,
		ddlJSON("create", "a", 1, 2), // 0
		ddlJSON("create", "b", 2, 3), // 1
		`{"op":"create","flow":`,     // 2 bad JSON
		ddlJSON("create", "../x", 1), // 3 bad name
		ddlJSON("alter", "a", 1),     // 4 unknown op
		ddlJSON("replace", "a", 4, 5),
		ddlJSON("drop", "b"),
		ddlJSON("create", "a", 9), // 7 exists, no if_not_exists: rejected
		ddlJSON("drop", "nope"),   // 8 missing: success without change
	)
	a := e.applier(t, nil)
	applied, err := a.CatchUp(ctx)
	if err != nil {
		t.Fatalf("CatchUp: %v", err)
	}
	var ops []string
	for _, r := range applied {
		ops = append(ops, fmt.Sprintf("%s %s %d %v", r.Op, r.Name, r.FlowID, r.Changed))
	}
	wantOps := []string{"create a 1 true", "create b 2 true", "replace a 1 true", "drop b 2 true", "drop nope 0 false"}
	if !reflect.DeepEqual(ops, wantOps) {
		t.Errorf("applied = %q, want %q", ops, wantOps)
	}
	route := `{"peer":{"id":0,"addr":""}}`
	assertDump(t, normalizedDump(t, e.rdb), map[string]any{
		"flow:name:default:a":      "1",
		"flow:info:1":              infoJSON("a", 4, 5),
		"flow:routes:1":            map[string]string{"0": route},
		"flownode:0":               []string{"1/0"},
		"table:4":                  map[string]string{"0/1/0": route},
		"table:5":                  map[string]string{"0/1/0": route},
		"flows":                    []string{"1"},
		"flow:seq":                 "2",
		"flow:state:1":             map[string]string{"status": "active"},
		"ddl:offset:flowlog.ddl:0": strconv.FormatInt(offs[len(offs)-1]+1, 10),
	})
	if got := flowIDs(a.r.ForTable(4)); !slices.Equal(got, []meta.FlowID{1}) {
		t.Errorf("registry ForTable(4) = %v", got)
	}
	if got := a.r.ForTable(2); len(got) != 0 {
		t.Errorf("registry ForTable(2) = %v, want none", flowIDs(got))
	}

	got, n := e.dlqRecords(t)
	wantReasons := map[int64]string{2: "ddl_invalid: ", 3: "ddl_invalid: ", 4: "ddl_invalid: ", 7: "ddl_rejected: "}
	if n != len(wantReasons) || len(got) != len(wantReasons) {
		t.Fatalf("dlq = %v (%d records), want offsets 2, 3, 4, 7", got, n)
	}
	for off, prefix := range wantReasons {
		if !strings.HasPrefix(got[off], prefix) {
			t.Errorf("dlq record of offset %d: error %q, want prefix %q", off, got[off], prefix)
		}
	}
	if res := a.results(t); res["applied"] != 4 || res["unchanged"] != 1 || res["invalid"] != 3 || res["rejected"] != 1 || res["skipped"] != 0 {
		t.Errorf("ddl_applied_total = %v", res)
	}

	t.Run("caught up is a no-op", func(t *testing.T) {
		start := time.Now()
		again, err := a.CatchUp(ctx)
		if err != nil || len(again) != 0 {
			t.Fatalf("second CatchUp = %v, %v; want nothing", again, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("caught-up CatchUp took %v", d)
		}
	})
	t.Run("later DDL applies", func(t *testing.T) {
		e.publish(t, ddlJSON("create", "c", 2))
		applied, err := a.CatchUp(ctx)
		if err != nil || len(applied) != 1 || !applied[0].Changed || applied[0].FlowID != 3 {
			t.Fatalf("CatchUp = %+v, %v; want create of flow 3 (ids are not reused)", applied, err)
		}
		if got := flowIDs(a.r.ForTable(2)); !slices.Equal(got, []meta.FlowID{3}) {
			t.Errorf("registry ForTable(2) = %v, want [3]", got)
		}
	})
}

// cancelAfter is a slog handler that cancels a context once n DDL records
// were applied: a deterministic "kill" between two records.
type cancelAfter struct {
	slog.Handler
	n      int64
	seen   atomic.Int64
	cancel context.CancelFunc
}

func (h *cancelAfter) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "flow ddl applied" && h.seen.Add(1) == h.n {
		h.cancel()
	}
	return nil
}
func (h *cancelAfter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *cancelAfter) Enabled(context.Context, slog.Level) bool { return true }

// killScript is 12 creates without if_not_exists (applying one twice would
// be rejected and land in the DLQ) with two malformed records among them.
func killScript() (values []string, malformed []int64, valid int) {
	for i := range 12 {
		values = append(values, ddlJSON("create", fmt.Sprintf("f%d", i), uint32(i+1)))
		if i == 3 || i == 8 {
			malformed = append(malformed, int64(len(values)))
			values = append(values, `not json`)
		}
	}
	return values, malformed, 12
}

func TestApplierKilledBetweenRecords(t *testing.T) {
	cases := []struct {
		killAfter int64
		same      bool // resume with the same applier instead of a new one
	}{{1, false}, {4, false}, {9, false}, {4, true}, {11, true}}
	for _, tc := range cases {
		killAfter := tc.killAfter
		t.Run(fmt.Sprintf("after %d same=%v", killAfter, tc.same), func(t *testing.T) {
			e := newDDLEnv(t)
			values, malformed, valid := killScript()
			e.publish(t, values...)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			h := &cancelAfter{Handler: slog.DiscardHandler, n: killAfter, cancel: cancel}
			first := e.applier(t, slog.New(h))
			got1, err := first.CatchUp(ctx)
			if err == nil {
				t.Fatalf("first CatchUp was not interrupted (applied %d)", len(got1))
			}
			r1 := first.results(t)
			second := first
			if !tc.same {
				first.Close()
				second = e.applier(t, nil)
			}
			got2, err := second.CatchUp(context.Background())
			if err != nil {
				t.Fatalf("second CatchUp: %v", err)
			}
			r2 := second.results(t)
			if tc.same {
				for k, v := range r1 {
					r2[k] -= v
				}
			}
			if r1["applied"]+r2["applied"] != valid || r1["rejected"]+r2["rejected"] != 0 || r2["skipped"] != 0 {
				t.Errorf("results: first %v, second %v; want %d applied in all, none rejected or skipped", r1, r2, valid)
			}
			// The same applier returns the outcomes its interrupted catch-up
			// had produced too: the caller reacts to every applied DDL.
			wantGot2 := valid - int(killAfter)
			if tc.same {
				wantGot2 = valid
			}
			if int64(r1["applied"]) != killAfter || len(got2) != wantGot2 {
				t.Errorf("first applied %d (want %d), second returned %d (want %d)", r1["applied"], killAfter, len(got2), wantGot2)
			}
			dl, n := e.dlqRecords(t)
			var offs []int64
			for o := range dl {
				offs = append(offs, o)
			}
			slices.Sort(offs)
			if !slices.Equal(offs, malformed) {
				t.Errorf("dlq source offsets = %v (%d records), want only the malformed %v", offs, n, malformed)
			}
			ids, err := e.s.AllFlows(context.Background())
			if err != nil || len(ids) != valid {
				t.Errorf("flows = %v, %v; want %d", ids, err, valid)
			}
			if off, _, _ := e.s.DDLOffset(context.Background(), testenv.DDLTopic, 0); off != int64(len(values)) {
				t.Errorf("ddl offset = %d, want %d", off, len(values))
			}
		})
	}
}

func TestApplierConcurrent(t *testing.T) {
	e := newDDLEnv(t)
	values, malformed, valid := killScript()
	ctx := context.Background()
	as := []*applier{e.applier(t, nil), e.applier(t, nil)}
	// Two rounds: both appliers race over the same records each time.
	half := len(values) / 2
	for round, batch := range [][]string{values[:half], values[half:]} {
		e.publish(t, batch...)
		var wg sync.WaitGroup
		for _, a := range as {
			wg.Go(func() {
				if _, err := a.CatchUp(ctx); err != nil {
					t.Errorf("round %d: CatchUp: %v", round, err)
				}
			})
		}
		wg.Wait()
	}
	total := map[string]int{}
	for _, a := range as {
		for k, v := range a.results(t) {
			total[k] += v
		}
	}
	if total["applied"] != valid || total["rejected"] != 0 || total["unchanged"] != 0 {
		t.Errorf("results summed = %v; want exactly %d applied, none rejected", total, valid)
	}
	dl, _ := e.dlqRecords(t)
	for o := range dl {
		if !slices.Contains(malformed, o) {
			t.Errorf("dlq holds valid record %d: %q", o, dl[o])
		}
	}
	ids, err := e.s.AllFlows(ctx)
	if err != nil || len(ids) != valid {
		t.Fatalf("flows = %v, %v", ids, err)
	}
	for _, a := range as {
		if got := a.r.Flows(); len(got) != valid {
			t.Errorf("registry has %d flows, want %d", len(got), valid)
		}
	}
}

// TestApplierMaxTablesPerFlow: a create or replace naming more source
// tables than MaxTablesPerFlow goes to the DLQ as ddl_rejected, saying
// why; nothing of it is applied, the DDL path goes on, and a DDL at the
// limit is applied.
func TestApplierMaxTablesPerFlow(t *testing.T) {
	e := newDDLEnv(t)
	ctx := context.Background()
	offs := e.publish(t,
		ddlJSON("create", "wide", 1, 2, 3, 4), // 0: one table too many
		ddlJSON("create", "ok", 1, 2, 3),      // 1: at the limit
		ddlJSON("replace", "ok", 1, 2, 3, 4),  // 2: grows past it
	)
	reg := prometheus.NewRegistry()
	a, err := meta.NewApplier(e.s, meta.NewRegistry(e.s), meta.ApplierConfig{
		Topic: testenv.DDLTopic, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(e.k.ListenAddrs()...)},
		DLQ: dlq.New(e.k.Client(t), testenv.DLQTopic, reg), Registerer: reg, MaxTablesPerFlow: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := e.s.FlowIDByName(ctx, meta.DefaultCatalog, "wide"); ok {
		t.Error("flow wide of 4 tables was created past a limit of 3")
	}
	id, ok, err := e.s.FlowIDByName(ctx, meta.DefaultCatalog, "ok")
	if err != nil || !ok {
		t.Fatalf("flow ok at the limit not created: %v", err)
	}
	info, _, err := e.s.FlowInfo(ctx, id)
	if err != nil || !slices.Equal(info.SourceTableIDs, []uint32{1, 2, 3}) {
		t.Errorf("flow ok has tables %v (%v), want the create's 1, 2, 3: the replace past the limit was applied", info.SourceTableIDs, err)
	}
	got, n := e.dlqRecords(t)
	for _, off := range []int64{offs[0], offs[2]} {
		if !strings.HasPrefix(got[off], "ddl_rejected: ") || !strings.Contains(got[off], "4 source tables, at most 3") {
			t.Errorf("DLQ record of offset %d: %q, want ddl_rejected naming 4 tables of at most 3", off, got[off])
		}
	}
	if n != 2 {
		t.Errorf("DLQ holds %d records, want 2", n)
	}
	assertOffsetAt(t, e.s, offs[2]+1)
}

func assertOffsetAt(t *testing.T, s *meta.Store, want int64) {
	t.Helper()
	got, ok, err := s.DDLOffset(context.Background(), testenv.DDLTopic, 0)
	if err != nil || !ok || got != want {
		t.Fatalf("ddl offset = %d, %v, %v; want %d", got, ok, err, want)
	}
}
