package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink/gcs"
)

// faultFlow is the flow every fault test backs up: tables 1 and 2 of loads
// over tables 1, 2 and 3.
const faultFlow = "f12"

var faultTables = map[int64]bool{1: true, 2: true}

// faultLoad is a load of n events over tables 1-3 starting at start.
func faultLoad(n int, seed int64, start time.Time) loadgen.Config {
	return loadgen.Config{Events: n, Tables: []int64{1, 2, 3}, Regions: 8, Seed: seed, StartTime: start}
}

// faultExpect is the union of the expected events of loads.
func faultExpect(loads ...loadgen.Config) wantEvents {
	w := wantEvents{events: map[eventKey]int{}}
	for _, cfg := range loads {
		e := expectedEvents(cfg, faultTables)
		for k, n := range e.events {
			w.events[k] += n
		}
		w.total += e.total
		w.maxResolved = max(w.maxResolved, e.maxResolved)
	}
	return w
}

// faultCheckBackup waits until the flow's checkpoint covers want, then reads
// every referenced chunk straight from GCS (not through any proxy) and
// checks that every expected event is stored exactly once and nothing
// else; it returns the backup and the number of duplicates found.
func faultCheckBackup(t *testing.T, c *cluster, want wantEvents, timeout time.Duration) (flowBackup, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	id := waitFlowCheckpoint(ctx, t, store, faultFlow, want.maxResolved, timeout)
	bucket, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatalf("gcs bucket: %v", err)
	}
	defer bucket.Close()
	got := readFlowBackup(ctx, t, store, bucket, id)
	missing, dup, extra := 0, 0, 0
	for k, n := range want.events {
		switch g := got.events[k]; {
		case g == 0:
			if missing++; missing <= 5 {
				t.Errorf("missing: %s", k)
			}
		case g != n:
			if dup += g - n; dup <= 5 {
				t.Errorf("%s stored %d times, produced %d", k, g, n)
			}
		}
	}
	for k, n := range got.events {
		if _, ok := want.events[k]; !ok {
			if extra += n; extra <= 5 {
				t.Errorf("extra entry: %s", k)
			}
		}
	}
	if missing+dup+extra > 0 || got.entries != want.total {
		t.Errorf("%d events missing, %d duplicates, %d extra; %d entries read, %d expected", missing, dup, extra, got.entries, want.total)
	}
	return got, dup
}

// faultMetric returns the value of the sample of metric name with exactly
// the labels labels (Prometheus text form, e.g. `flow="default/f12"`) on
// the consumer's /metrics, and whether it is there.
func faultMetric(t testing.TB, addr, name, labels string) (float64, bool) {
	t.Helper()
	series := name
	if labels != "" {
		series = name + "{" + labels + "}"
	}
	v, ok := scrapeMetrics(t, "http://"+addr)[series]
	return v, ok
}

// faultStatus returns the consumer's /status document.
func faultStatus(addr string) (pipeline.Status, error) {
	var st pipeline.Status
	cl := &http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + addr + "/status")
	if err != nil {
		return st, fmt.Errorf("get /status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("get /status: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("decode /status: %w", err)
	}
	return st, nil
}

// mustFaultStatus is faultStatus for the test goroutine outside a poll: a
// /status that does not answer fails the test.
func mustFaultStatus(t testing.TB, addr string) pipeline.Status {
	t.Helper()
	st, err := faultStatus(addr)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// faultNextOffsets is the sum of the next offsets of the consumer's
// partitions.
func faultNextOffsets(st pipeline.Status) int64 {
	var n int64
	for _, p := range st.Partitions {
		n += max(p.Next, 0)
	}
	return n
}

// faultDirBytes sums the sizes of the regular files under dir.
func faultDirBytes(dir string) (files int, bytes int64) {
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || d.Name() == ".flowlog-temp" { // not the marker
			return nil
		}
		if info, err := d.Info(); err == nil {
			files++
			bytes += info.Size()
		}
		return nil
	})
	return files, bytes
}

// faultFlowState reads the state of faultFlow from store. The flow is
// created by a DDL record that the consumer applies asynchronously, so a
// flow not (yet) in Redis is an error like any other: inside a poll it
// means "not yet".
func faultFlowState(store *meta.Store) (meta.FlowState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, faultFlow)
	if err != nil {
		return meta.FlowState{}, fmt.Errorf("flow %s: %w", faultFlow, err)
	}
	if !ok {
		return meta.FlowState{}, fmt.Errorf("flow %s not created yet", faultFlow)
	}
	st, err := store.FlowState(ctx, id)
	if err != nil {
		return meta.FlowState{}, fmt.Errorf("flow %s: %w", faultFlow, err)
	}
	return st, nil
}

// faultWaitStatus waits until faultFlow has status want.
func faultWaitStatus(t testing.TB, store *meta.Store, want string, timeout time.Duration, what func() string) {
	t.Helper()
	waitFor(t, timeout, func() (bool, string) {
		st, err := faultFlowState(store)
		if err != nil {
			return false, fmt.Sprintf("%v %s", err, what())
		}
		return st.Status == want, fmt.Sprintf("flow status %q, want %q %s", st.Status, want, what())
	})
}

// TestGCSFaultsPartial: half of the GCS writes fail (503s and connection
// resets) for ~10 s during a load, then GCS is healthy again; the consumer
// recovers by itself and nothing is lost or stored twice.
func TestGCSFaultsPartial(t *testing.T) {
	const partitions = 4
	c := startCluster(t, partitions)
	proxy := startFaultProxy(t, c.GCS.Addr)
	load := faultLoad(40_000, 501, time.Date(2026, 4, 1, 10, 0, 0, 0, time.UTC))
	want := faultExpect(load)

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	proxy.setFaults(0.5, faultMixed)
	cons := c.startConsumer(t, "consumer-1", "--gcs-endpoint", proxy.Addr, "--flush-interval", "1s", "--flush-size", "1MiB",
		"--retry-backoff", "50ms", "--max-retry-delay", "500ms")
	healed := time.AfterFunc(10*time.Second, func() { proxy.setFaults(0, fault503) })
	defer healed.Stop()
	// ~13 s of load, so that cycles run all through the fault window.
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr, "--rate", "3000"}, loadArgs(load)...)...)
	waitFor(t, 20*time.Second, func() (bool, string) {
		return proxy.injected() > 0 && math0(proxy.failRate.Load()),
			fmt.Sprintf("fault window: %d of %d writes failed, %d requests", proxy.injected(), proxy.writes.Load(), proxy.requests.Load())
	})

	got, dup := faultCheckBackup(t, c, want, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", meta.NewStore(c.Redis.Client(t), "flowlog", nil), partitions)
	failures, _ := faultMetric(t, cons.Addr, "flowlog_flush_failures_total", `flow="default/`+faultFlow+`"`)
	if st, err := faultFlowState(meta.NewStore(c.Redis.Client(t), "flowlog", nil)); err != nil || st.Status == meta.StatusFatal {
		t.Errorf("flow after a partial outage: status %q (%s), %v", st.Status, st.Error, err)
	}
	t.Logf("GCS partial faults: %d events produced (%d of the flow), %d backed up in %d chunks of %d metas; "+
		"%d of %d write requests failed (%d 503s, %d resets); %v failed flush attempts; %d duplicates",
		expectLoad(load).events, want.total, got.entries, got.chunks, got.metas,
		proxy.injected(), proxy.writes.Load(), proxy.failed503.Load(), proxy.resets.Load(), failures, dup)
	if !cons.Running() {
		t.Fatalf("consumer exited: %v", cons.Wait())
	}
}

func math0(bits uint64) bool { return bits == 0 }

// faultSumEnd is the total of the apply topic's end offsets.
func faultSumEnd(end kadm.ListedOffsets) int64 {
	var n int64
	end.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// TestGCSFaultsFatal: every GCS write fails. After --fatal-after (30)
// failed cycles the flow is fatal (Redis, flow_fatal 1), fetching stops
// (fetching_paused, offsets stand still while the topic grows) and the temp
// files stay; once GCS is healthy and the flow is resumed, everything is
// flushed, nothing is lost, the flow is active and flow_fatal 0.
func TestGCSFaultsFatal(t *testing.T) {
	const partitions = 4
	c := startCluster(t, partitions)
	proxy := startFaultProxy(t, c.GCS.Addr)
	first := faultLoad(10_000, 502, time.Date(2026, 4, 2, 10, 0, 0, 0, time.UTC))
	second := faultLoad(10_000, 503, time.Date(2026, 4, 2, 11, 0, 0, 0, time.UTC))
	want := faultExpect(first, second)
	label := `flow="default/` + faultFlow + `"`

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	proxy.setFaults(1, faultMixed)
	tempDir := filepath.Join(t.TempDir(), "temp")
	cons := c.startConsumer(t, "consumer-1", "--gcs-endpoint", proxy.Addr, "--temp-dir", tempDir,
		"--fatal-after", "30", "--retry-backoff", "20ms", "--max-retry-delay", "100ms")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(first)...)...)

	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	faultWaitStatus(t, store, meta.StatusFatal, 60*time.Second, func() string {
		return fmt.Sprintf("after %d injected faults", proxy.injected())
	})
	injectedAtFatal := proxy.injected()
	if v, ok := faultMetric(t, cons.Addr, "flowlog_flow_fatal", label); !ok || v != 1 {
		t.Errorf("flowlog_flow_fatal{%s} = %v (present %v), want 1", label, v, ok)
	}
	failures, _ := faultMetric(t, cons.Addr, "flowlog_flush_failures_total", label)
	if failures < 30 {
		t.Errorf("flowlog_flush_failures_total{%s} = %v at fatal, want >= 30", label, failures)
	}
	waitFor(t, 10*time.Second, func() (bool, string) {
		st, err := faultStatus(cons.Addr)
		if err != nil {
			return false, err.Error()
		}
		return st.Paused, "/status fetching_paused is false"
	})

	// The second load arrives while fetching is stopped: offsets stand
	// still, the temp files stay. What is checked is that something does
	// NOT happen, so no condition can end the wait: the 3 s are three
	// flush intervals and many fetch polls in which a consumer that still
	// fetched would move its offsets.
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(second)...)...)
	before := faultNextOffsets(mustFaultStatus(t, cons.Addr))
	time.Sleep(3 * time.Second)
	st := mustFaultStatus(t, cons.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	end, _ := applyOffsets(ctx, t, c.Broker.Addr, "flowlog")
	if after := faultNextOffsets(st); after != before || after >= faultSumEnd(end) || !st.Paused {
		t.Errorf("while fatal: next offsets %d -> %d (end %d), paused %v: fetching did not stop", before, after, faultSumEnd(end), st.Paused)
	}
	files, bytes := faultDirBytes(tempDir)
	if files == 0 || bytes == 0 {
		t.Errorf("temp dir holds %d files, %d bytes while the flow is fatal; want the unflushed data", files, bytes)
	}
	t.Logf("fatal after %d injected write faults, %v failed cycles; %d temp files, %d bytes kept; offsets at %d of %d",
		injectedAtFatal, failures, files, bytes, before, faultSumEnd(end))

	proxy.setFaults(0, fault503)
	runProducer(t, "flow", "resume", "--brokers", c.Broker.Addr, "--name", faultFlow)
	faultWaitStatus(t, store, meta.StatusActive, 30*time.Second, func() string { return "after resume" })
	got, dup := faultCheckBackup(t, c, want, 60*time.Second)
	// A context of its own: the one above may have run out during the
	// resume and the backup check.
	endCtx, endCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer endCancel()
	checkOffsetsAtEnd(endCtx, t, c.Broker.Addr, "flowlog", store, partitions)
	if st, err := faultFlowState(store); err != nil || st.Status != meta.StatusActive {
		t.Errorf("flow status %q (%v) after resume, want active", st.Status, err)
	}
	if v, ok := faultMetric(t, cons.Addr, "flowlog_flow_fatal", label); !ok || v != 0 {
		t.Errorf("flowlog_flow_fatal{%s} = %v (present %v) after resume, want 0", label, v, ok)
	}
	t.Logf("GCS outage: %d events produced, %d of the flow, %d backed up in %d chunks; %d write faults injected; %d duplicates",
		expectLoad(first).events+expectLoad(second).events, want.total, got.entries, got.chunks, proxy.injected(), dup)
}

// faultStartRedis starts a redis-server process that persists every write
// (append-only file, fsync always), so that it keeps its data across a
// SIGKILL and restart on the same port; testenv.Redis.Restart starts empty.
func faultStartRedis(t *testing.T) (*proc, *testenv.Redis) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not on PATH: %v", err)
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	p := newProc(t, "redis", bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", t.TempDir())
	p.ready = func(p *proc, _ int64) error {
		cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer cl.Close()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			err := cl.Ping(ctx).Err()
			cancel()
			if err == nil {
				p.Addr = addr
				return nil
			}
		}
		return fmt.Errorf("redis-server on %s did not answer PING", addr)
	}
	p.Start()
	return p, &testenv.Redis{Addr: addr, URL: "redis://" + addr + "/0"}
}

// TestRedisRestart: the consumer's redis-server is SIGKILLed twice during a
// load and restarted on the same port after a few seconds (its data
// persisted). Commits wait and retry: nothing is lost, nothing committed
// twice, and the Redis and Kafka offsets end at the end offsets.
func TestRedisRestart(t *testing.T) {
	const partitions = 4
	rp, rds := faultStartRedis(t)
	c := &cluster{Broker: startBroker(t, partitions), GCS: startGCS(t), Redis: rds}
	load := faultLoad(40_000, 504, time.Date(2026, 4, 3, 10, 0, 0, 0, time.UTC))
	want := faultExpect(load)

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--flush-size", "1MiB", "--retry-backoff", "50ms", "--max-retry-delay", "1s")
	outages := make(chan int, 1)
	go func() {
		n := 0
		defer func() { outages <- n }()
		for _, at := range []time.Duration{3 * time.Second, 5 * time.Second} {
			time.Sleep(at)
			rp.Kill()
			n++
			time.Sleep(3 * time.Second)
			if err := rp.start(); err != nil {
				t.Errorf("restart redis-server: %v", err)
				return
			}
		}
	}()
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr, "--rate", "3000"}, loadArgs(load)...)...)
	n := <-outages

	got, dup := faultCheckBackup(t, c, want, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", meta.NewStore(c.Redis.Client(t), "flowlog", nil), partitions)
	if !cons.Running() {
		t.Fatalf("consumer exited during the Redis outages: %v", cons.Wait())
	}
	retries, _ := faultMetric(t, cons.Addr, "flowlog_flush_cycles_total", `result="failed",trigger="interval"`)
	sizeRetries, _ := faultMetric(t, cons.Addr, "flowlog_flush_cycles_total", `result="failed",trigger="size"`)
	if retries += sizeRetries; retries == 0 {
		t.Errorf("no flush cycle failed across %d Redis outages of 3 s: the outages did not hit a commit", n)
	}
	t.Logf("Redis restarts: %d SIGKILL+restart of redis-server; %d events produced, %d of the flow, %d backed up in %d chunks of %d metas; %v failed (retried) cycles; %d duplicates",
		n, expectLoad(load).events, want.total, got.entries, got.chunks, got.metas, retries, dup)
}

// TestKafkaFaults: the broker (3 nodes) fails a share of fetch, produce and
// offset-commit requests with retriable errors and moves coordinators and
// partition leaders every few seconds, during the load and the backup;
// nothing is lost or stored twice. It runs on kfake whatever
// FLOWLOG_TEST_KAFKA says: one Apache Kafka node has no leaders to move and
// no way to fail a chosen share of requests with retriable errors
// (docs/TESTING.md, "Which broker").
func TestKafkaFaults(t *testing.T) {
	const partitions = 4
	broker := startKfakeBroker(t, partitions, "--nodes", "3",
		"--faults", "fetch=0.2,commit=0.3,produce=0.1,coordinator-move-every=5s,partition-move-every=5s")
	c := &cluster{Broker: broker, GCS: startGCS(t), Redis: testenv.StartRedis(t)}
	load := faultLoad(40_000, 505, time.Date(2026, 4, 4, 10, 0, 0, 0, time.UTC))
	want := faultExpect(load)

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--flush-size", "1MiB")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr, "--rate", "3000"}, loadArgs(load)...)...)

	got, dup := faultCheckBackup(t, c, want, 60*time.Second)
	// Redis holds the offsets (docs/FORMAT.md, "Kafka commit mirror"); the
	// Kafka commits mirror them and are not retried (pipeline.commitKafka),
	// so under commit faults they may stay behind, never ahead.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	end, committed := applyOffsets(ctx, t, c.Broker.Addr, "flowlog")
	kafkaBehind := int64(0)
	for p := range int32(partitions) {
		e, _ := end.Lookup(testenv.ApplyTopic, p)
		r, ok, err := store.Offset(ctx, testenv.ApplyTopic, p)
		if err != nil || !ok || r != e.Offset {
			t.Errorf("partition %d: Redis offset %d (set %v, %v), end offset %d", p, r, ok, err, e.Offset)
		}
		if k, ok := committed.Lookup(testenv.ApplyTopic, p); ok && k.Err == nil {
			if k.At > e.Offset {
				t.Errorf("partition %d: Kafka committed offset %d past the end %d", p, k.At, e.Offset)
			}
			kafkaBehind += e.Offset - k.At
		}
	}
	if !cons.Running() {
		t.Fatalf("consumer exited under broker faults: %v", cons.Wait())
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
	if err := broker.Stop(); err != nil {
		t.Errorf("broker exit: %v", err)
	}
	counts := ""
	for _, line := range strings.Split(broker.Log(), "\n") {
		if _, rest, ok := strings.Cut(line, "faults injected: "); ok {
			counts = rest
		}
	}
	if counts == "" || strings.Contains(counts, "fetch=0 ") {
		t.Errorf("broker reported faults %q; want fetch faults injected", counts)
	}
	t.Logf("Kafka faults: %d events produced, %d of the flow, %d backed up in %d chunks of %d metas; broker injected %s; %d duplicates; Kafka commits %d records behind Redis at the end",
		expectLoad(load).events, want.total, got.entries, got.chunks, got.metas, counts, dup, kafkaBehind)
}
