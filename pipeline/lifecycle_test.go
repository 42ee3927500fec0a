package pipeline_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// otherReplica is a second instance's DDL applier on the rig's Redis and
// broker: DDL it applies reaches the rig's consumer only as a registry
// refresh, never as an Applied outcome of its own.
func (r *rig) otherReplica() *meta.Applier {
	r.t.Helper()
	reg := prometheus.NewRegistry()
	ap, err := meta.NewApplier(r.store, meta.NewRegistry(r.store), meta.ApplierConfig{
		Topic: testenv.DDLTopic, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(r.kafka.ListenAddrs()...)},
		DLQ: dlq.New(r.kafka.Client(r.t, dlq.ClientOpts(testenv.DLQTopic)...), testenv.DLQTopic, reg), Registerer: reg,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(ap.Close)
	return ap
}

func ddl(op, name string, tables ...uint32) []byte {
	b, _ := json.Marshal(map[string]any{"op": op, "flow": map[string]any{
		"catalog_name": "default", "flow_name": name, "source_table_ids": tables,
		"sink_table_name": map[string]string{"catalog_name": "default", "schema_name": "public", "table_name": name + "_sink"},
		"flownode_ids":    map[string]uint64{"0": 1},
	}, "routes": map[string]any{"0": map[string]any{"peer": map[string]any{"id": 1, "addr": "n1:4000"}}}})
	return b
}

// A flow dropped and created again under the same name by another replica,
// while this one holds the old flow's temp files: nothing crashes, the two
// flows share no temp file, spool or object, each flow's data is in its own
// objects only, and the old flow stays restorable by id: object names carry
// the flow id (docs/FORMAT.md, "Bucket layout").
func TestDropAndRecreateByAnotherReplica(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	old := r.createFlow("same", 1)
	first := putBatch(1, 1, 0, 5, 0)
	r.produceBatch(first)
	r.eventually(10*time.Second, func() bool {
		st := r.cons.Status()
		return len(st.Partitions) == 1 && st.Partitions[0].Next == 1
	}, "the old flow's batch consumed")

	other := r.otherReplica()
	r.produce(testenv.DDLTopic, "same", ddl("drop", "same"), "application/json")
	r.produce(testenv.DDLTopic, "same", ddl("create", "same", 1), "application/json")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := other.CatchUp(ctx); err != nil {
		t.Fatalf("other replica's catch-up: %v", err)
	}
	var fresh meta.FlowID
	r.eventually(10*time.Second, func() bool {
		id, ok, err := r.store.FlowIDByName(ctx, "default", "same")
		fresh = id
		return err == nil && ok && id != old
	}, "the flow created again")
	second := putBatch(1, 1, 100, 5, 100)
	r.produceBatch(second)
	r.eventually(10*time.Second, func() bool {
		st := r.cons.Status()
		return len(st.Partitions) == 1 && st.Partitions[0].Next == 2 && len(st.Flows) == 1 && st.Flows[0].ID == fresh
	}, "the new flow's batch consumed under the new flow")
	r.flush()
	select {
	case err := <-r.done:
		t.Fatalf("consumer stopped: %v", err)
	default:
	}

	want := func(b ...[]byte) map[string]bool {
		out := map[string]bool{}
		for _, x := range b {
			out[string(x)] = true
		}
		return out
	}
	for _, tc := range []struct {
		id   meta.FlowID
		keys map[string]bool
	}{
		{old, want(keysOf(first)...)},
		{fresh, want(keysOf(second)...)},
	} {
		metas, got := r.entries(tc.id)
		if len(got) != len(tc.keys) {
			t.Errorf("flow %d: %d entries backed up, want %d", tc.id, len(got), len(tc.keys))
		}
		for kv := range got {
			if !tc.keys[kv] {
				t.Errorf("flow %d holds an entry of the other flow", tc.id)
				break
			}
		}
		for _, m := range metas {
			if m.Version == sink.MetaVersion && (m.FlowID != tc.id || !strings.Contains(m.DataPath, "-"+itoa(tc.id)+"-")) {
				t.Errorf("flow %d: meta of flow %d with data path %s", tc.id, m.FlowID, m.DataPath)
			}
			for _, f := range m.Files { // layout v2: a chunk is the old flow's or the new one's
				if m.Version == sink.MetaVersion2 && m.Holds(old, &f) && m.Holds(fresh, &f) {
					t.Errorf("flow %d: a chunk of %s holds both flows (%v)", tc.id, m.DataPath, f.FlowIDs)
				}
			}
		}
	}
}

// keysOf lists b's entries as rig.entries keys them: key, NUL, value.
func keysOf(b *event.Batch) [][]byte {
	var out [][]byte
	for _, e := range b.Events {
		out = append(out, []byte(string(e.Key)+"\x00"+string(e.Value)))
	}
	return out
}

func itoa(id meta.FlowID) string { return strconv.FormatUint(uint64(id), 10) }

// The fatal flag follows flow:state in Redis: a resume applied by another
// replica clears it at once, although this replica's retry is an hour away:
// every replica stops and restarts fetching on the same Redis state.
func TestFatalClearedByAnotherReplicasResume(t *testing.T) {
	fb := &faultyBucket{Bucket: sink.NewMemBucket()}
	r := newRig(t, 1, fb, func(c *pipeline.Config) {
		c.FatalAfter, c.RetryBackoff, c.MaxRetryDelay = 1, time.Hour, time.Hour
	})
	r.start()
	id := r.createFlow("resumed", 1)
	fb.setFail(func(int) bool { return true })
	r.produceBatch(putBatch(1, 1, 0, 5, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 5 }, "events written")
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.cons.Flush(ctx)
	}()
	ctx := context.Background()
	r.eventually(10*time.Second, func() bool { return r.cons.Status().Paused }, "fetching paused by the fatal flow")

	fb.setFail(nil)
	r.produce(testenv.DDLTopic, "resumed", ddl("resume", "resumed"), "application/json")
	if _, err := r.otherReplica().CatchUp(ctx); err != nil {
		t.Fatalf("other replica's catch-up: %v", err)
	}
	r.eventually(20*time.Second, func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.Status == meta.StatusActive && !r.cons.Status().Paused
	}, "flow active and fetching again after the other replica's resume")
	r.eventually(20*time.Second, func() bool {
		_, got := r.entries(id)
		return len(got) == 5
	}, "the failed cycle retried and committed")
}

// A fatal flow dropped by another replica no longer stops fetching: the
// other flows go on although the dropped flow's cycle keeps failing.
func TestFatalFlowDroppedByAnotherReplica(t *testing.T) {
	fb := &faultyBucket{Bucket: sink.NewMemBucket()}
	r := newRig(t, 1, fb, func(c *pipeline.Config) { c.FatalAfter = 3 })
	r.start()
	r.createFlow("doomed", 1)
	fb.setFail(func(int) bool { return true })
	r.produceBatch(putBatch(1, 1, 0, 5, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 5 }, "events written")
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.cons.Flush(ctx)
	}()
	r.eventually(10*time.Second, func() bool { return r.cons.Status().Paused }, "fetching paused by the fatal flow")

	r.produce(testenv.DDLTopic, "doomed", ddl("drop", "doomed"), "application/json")
	if _, err := r.otherReplica().CatchUp(context.Background()); err != nil {
		t.Fatalf("other replica's catch-up: %v", err)
	}
	r.produceBatch(putBatch(1, 1, 100, 5, 100)) // waits behind the pause
	r.eventually(20*time.Second, func() bool {
		st := r.cons.Status()
		return !st.Paused && len(st.Partitions) == 1 && st.Partitions[0].Next == 2
	}, "fetching again after the drop, the next batch consumed")
	if n := fb.failed.Load(); n < 3 {
		t.Fatalf("%d failed uploads, want the dropped flow's cycle to have failed at least 3 times", n)
	}
	fb.setFail(nil) // lets the final flush of the stop go through
}
