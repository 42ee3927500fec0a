package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/api/option"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
)

// gcsProc is a fake-gcs-server process with a client for reading what the
// consumer wrote.
type gcsProc struct {
	*proc
	Bucket string
	Client *storage.Client
}

// startGCS starts a filesystem-backed fake-gcs-server process (objects
// survive Restart) with bucket "flowlog" and returns it with a storage
// client pointed at it. The endpoint (host:port) is p.Addr.
func startGCS(t testing.TB) *gcsProc {
	t.Helper()
	p := newProc(t, "fakegcs", binary(t, "fakegcs"), "--port", "0", "--root", t.TempDir(), "--bucket", "flowlog")
	p.ready = waitForLine("fake-gcs-server listening on ")
	p.Start()
	cl, err := storage.NewClient(context.Background(),
		option.WithEndpoint("http://"+p.Addr+"/storage/v1/"), option.WithoutAuthentication(), storage.WithJSONReads())
	if err != nil {
		t.Fatalf("storage client: %v", err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return &gcsProc{proc: p, Bucket: "flowlog", Client: cl}
}

// runProducer runs the producer to completion with args and returns its
// combined output, failing the test on a non-zero exit.
func runProducer(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t, "producer"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("producer %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// cluster is the set of services a consumer runs against.
type cluster struct {
	Broker *broker
	GCS    *gcsProc
	Redis  *testenv.Redis
}

// startCluster starts a broker (apply topic of partitions partitions), a
// GCS emulator and a redis-server.
func startCluster(t testing.TB, partitions int) *cluster {
	t.Helper()
	return &cluster{Broker: startBroker(t, partitions), GCS: startGCS(t), Redis: testenv.StartRedis(t)}
}

// consumerArgs are the flags that connect a consumer named name to c, with
// a private temp dir, a fast flush interval and group "flowlog".
func (c *cluster) consumerArgs(t testing.TB, name string) []string {
	return []string{
		"--brokers", c.Broker.Addr,
		"--redis-url", c.Redis.URL,
		"--gcs-bucket", c.GCS.Bucket,
		"--gcs-endpoint", c.GCS.Addr,
		"--temp-dir", filepath.Join(t.TempDir(), name),
		"--group", "flowlog",
		"--flush-interval", "1s",
		"--flush-size", "4MiB",
		"--store-id", name,
		"--log-format", "json",
	}
}

// startConsumer starts `consumer run` connected to c; a flag of extra
// replaces the default of consumerArgs, so each flag is passed once.
func (c *cluster) startConsumer(t testing.TB, name string, extra ...string) *proc {
	t.Helper()
	return startConsumer(t, name, overrideArgs(c.consumerArgs(t, name), extra...)...)
}

// overrideArgs returns defaults ("--flag value" pairs) with each flag that
// extra also gives ("--flag value" or "--flag=value") set to extra's value
// in place, and extra's other arguments appended in order. A flag given
// twice would work (the last one wins) but reads as two settings in the
// consumer's start line.
func overrideArgs(defaults []string, extra ...string) []string {
	out := append([]string(nil), defaults...)
	at := map[string]int{} // flag -> index of its value in out
	for i := 0; i+1 < len(out); i += 2 {
		at[out[i]] = i + 1
	}
	for i := 0; i < len(extra); i++ {
		a := extra[i]
		if name, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") {
			if j, ok := at[name]; ok {
				out[j] = v
				continue
			}
		} else if j, ok := at[a]; ok && i+1 < len(extra) {
			out[j] = extra[i+1]
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// startConsumer starts `consumer run` with args, adding --http-addr on a
// free port unless given, and waits until /healthz answers. The HTTP
// address is p.Addr.
func startConsumer(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	return startConsumerBin(t, name, binary(t, "consumer"), args...)
}

// startConsumerBin is startConsumer of the consumer binary bin (another
// build than this tree's, for the upgrade scenarios). A free port it picks
// can be taken by another test's process before the consumer binds it; the
// consumer then exits with "address already in use", and it tries another
// port, up to 5.
func startConsumerBin(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	addr := ""
	for i, a := range args {
		if a == "--http-addr" && i+1 < len(args) {
			addr = args[i+1]
		} else if v, ok := strings.CutPrefix(a, "--http-addr="); ok {
			addr = v
		}
	}
	p := newProc(t, name, bin, append([]string{"run"}, args...)...)
	if addr != "" {
		p.ready = consumerReady(addr)
		p.Start()
		return p
	}
	err := testenv.OnPorts(consumerPort, func(port int) error {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p.args = append(append([]string{"run"}, args...), "--http-addr", addr)
		p.ready = consumerReady(addr)
		from := p.logSize()
		err := p.start()
		if err != nil && !strings.Contains(p.logFrom(from), "address already in use") {
			return testenv.StopTrying(err)
		}
		return err
	})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	return p
}

// consumerPort picks the port of a consumer's --http-addr when the test
// gives none (a test of the retry replaces it).
var consumerPort = testenv.FreePort

// consumerReady is a consumer's ready func: it waits until the consumer's
// log since its start says it listens, then until GET /healthz on addr
// answers 200. (A /healthz answered before that line could be another
// process's on the same port.)
func consumerReady(addr string) func(p *proc, from int64) error {
	health := waitForHTTP(addr, "/healthz")
	return func(p *proc, from int64) error {
		deadline := time.Now().Add(60 * time.Second)
		for !strings.Contains(p.logFrom(from), "http listening") {
			if p.hasExited() {
				return fmt.Errorf("exited before it listened on %s: %v", addr, p.Wait())
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no \"http listening\" in its log within 60s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		return health(p, from)
	}
}

// waitFor polls cond every 100ms until it returns true, failing the test
// with cond's last message after timeout. cond must not fail the test: an
// error it meets (a service that does not answer yet, a key not written
// yet) is "not yet", and its message is what the timeout reports.
func waitFor(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	waitForOrStop(t, timeout, func() (bool, string, error) {
		ok, msg := cond()
		return ok, msg, nil
	})
}

// waitForOrStop is waitFor for a condition that can also become impossible:
// cond returns a non-nil stop for an outcome that no waiting can change (the
// process it waits on exited, the flow turned fatal), and waitForOrStop
// fails the test with it at once instead of waiting out the timeout.
func waitForOrStop(t testing.TB, timeout time.Duration, cond func() (ok bool, msg string, stop error)) {
	t.Helper()
	start := time.Now()
	for {
		ok, msg, stop := cond()
		switch {
		case ok:
			return
		case stop != nil:
			t.Fatalf("gave up waiting after %v: %v", time.Since(start).Round(time.Millisecond), stop)
		case time.Since(start) > timeout:
			t.Fatalf("not within %v: %s", timeout, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// consumeAll reads topic from the start until want records arrived (and
// then briefly for any extra), failing the test after 30s. A fetch error
// is "not yet" (the client retries); the last one is reported on timeout.
func consumeAll(t testing.TB, brokers, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	var lastErr error
	deadline := time.Now().Add(30 * time.Second)
	for extra := false; ; {
		wait := time.Until(deadline)
		if extra {
			wait = 500 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				lastErr = err
			}
		})
		recs = append(recs, fs.Records()...)
		switch {
		case extra || len(recs) > want:
			return recs
		case len(recs) == want:
			extra = true
		case time.Now().After(deadline):
			t.Fatalf("read %d records of %s, want %d (last fetch error: %v)", len(recs), topic, want, lastErr)
		}
	}
}

// loadArgs are the `producer load` flags for every field of cfg (those of
// loadgen.Config.RegisterFlags), so that the producer generates exactly
// what loadgen computes locally from cfg. A zero field is passed as 0,
// which the producer, like loadgen, reads as the field's default.
func loadArgs(cfg loadgen.Config) []string {
	tables := make([]string, len(cfg.Tables))
	for i, tb := range cfg.Tables {
		tables[i] = strconv.FormatInt(tb, 10)
	}
	return []string{
		"--events", strconv.Itoa(cfg.Events), "--tables", strings.Join(tables, ","),
		"--regions", strconv.Itoa(cfg.Regions), "--rows", strconv.Itoa(cfg.Rows),
		"--value-size", strconv.Itoa(cfg.ValueSize), "--seed", strconv.FormatInt(cfg.Seed, 10),
		"--delete-ratio", strconv.FormatFloat(cfg.DeleteRatio, 'g', -1, 64), "--batch-size", strconv.Itoa(cfg.BatchSize),
		"--start-time", cfg.StartTime.Format(time.RFC3339Nano), "--heartbeat-every", strconv.Itoa(cfg.HeartbeatEvery),
	}
}

// TestLoadArgsRoundTrip checks that loadArgs drops no field: the producer's
// flags (loadgen.Config.RegisterFlags) parse its output back into cfg.
func TestLoadArgsRoundTrip(t *testing.T) {
	cfg := loadgen.Config{
		Events: 1234, Tables: []int64{1, 7}, Regions: 5, Rows: 99, ValueSize: 300, Seed: 42, DeleteRatio: -1,
		BatchSize: 17, StartTime: time.Date(2026, 3, 1, 10, 30, 0, 123456789, time.UTC), HeartbeatEvery: 3,
	}
	v := reflect.ValueOf(cfg)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("test config leaves %s zero: set it so that loadArgs is checked for it", v.Type().Field(i).Name)
		}
	}
	var got loadgen.Config
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	got.RegisterFlags(fs)
	if err := fs.Parse(loadArgs(cfg)); err != nil {
		t.Fatalf("parse %v: %v", loadArgs(cfg), err)
	}
	if !reflect.DeepEqual(got, cfg) {
		t.Fatalf("loadArgs(%+v) parses back as %+v", cfg, got)
	}
}

// TestOverrideArgs checks that a test's flag replaces the harness default in
// place instead of passing the flag a second time.
func TestOverrideArgs(t *testing.T) {
	defaults := []string{"--brokers", "b:1", "--gcs-endpoint", "g:1", "--temp-dir", "/t/d", "--flush-size", "4MiB"}
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
	}{
		{"none", nil, defaults},
		{"pairs", []string{"--gcs-endpoint", "p:2", "--temp-dir", "/x"},
			[]string{"--brokers", "b:1", "--gcs-endpoint", "p:2", "--temp-dir", "/x", "--flush-size", "4MiB"}},
		{"equals form", []string{"--flush-size=1MiB"},
			[]string{"--brokers", "b:1", "--gcs-endpoint", "g:1", "--temp-dir", "/t/d", "--flush-size", "1MiB"}},
		{"new flags kept in order", []string{"--redact-logs=false", "--fatal-after", "30", "--brokers", "b:2"},
			[]string{"--brokers", "b:2", "--gcs-endpoint", "g:1", "--temp-dir", "/t/d", "--flush-size", "4MiB", "--redact-logs=false", "--fatal-after", "30"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := overrideArgs(defaults, tc.extra...); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("overrideArgs(%q) =\n%q, want\n%q", tc.extra, got, tc.want)
			}
		})
	}
}

// loadStats is what a load produces, computed locally from its config.
type loadStats struct {
	records, events, mutations int
	maxResolved                uint64
}

func expectLoad(cfg loadgen.Config) loadStats {
	g := loadgen.New(cfg)
	var s loadStats
	for _, ok := g.Next(); ok; _, ok = g.Next() {
		s.records++
	}
	s.events, s.maxResolved, s.mutations = g.Events(), g.MaxResolvedTS(), len(loadgen.Mutations(cfg))
	return s
}

func TestHarnessProduceLoad(t *testing.T) {
	broker := startBroker(t, 4)
	start := time.Date(2022, 3, 7, 7, 0, 0, 0, time.UTC)
	loads := map[string]loadgen.Config{ // by --format
		"proto": {Events: 3000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 64, Seed: 11, StartTime: start},
		"json":  {Events: 1500, Tables: []int64{1, 2}, Regions: 5, ValueSize: 300, Seed: 12, StartTime: start},
	}
	want := map[string]loadStats{}
	total := 0
	for format, cfg := range loads {
		s := expectLoad(cfg)
		want[format], total = s, total+s.records
		out := runProducer(t, append([]string{"load", "--brokers", broker.Addr, "--format", format}, loadArgs(cfg)...)...)
		line := fmt.Sprintf("produced %d events in %d records", s.events, s.records)
		if !strings.Contains(out, line) || !strings.Contains(out, fmt.Sprintf("max resolved ts %d\n", s.maxResolved)) {
			t.Fatalf("%s load printed %q, want %q ... max resolved ts %d", format, out, line, s.maxResolved)
		}
	}

	check := func(t *testing.T, recs []*kgo.Record) {
		got := map[string]*loadStats{"proto": {}, "json": {}}
		partitionOf := map[string]int32{}
		for _, r := range recs {
			format := "proto"
			if event.IsJSON(event.ContentType(r)) {
				format = "json"
			}
			var b event.Batch
			if err := event.DecodeBatch(&b, r.Value, event.ContentType(r)); err != nil {
				t.Fatalf("%s record at %d/%d: %v", format, r.Partition, r.Offset, err)
			}
			if string(r.Key) != strconv.FormatUint(b.RegionID, 10) {
				t.Fatalf("record key %q for region %d", r.Key, b.RegionID)
			}
			if p, ok := partitionOf[string(r.Key)]; ok && p != r.Partition {
				t.Fatalf("region %s in partitions %d and %d", r.Key, p, r.Partition)
			}
			partitionOf[string(r.Key)] = r.Partition
			s := got[format]
			s.records++
			s.events += len(b.Events)
			s.maxResolved = max(s.maxResolved, b.ResolvedTS)
			for _, e := range b.Events {
				if e.CF != event.CFWrite {
					continue
				}
				if _, _, err := event.DecodeDataKey(e.Key); err != nil {
					t.Fatalf("write key %x: %v", e.Key, err)
				}
				if w, err := event.DecodeWrite(e.Value); err != nil {
					t.Fatalf("write record: %v", err)
				} else if w.Type != event.WriteRollback {
					s.mutations++
				}
			}
		}
		for format, w := range want {
			if *got[format] != w {
				t.Errorf("%s records: got %+v, want %+v", format, *got[format], w)
			}
		}
	}

	t.Run("read back", func(t *testing.T) {
		check(t, consumeAll(t, broker.Addr, testenv.ApplyTopic, total))
	})

	t.Run("broker restart keeps data", func(t *testing.T) {
		addr := broker.Addr
		if err := broker.Stop(); err != nil {
			t.Fatalf("broker exit after SIGTERM: %v", err)
		}
		broker.Restart(t)
		if broker.Addr != addr {
			t.Fatalf("restarted broker on %s, was %s", broker.Addr, addr)
		}
		check(t, consumeAll(t, broker.Addr, testenv.ApplyTopic, total))
	})

	t.Run("heartbeat", func(t *testing.T) {
		out := runProducer(t, "heartbeat", "--brokers", broker.Addr, "--regions", "3", "--ts", "12345")
		if !strings.Contains(out, "sent 3 heartbeats at resolved ts 12345") {
			t.Fatalf("heartbeat printed %q", out)
		}
		regions := map[string]bool{}
		for _, r := range consumeAll(t, broker.Addr, testenv.ApplyTopic, total+3) {
			var b event.Batch
			if err := event.DecodeBatch(&b, r.Value, event.ContentType(r)); err != nil {
				t.Fatal(err)
			}
			if b.ResolvedTS == 12345 && len(b.Events) == 0 {
				regions[string(r.Key)] = true
			}
		}
		if len(regions) != 3 || !regions["1"] || !regions["3"] {
			t.Fatalf("heartbeats for regions %v, want 1, 2, 3", regions)
		}
	})

	t.Run("gcs restart keeps objects", func(t *testing.T) {
		g := startGCS(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w := g.Client.Bucket(g.Bucket).Object("a/b.log").NewWriter(ctx)
		if _, err := w.Write([]byte("chunk")); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("write object: %v", err)
		}
		g.Restart()
		r, err := g.Client.Bucket(g.Bucket).Object("a/b.log").NewReader(ctx)
		if err != nil {
			t.Fatalf("read after restart: %v", err)
		}
		defer r.Close()
		if b, err := io.ReadAll(r); err != nil || string(b) != "chunk" {
			t.Fatalf("object after restart = %q, %v", b, err)
		}
	})
}

// TestHarnessConsumerLifecycle proves the consumer half of the harness:
// `consumer run` against the three service processes becomes healthy and
// ready, exits 0 on SIGTERM, and logs JSON without payload bytes.
func TestHarnessConsumerLifecycle(t *testing.T) {
	c := startCluster(t, 2)
	cfg := loadgen.Config{Events: 500, Tables: []int64{1}, Regions: 2, Seed: 3, StartTime: time.Now().UTC()}
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	cons := c.startConsumer(t, "consumer-1")
	waitFor(t, 30*time.Second, func() (bool, string) {
		resp, err := http.Get("http://" + cons.Addr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, "/readyz: " + resp.Status
	})
	if err := cons.Stop(); err != nil {
		t.Fatalf("consumer exit after SIGTERM: %v", err)
	}
	log := cons.Log()
	if strings.Contains(log, loadgen.Marker) {
		t.Errorf("consumer log contains payload bytes (marker %q)", loadgen.Marker)
	}
	jsonLines := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "{") && json.Valid([]byte(line)) {
			jsonLines++
		}
	}
	if jsonLines == 0 {
		t.Errorf("consumer log has no JSON lines")
	}
}
