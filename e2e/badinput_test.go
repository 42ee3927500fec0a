package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// badKind is one kind of malformed apply record and the DLQ reason it must
// get; reason "" marks a record that is valid but skipped (no_table).
type badKind struct {
	name, reason string
}

var badKinds = []badKind{
	{"random bytes", event.ReasonProto},
	{"truncated protobuf", event.ReasonProto},
	{"json body without header", event.ReasonProto},
	{"protobuf body with json header", event.ReasonJSON},
	{"key without ts", event.ReasonBadKey},
	{"value over max", "too_large"},
	{"invalid utf-8 in json", event.ReasonJSON},
	{"non-table key", ""},
}

// badMaxValue is --max-value-size of the bad-input consumer: above every
// record of its load (a few KB), which the limit bounds too.
const badMaxValue = 64 << 10

// badRecord builds record i of kind k: its events of table 1 (handles from
// 1e9, never produced by the load) must never reach the backup, because
// the record is atomic. resolved is the resolved ts of the records that
// decode (region 9000+i%8).
func badRecord(rng *rand.Rand, k int, i int, resolved uint64) *kgo.Record {
	ts := resolved - uint64(i+1)<<18
	good := event.Event{Key: event.AppendDataKey(nil, event.RowKey(1, 1e9+int64(i)), ts),
		Value: append([]byte{'P', 1, 'v', byte(len(loadgen.Marker))}, loadgen.Marker...), CF: event.CFWrite}
	b := event.Batch{RegionID: 9000 + uint64(i%8), ResolvedTS: resolved, Events: []event.Event{good}}
	jsonHeader := []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/json; charset=utf-8")}}
	r := &kgo.Record{Key: []byte(strconv.FormatUint(b.RegionID, 10))}
	switch badKinds[k].name {
	case "random bytes":
		v := make([]byte, 1+rng.IntN(200))
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		v[0] = 0x07 // field 0, wire type 7: never a valid tag
		r.Value = append(v, loadgen.Marker...)
	case "truncated protobuf":
		b.Events = append(b.Events, event.Event{Key: event.AppendDataKey(nil, event.RowKey(1, 2e9+int64(i)), ts), Value: []byte(loadgen.Marker), CF: event.CFDefault})
		full := event.EncodeBatch(nil, &b)
		r.Value = full[:len(full)-1-rng.IntN(len(loadgen.Marker)+10)] // inside the last event
	case "json body without header":
		v, _ := event.EncodeBatchJSON(&b)
		r.Value = v
	case "protobuf body with json header":
		r.Value, r.Headers = event.EncodeBatch(nil, &b), jsonHeader
	case "key without ts":
		b.Events = append(b.Events, event.Event{Key: event.EncodeBytes(nil, event.RowKey(1, 3e9+int64(i))), Value: []byte(loadgen.Marker), CF: event.CFDefault})
		r.Value = event.EncodeBatch(nil, &b)
	case "value over max":
		big := []byte(strings.Repeat(loadgen.Marker, badMaxValue/len(loadgen.Marker)+1))
		b.Events = append(b.Events, event.Event{Key: event.AppendDataKey(nil, event.RowKey(1, 4e9+int64(i)), ts), Value: big, CF: event.CFDefault})
		r.Value = event.EncodeBatch(nil, &b)
	case "invalid utf-8 in json":
		r.Value, r.Headers = []byte(`{"regionId":"9000","events":[{"key":"`+loadgen.Marker+"\xff\xfe"+`"}]}`), jsonHeader
	case "non-table key":
		b.Events = []event.Event{{Key: event.AppendDataKey(nil, []byte("x"+loadgen.Marker+strconv.Itoa(i)), ts), Value: []byte(loadgen.Marker), CF: event.CFDefault}}
		r.Value = event.EncodeBatch(nil, &b)
	}
	return r
}

// badClient is a Kafka client that produces to the partition each record
// names.
func badClient(t testing.TB, brokers string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(testenv.ApplyTopic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

type badSource struct {
	partition int32
	offset    int64
}

// TestBadInput checks that 10k malformed apply records of every kind, mixed
// into a valid load, each land in the DLQ exactly once with their source and
// reason, while every valid event is backed up exactly once, no partition
// stalls and the consumer keeps running; flow DDL with names that try to
// escape their object path go to the DLQ as ddl_invalid and create nothing in
// Redis or GCS. Bad input must cost neither data nor availability
// (docs/FORMAT.md, "How an apply record is handled").
func TestBadInput(t *testing.T) {
	const partitions = 4
	malformed := 10_000
	c := startCluster(t, partitions)
	cfg := loadgen.Config{Events: 30_000, Tables: []int64{1, 2, 3}, Regions: 8, Seed: 7001, StartTime: time.Now().UTC().Add(-time.Hour)}
	want := expectedEvents(cfg, map[int64]bool{1: true, 2: true})
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f12", "--tables", "1,2")
	cons := c.startConsumer(t, "bad-1", "--max-value-size", strconv.Itoa(badMaxValue), "--flush-size", "1MiB")

	// Malformed records go out while the load runs.
	cl := badClient(t, c.Broker.Addr)
	var (
		mu       sync.Mutex
		sources  = map[badSource]int{} // -> kind
		noTable  int
		produced = make(chan error, 1)
	)
	start := time.Now()
	go func() {
		rng := rand.New(rand.NewPCG(7001, 1))
		var wg sync.WaitGroup
		var firstErr error
		bad := 0
		for i := 0; bad < malformed; i++ {
			k := i % len(badKinds)
			r := badRecord(rng, k, i, want.maxResolved)
			r.Partition = int32(i % partitions)
			if badKinds[k].reason == "" {
				noTable++
			} else {
				bad++
			}
			wg.Add(1)
			cl.Produce(context.Background(), r, func(r *kgo.Record, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if badKinds[k].reason != "" {
					sources[badSource{r.Partition, r.Offset}] = k
				}
			})
		}
		wg.Wait()
		produced <- firstErr
	}()
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	if err := <-produced; err != nil {
		t.Fatalf("produce malformed records: %v", err)
	}
	produceTook := time.Since(start)

	// Flow names that try to leave their object path, and one valid
	// control with the same shape.
	ddls := map[string][2]string{ // kafka key -> catalog, name
		"dotdot": {"default", ".."}, "slash": {"default", "a/b"}, "escaped": {"default", "%2F"},
		"unicode": {"default", "ü"}, "space": {"default", "a b"}, "long": {"default", strings.Repeat("a", 129)},
		"traversal": {"default", "../../etc"}, "catalog": {"..", "x"}, "control": {"default", "ok_ctl"},
	}
	var ddlRecs []*kgo.Record
	for key, cn := range ddls {
		v, err := json.Marshal(map[string]any{"op": "create", "flow": map[string]any{
			"catalog_name": cn[0], "flow_name": cn[1], "source_table_ids": []int{1},
			"sink_table_name": map[string]string{"catalog_name": "default", "schema_name": "public", "table_name": "sink"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		ddlRecs = append(ddlRecs, &kgo.Record{Topic: testenv.DDLTopic, Key: []byte(key), Value: v})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, ddlRecs...).FirstErr(); err != nil {
		t.Fatalf("produce ddl: %v", err)
	}

	// No partition stalls: Redis offsets reach the end offsets.
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	adm := newAdmin(t, c.Broker.Addr)
	defer adm.Close()
	waitFor(t, 90*time.Second, func() (bool, string) {
		end, err := listEndOffsets(ctx, adm)
		if err != nil {
			return false, err.Error()
		}
		for p := range int32(partitions) {
			e, _ := end.Lookup(testenv.ApplyTopic, p)
			if o, _, err := store.Offset(ctx, testenv.ApplyTopic, p); err != nil || o != e.Offset {
				return false, fmt.Sprintf("partition %d: Redis offset %d (%v), end %d", p, o, err, e.Offset)
			}
		}
		return true, ""
	})
	drained := time.Since(start)
	id := waitFlowCheckpoint(ctx, t, store, "f12", want.maxResolved, 30*time.Second)
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", store, partitions)
	t.Logf("%d malformed + %d non-table records produced in %v alongside the load; all partitions committed to the end after %v",
		malformed, noTable, produceTook, drained)

	// Every malformed record is in the DLQ once, with its source and reason.
	dlq := consumeAll(t, c.Broker.Addr, testenv.DLQTopic, malformed+len(ddls)-1)
	seen := map[badSource]bool{}
	ddlRejected := map[string]bool{}
	for _, r := range dlq {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		p, perr := strconv.ParseInt(h[event.HeaderSourcePartition], 10, 32)
		off, oerr := strconv.ParseInt(h[event.HeaderSourceOffset], 10, 64)
		if perr != nil || oerr != nil {
			t.Fatalf("DLQ record %d/%d: bad source headers %v", r.Partition, r.Offset, h)
		}
		if h[event.HeaderSourceTopic] == testenv.DDLTopic {
			if !strings.HasPrefix(h[event.HeaderError], meta.ReasonDDLInvalid) {
				t.Errorf("DDL %q rejected with %q, want %s", r.Key, h[event.HeaderError], meta.ReasonDDLInvalid)
			}
			ddlRejected[string(r.Key)] = true
			continue
		}
		src := badSource{int32(p), off}
		k, ok := sources[src]
		switch {
		case h[event.HeaderSourceTopic] != testenv.ApplyTopic || !ok:
			t.Errorf("DLQ record from %s %d/%d (%q) was not produced malformed", h[event.HeaderSourceTopic], p, off, h[event.HeaderError])
		case seen[src]:
			t.Errorf("source %d/%d in the DLQ twice", p, off)
		case !strings.HasPrefix(h[event.HeaderError], badKinds[k].reason):
			t.Errorf("%s at %d/%d: DLQ reason %q, want %s", badKinds[k].name, p, off, h[event.HeaderError], badKinds[k].reason)
		}
		seen[src] = true
	}
	if len(seen) != malformed || len(sources) != malformed {
		t.Errorf("DLQ holds %d distinct apply sources, %d malformed records produced (%d sent)", len(seen), malformed, len(sources))
	}
	for key := range ddls {
		if ddlRejected[key] != (key != "control") {
			t.Errorf("DDL %s (%q): rejected %v", key, ddls[key], ddlRejected[key])
		}
	}
	t.Logf("DLQ: %d apply records (of %d malformed), %d DDL records", len(seen), malformed, len(ddlRejected))

	// Nothing of the rejected names in Redis or GCS.
	rdb := c.Redis.Client(t)
	names, err := rdb.Keys(ctx, "*flow:name:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 || !badHasAll(names, ":default:f12", ":default:ok_ctl") {
		t.Errorf("flow names in Redis: %v, want default:f12 and default:ok_ctl", names)
	}
	if n, err := rdb.SCard(ctx, "flowlog:{flowlog}:flows").Result(); err != nil || n != 2 {
		t.Errorf("flows set has %d members (%v), want 2", n, err)
	}
	bucket, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatalf("gcs bucket: %v", err)
	}
	defer bucket.Close()
	objects := 0
	// A flow's own objects (its catalog, and layout v1's data, metas and
	// checkpoints) live under its directory; layout v2's shared data
	// objects, metas and global checkpoint name no flow at all.
	allowed := []string{sink.FlowDir("", "default", "f12"), sink.FlowDir("", "default", "ok_ctl"),
		sink.V2LogDir(""), sink.V2MetaDir(""), path.Dir(sink.CheckpointPathV2("", "flowlog")) + "/"}
	if err := bucket.Iter(ctx, "", func(name string) error {
		objects++
		if !slices.ContainsFunc(allowed, func(p string) bool { return strings.HasPrefix(name, p) }) {
			t.Errorf("object outside the valid flows and the shared layout v2 directories: %q", name)
		}
		return nil
	}); err != nil {
		t.Fatalf("list bucket: %v", err)
	}

	// Every valid event of tables 1 and 2 in exactly one referenced chunk;
	// nothing of a malformed record.
	got := readFlowBackup(ctx, t, store, bucket, id)
	opsCompareEvents(t, "valid load", got.events, want.events)
	m := scrapeMetrics(t, "http://"+cons.Addr)
	if v, _ := m.get("flowlog_events_total", `result="skipped"`, `reason="no_table"`); int(v) != noTable {
		t.Errorf("events_total{skipped,no_table} = %v, want %d", v, noTable)
	}
	if v, _ := m.get("flowlog_dlq_records_total"); int(v) != malformed+len(ddls)-1 {
		t.Errorf("dlq_records_total = %v, want %d", v, malformed+len(ddls)-1)
	}
	t.Logf("backup: %d metas, %d chunks, %d entries (= %d valid events of tables 1, 2); %d objects in GCS", got.metas, got.chunks, got.entries, want.total, objects)

	if !cons.Running() {
		t.Fatalf("consumer exited: %v", cons.Wait())
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
	logsCheckRedacted(t, cons, cfg)
}

// badHasAll reports whether every suffix ends one of names.
func badHasAll(names []string, suffixes ...string) bool {
	for _, s := range suffixes {
		found := false
		for _, n := range names {
			found = found || strings.HasSuffix(n, s)
		}
		if !found {
			return false
		}
	}
	return true
}
