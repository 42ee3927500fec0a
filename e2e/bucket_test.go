package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/api/iterator"

	"cloud.google.com/go/storage"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
)

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestWrongBucket: every command checks its bucket at start and names it
// in one line: `run` and `restore` against a bucket that does not exist,
// and `run` against one that refuses writes (its probe object), exit 1
// before doing anything else; after a normal start the probe object is
// gone, and a probe left behind (a run killed between its create and its
// delete) is not taken for a flow's object by verify, gc or restore.
func TestWrongBucket(t *testing.T) {
	c := startCluster(t, 2)
	conn := []string{"--redis-url", c.Redis.URL, "--gcs-endpoint", c.GCS.Addr}

	t.Run("run, no such bucket", func(t *testing.T) {
		code, _, stderr := cliRun(t, binary(t, "consumer"), nil, append([]string{"run", "--brokers", c.Broker.Addr, "--gcs-bucket", "nope",
			"--temp-dir", t.TempDir(), "--http-addr", ""}, conn...)...)
		want := `consumer run: gcs bucket "nope" at ` + c.GCS.Addr + ` does not exist (--gcs-bucket)`
		if code != 1 || lastLine(stderr) != want || strings.Contains(stderr, "consumer starting") {
			t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 ending with %q, before the consumer starts", code, stderr, want)
		}
	})
	t.Run("restore, no such bucket", func(t *testing.T) {
		code, stdout, stderr := cliRun(t, binary(t, "consumer"), nil, append([]string{"restore", "--gcs-bucket", "flowlgo",
			"--flow", "demo", "--out", t.TempDir()}, conn...)...)
		want := `consumer restore: gcs bucket "flowlgo" at ` + c.GCS.Addr + " does not exist (--gcs-bucket)\n"
		if code != 1 || stderr != want || stdout != "" {
			t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and the one line %q", code, stdout, stderr, want)
		}
	})
	t.Run("run, writes refused", func(t *testing.T) {
		proxy := startFaultProxy(t, c.GCS.Addr)
		proxy.setFaults(1, fault403)
		code, _, stderr := cliRun(t, binary(t, "consumer"), nil, "run", "--brokers", c.Broker.Addr, "--redis-url", c.Redis.URL,
			"--gcs-bucket", c.GCS.Bucket, "--gcs-endpoint", proxy.Addr, "--gcs-prefix", "p", "--temp-dir", t.TempDir(), "--http-addr", "")
		want := `consumer run: gcs bucket "flowlog" at ` + proxy.Addr + ` is not readable and writable under --gcs-prefix "p": create an object: `
		if code != 1 || !strings.HasPrefix(lastLine(stderr), want) || !strings.Contains(lastLine(stderr), "403") || proxy.injected() == 0 {
			t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and a last line starting %q naming the 403", code, stderr, want)
		}
	})

	// A normal run: its probe is created and deleted at start.
	cfg := loadgen.Config{Events: 2000, Tables: []int64{1}, Regions: 2, Seed: 2302, StartTime: time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)}
	stats := expectLoad(cfg)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f", "--tables", "1")
	cons := c.startConsumer(t, "consumer-1")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFlowCheckpoint(ctx, t, store, "f", stats.maxResolved, 60*time.Second)
	if err := cons.Stop(); err != nil {
		t.Fatalf("consumer exit after SIGTERM: %v", err)
	}
	if probes := bucketNames(ctx, t, c.GCS, ".probe/"); len(probes) != 0 {
		t.Errorf("the consumer's start left its probe objects %v", probes)
	}

	// A leftover probe: verify, gc and restore see no flow object in it.
	w := c.GCS.Client.Bucket(c.GCS.Bucket).Object(".probe/0123456789abcdef").NewWriter(ctx)
	if err := w.Close(); err != nil {
		t.Fatalf("write a leftover probe: %v", err)
	}
	if r := oracleRun(t, "verify", c.oracleConn(), "--flow", "f"); r.code != 0 || strings.Contains(r.out, ".probe") {
		t.Errorf("verify with a leftover probe: exit %d:\n%s", r.code, r.out)
	}
	r := oracleRun(t, "gc", c.oracleConn(), "--grace", "0s", "--dry-run")
	if r.code != 0 || strings.Contains(r.out, ".probe") || !strings.Contains(r.out, "would delete 0 unreferenced objects") {
		t.Errorf("gc --dry-run with a leftover probe: exit %d:\n%s", r.code, r.out)
	}
	if r := oracleRun(t, "gc", c.oracleConn(), "--grace", "0s"); r.code != 0 || len(bucketNames(ctx, t, c.GCS, ".probe/")) != 1 {
		t.Errorf("gc with a leftover probe: exit %d, or the probe was deleted:\n%s", r.code, r.out)
	}
	out := t.TempDir()
	if r := oracleRun(t, "restore", c.oracleConn(), "--flow", "f", "--out", out, "--force", "--temp-dir", t.TempDir()); r.code != 0 {
		t.Fatalf("restore with a leftover probe: exit %d:\n%s", r.code, r.out)
	}
	want := loadgen.Expected(loadgen.Mutations(cfg), ^uint64(0))
	if n := restoreCompare(t, out, map[int64]map[string]loadgen.Row{1: want[1]}); n == 0 {
		t.Errorf("restored no row")
	}
}

// bucketNames lists the names under prefix in g's bucket.
func bucketNames(ctx context.Context, t testing.TB, g *gcsProc, prefix string) []string {
	t.Helper()
	var names []string
	it := g.Client.Bucket(g.Bucket).Objects(ctx, &storage.Query{Prefix: prefix})
	for {
		a, err := it.Next()
		if err == iterator.Done {
			return names
		}
		if err != nil {
			t.Fatalf("list %s: %v", prefix, err)
		}
		names = append(names, a.Name)
	}
}

// TestStopWhileGCSRefuses stops the consumer (SIGTERM) while GCS refuses
// every upload: the stop ends within --shutdown-timeout (plus the start of
// a busy machine's process exit) with a non-zero exit and a line that names
// what it left uncommitted (cycles, partitions and offsets), and a restart
// once GCS accepts again backs the whole load up: nothing was lost.
func TestStopWhileGCSRefuses(t *testing.T) {
	c := startCluster(t, 2)
	proxy := startFaultProxy(t, c.GCS.Addr)
	cfg := loadgen.Config{Events: 3000, Tables: []int64{1}, Regions: 4, Seed: 2303, StartTime: time.Date(2026, 3, 4, 11, 0, 0, 0, time.UTC)}
	stats := expectLoad(cfg)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f", "--tables", "1")
	const timeout = 8 * time.Second
	cons := c.startConsumer(t, "consumer-1", "--gcs-endpoint", proxy.Addr, "--shutdown-timeout", timeout.String(), "--retry-backoff", "200ms")
	proxy.setFaults(1, fault503)
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	waitFor(t, 60*time.Second, func() (bool, string) {
		return strings.Contains(cons.Log(), "flush cycle failed"), "no failed flush cycle yet"
	})
	start := time.Now()
	err := cons.Stop()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("the consumer exited 0 although nothing could be committed:\n%s", cons.Log())
	}
	if took > timeout+5*time.Second {
		t.Errorf("the stop took %v with --shutdown-timeout %v", took, timeout)
	}
	line := lastLine(cons.Log())
	for _, want := range []string{"consumer run: final flush did not commit within --shutdown-timeout 8s: left ", " cycles (",
		"uncommitted, of partitions [flowlog.apply/", " offsets 0-", "nothing is lost", "last flush error: "} {
		if !strings.Contains(line, want) {
			t.Errorf("the last line lacks %q:\n%s", want, line)
		}
	}
	t.Logf("stopped in %v: %s", took.Round(time.Millisecond), line)

	proxy.setFaults(0, fault503)
	cons.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFlowCheckpoint(ctx, t, store, "f", stats.maxResolved, 90*time.Second)
	oracleCheck(t, c, "f", []int64{1}, cfg)
}
