package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink/gcs"
)

// TestHostileFutureTimestamps runs the built binaries against records that
// claim a time that has not come: a heartbeat at resolved ts 2^64-1 on each
// apply partition, and a put at commit ts 2^63 on a table no flow covers.
// Each goes to the DLQ with reason ts_future and counts toward nothing:
// once the honest regions fall silent for --region-ttl, the checkpoint in
// Redis and in the global_checkpoint object stays where the honest data
// put it; maxts stays honest, so a flow created afterwards on that table
// gets a window that starts before its data and restores it; a restore
// --ts an hour ahead is refused; verify is clean.
func TestHostileFutureTimestamps(t *testing.T) {
	c := startCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumer(t, "clock-1", "--region-ttl", "3s")
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)

	load := faultLoad(4000, 2401, time.Now().UTC().Add(-time.Hour))
	want := faultExpect(load)
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load)...)...)
	waitCheckpointOrExit(t, c, cons, want.maxResolved, 2*time.Minute)
	id, _, err := store.FlowIDByName(ctx, meta.DefaultCatalog, faultFlow)
	if err != nil {
		t.Fatal(err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Broker.Addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	put := &event.Batch{RegionID: 9003, Events: []event.Event{putAt(3, 1, 1<<63)}}
	for _, r := range []struct {
		p int32
		b *event.Batch
	}{
		{0, &event.Batch{RegionID: 9001, ResolvedTS: math.MaxUint64}},
		{1, &event.Batch{RegionID: 9002, ResolvedTS: math.MaxUint64}},
		{0, put},
	} {
		rec := &kgo.Record{Topic: testenv.ApplyTopic, Partition: r.p, Key: []byte(strconv.FormatUint(r.b.RegionID, 10)), Value: event.EncodeBatch(nil, r.b)}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	recs := consumeAll(t, c.Broker.Addr, testenv.DLQTopic, 3)
	for _, r := range recs {
		if reason := recordHeader(r, event.HeaderError); !strings.HasPrefix(reason, "ts_future") {
			t.Errorf("DLQ record reason %q, want ts_future", reason)
		}
	}

	// The honest regions fall silent. Had the heartbeats counted, every
	// partition's checkpoint would now be 2^64-1; cycles go on every second.
	silentSince := time.Now()
	httpc := &http.Client{Timeout: 5 * time.Second}
	before := -1.0
	waitFor(t, time.Minute, func() (bool, string) {
		m, err := scrapeMetricsWith(httpc, "http://"+cons.Addr)
		if err != nil {
			return false, err.Error()
		}
		n, _ := m.get("flowlog_flush_cycles_total")
		if before < 0 || time.Since(silentSince) < 3*time.Second {
			before = n
			return false, "within --region-ttl of the last honest record"
		}
		return n >= before+3, fmt.Sprintf("%v flush cycles since --region-ttl passed, want 3", n-before)
	})
	st, err := store.FlowState(ctx, id)
	if err != nil || st.CheckpointTS != want.maxResolved {
		t.Errorf("checkpoint_ts %d (%v), want it kept at the honest %d", st.CheckpointTS, err, want.maxResolved)
	}
	gb, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	if got, name, err := checkpointObjectTS(ctx, gb, meta.DefaultCatalog, faultFlow, id); err != nil || got != want.maxResolved {
		t.Errorf("global checkpoint object %s: %d (%v), want %d", name, got, err, want.maxResolved)
	}
	bound := event.MaxTS(time.Now(), 5*time.Minute)
	for p := int32(0); p < 2; p++ {
		v, err := c.Redis.Client(t).Get(ctx, meta.NewKeys("flowlog").MaxTS(testenv.ApplyTopic, p)).Uint64()
		if err != nil || v > bound {
			t.Errorf("maxts of partition %d = %d (%v), want at most the clock plus the skew", p, v, err)
		}
	}
	if r := oracleRun(t, "restore", c.oracleConn(), "--flow", faultFlow, "--out", t.TempDir(),
		"--ts", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); r.code == 0 || !strings.Contains(r.out, "more than --max-clock-skew") {
		t.Errorf("restore --ts now+1h: exit %d, want a refusal naming --max-clock-skew:\n%s", r.code, r.out)
	}
	if r := oracleRun(t, "verify", c.oracleConn(), "--flow", faultFlow); r.code != 0 {
		t.Errorf("verify: exit %d:\n%s", r.code, r.out)
	}

	// A flow on table 3, created after the put at 2^63, restores the data
	// written to it afterwards.
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "after_future", "--tables", "3")
	later := faultLoad(2000, 2402, time.Now().UTC().Add(-30*time.Second))
	later.Tables = []int64{3}
	waitFor(t, time.Minute, func() (bool, string) {
		id3, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, "after_future")
		return err == nil && ok && id3 > 0, "flow after_future not created"
	})
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(later)...)...)
	var res oracleResult
	waitFor(t, 2*time.Minute, func() (bool, string) {
		res = oracleRun(t, "restore", c.oracleConn(), "--flow", "after_future", "--out", t.TempDir())
		return res.code == 0, "restore of after_future: " + res.out
	})
	id3, _, _ := store.FlowIDByName(ctx, meta.DefaultCatalog, "after_future")
	cur, _, err := store.Windows(ctx, id3)
	if w, ok := cur[3]; err != nil || !ok || w.Since > bound {
		t.Errorf("table 3's window %+v (%v), want one that starts at most at the clock plus the skew", w, err)
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}

// putAt is a write-CF put of row (table, handle) at commit ts with a short
// value.
func putAt(table, handle int64, commit uint64) event.Event {
	w, _ := event.AppendWrite(nil, event.Write{Type: event.WritePut, StartTS: commit - 1, ShortValue: []byte("v"), HasShortValue: true})
	return event.Event{Key: event.AppendDataKey(nil, event.RowKey(table, handle), commit), Value: w, CF: event.CFWrite, Op: event.OpPut}
}

// recordHeader is the value of r's header key, "" if absent.
func recordHeader(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
