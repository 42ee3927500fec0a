package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// recoverReadyz returns p's /readyz status code and body.
func recoverReadyz(p *proc) (int, string) {
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + p.Addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// recoverWaitStopped waits until p answers /readyz 503 naming the lost
// owner key and `consumer recover`.
func recoverWaitStopped(t *testing.T, p *proc) {
	t.Helper()
	waitForOrStop(t, 60*time.Second, func() (bool, string, error) {
		code, body := recoverReadyz(p)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "owner key") && strings.Contains(body, "consumer recover") {
			return true, "", nil
		}
		if !p.Running() {
			return false, "", fmt.Errorf("%s exited: %v", p.name, p.Wait())
		}
		return false, fmt.Sprintf("%s /readyz %d %q", p.name, code, body), nil
	})
}

// recoverDuplicates is the count the plan gives of the duplicates it
// cannot avoid.
var recoverDuplicates = regexp.MustCompile(`duplicates the choice cannot avoid: (\d+) records`)

// TestRecoverAfterFlushAll: two replicas back up a load in layout v2;
// Redis is flushed in the middle. Both replicas stop committing and go
// unready naming the cause, with one log line each, and write nothing to
// the empty Redis; a third replica started then refuses to start and
// names `consumer recover`. `consumer recover` rebuilds Redis from the
// bucket and the group's Kafka offsets, the replicas are restarted and
// consume the rest. Then restore equals the oracle, every produced event
// is in exactly one referenced chunk (the duplicates the plan reports it
// could not avoid: none here, since the cycles the flush caught uploaded
// and were never committed hold ranges nothing else holds), verify is
// clean, and every partition's Redis offset is its end offset.
func TestRecoverAfterFlushAll(t *testing.T) {
	c := startCluster(t, 4)
	cfg := loadgen.Config{
		Events: 24_000, Tables: []int64{1, 2, 3}, Regions: 16, ValueSize: 200, Seed: 1806,
		StartTime: time.Date(2026, 3, 3, 23, 59, 50, 0, time.UTC), HeartbeatEvery: 8,
	}
	st := expectLoad(cfg)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "rec", "--tables", "1,2")
	args := []string{"--session-timeout", crashSessionTimeout, "--flush-interval", "1s", "--flush-size", "1MiB"}
	cons := []*proc{c.startConsumer(t, "rec-1", args...), c.startConsumer(t, "rec-2", args...)}
	for _, p := range cons {
		crashWaitAssigned(t, p, 0, 30*time.Second)
	}
	load := crashLoadAsync(t, c, cfg, float64(st.events)/20)

	ctx := context.Background()
	rdb := c.Redis.Client(t)
	store := meta.NewStore(rdb, "flowlog", nil)
	waitForOrStop(t, 60*time.Second, func() (bool, string, error) {
		id, ok, err := store.FlowIDByName(ctx, "default", "rec")
		if err != nil || !ok {
			return false, "flow not created yet", nil
		}
		n, err := rdb.ZCard(ctx, store.Keys().Metas(id)).Result()
		if err != nil || n < 4 {
			return false, fmt.Sprintf("%d metas committed (%v)", n, err), nil
		}
		// Until its first catalog is in the bucket, nothing there names
		// the flow: recover could not bring it back.
		if cats, err := objectNames(c, sink.CatalogDir("", "default", "rec")); err != nil || len(cats) == 0 {
			return false, fmt.Sprintf("no catalog of the flow in the bucket yet (%v)", err), nil
		}
		return true, "", nil
	})
	if load.Done() {
		t.Fatal("the load finished before the flush: the test would prove nothing")
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const stopLine = "stopped: Redis lost this prefix's state; nothing more is committed until `consumer recover` rebuilds it and the consumer restarts"
	for _, p := range cons {
		recoverWaitStopped(t, p)
		// /readyz reports the loss as soon as the consumer notes it; the
		// log line follows when its session has ended.
		waitForOrStop(t, 30*time.Second, func() (bool, string, error) {
			n := len(crashLogLines(p, 0, stopLine))
			return n > 0, fmt.Sprintf("%s has not logged the stop yet", p.name), nil
		})
	}
	load.Wait(t)
	for _, p := range cons {
		if n := len(crashLogLines(p, 0, stopLine)); n != 1 {
			t.Errorf("%s logged the stop %d times, want once", p.name, n)
		}
	}
	if keys, err := rdb.Keys(ctx, "*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("Redis holds keys %q after the replicas stopped (%v): they wrote to the flushed Redis", keys, err)
	}
	third := newProc(t, "rec-3", binary(t, "consumer"), append([]string{"run"}, overrideArgs(c.consumerArgs(t, "rec-3"), append(args, "--http-addr", "")...)...)...)
	third.Start()
	if err := third.Wait(); err == nil || !strings.Contains(third.Log(), "consumer recover") {
		t.Fatalf("a replica started on the flushed Redis: exit %v, log:\n%s", err, third.logTail(2000))
	}
	for _, p := range cons {
		_ = p.Stop() // exits non-zero: it stopped for the lost state
	}

	res := oracleRun(t, "recover", append(c.oracleConn(), "--brokers", c.Broker.Addr))
	if res.code != 0 {
		t.Fatalf("consumer recover exited %d:\n%s", res.code, res.out)
	}
	t.Logf("consumer recover:\n%s", res.out)
	m := recoverDuplicates.FindStringSubmatch(res.out)
	if m == nil {
		t.Fatalf("the plan does not count the duplicates it cannot avoid:\n%s", res.out)
	}
	dups, _ := strconv.Atoi(m[1])
	for _, p := range cons {
		from := len(p.Log())
		p.Start()
		crashWaitAssigned(t, p, from, 30*time.Second)
	}
	rep := oracleCheck(t, c, "rec", []int64{1, 2}, cfg)
	t.Logf("recover: %d events in %d records, %d unavoidable duplicate records reported; %s", st.events, st.records, dups, rep)
	if dups != 0 {
		t.Errorf("the plan reports %d duplicate records; this history has none it could not avoid", dups)
	}
	crashCheckOffsetsAtEnd(t, c)
	for _, p := range cons {
		if err := p.Stop(); err != nil {
			t.Errorf("%s exit after SIGTERM: %v", p.name, err)
		}
	}
}

// objectNames lists the objects of the bucket under dir.
func objectNames(c *cluster, dir string) ([]string, error) {
	var out []string
	it := c.GCS.Client.Bucket(c.GCS.Bucket).Objects(context.Background(), &storage.Query{Prefix: dir})
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", dir, err)
		}
		out = append(out, a.Name)
	}
}

// recoverObjects maps every object of the bucket to its CRC32C and size.
func recoverObjects(t *testing.T, c *cluster) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	it := c.GCS.Client.Bucket(c.GCS.Bucket).Objects(ctx, nil)
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out
		}
		if err != nil {
			t.Fatalf("list the bucket: %v", err)
		}
		out[a.Name] = fmt.Sprintf("crc32c %08x size %d", a.CRC32C, a.Size)
	}
}

// TestMigrateV1ToV2: a layout v1 deployment upgrades by restarting its
// replica on this build without --layout (v2 is the default). Nothing written before is rewritten (every v1
// object keeps its name, size and checksum), new cycles are written in
// layout v2, and a restore at the final checkpoint equals the oracle of
// both loads, every event in exactly one referenced chunk across the v1
// and v2 metas. Then Redis is flushed and rebuilt with `consumer recover`
// (the catalogs the v2 start wrote describe the flow, v1 history
// included): the restore equals the oracle again.
func TestMigrateV1ToV2(t *testing.T) {
	c := startCluster(t, 4)
	start := time.Date(2026, 3, 5, 12, 0, 0, 0, time.UTC)
	cfg1 := loadgen.Config{Events: 8_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 300, Seed: 6101, StartTime: start, HeartbeatEvery: 4}
	cfg2 := loadgen.Config{Events: 8_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 100, Seed: 6102, StartTime: start.Add(time.Hour), HeartbeatEvery: 4}
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "mig", "--tables", "1,2")
	p := c.startConsumer(t, "mig-1", "--layout", "v1")
	crashWaitAssigned(t, p, 0, 30*time.Second)
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg1)...)...)
	rep1 := oracleCheck(t, c, "mig", []int64{1, 2}, cfg1)
	t.Logf("layout v1: %s", rep1)
	if err := p.Stop(); err != nil {
		t.Fatalf("stop the v1 replica: %v", err)
	}
	v1 := recoverObjects(t, c)
	for name := range v1 {
		if strings.Contains(name, "v2/") {
			t.Fatalf("the v1 replica wrote %s", name)
		}
	}

	p = c.startConsumer(t, "mig-1") // the default layout, v2
	crashWaitAssigned(t, p, 0, 30*time.Second)
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg2)...)...)
	rep2 := oracleCheck(t, c, "mig", []int64{1, 2}, cfg1, cfg2)
	t.Logf("after the upgrade: %s", rep2)
	after := recoverObjects(t, c)
	v2metas := 0
	for name, sum := range after {
		if strings.Contains(name, "v2/meta/") {
			v2metas++
		}
		if old, ok := v1[name]; ok && old != sum {
			t.Errorf("%s was rewritten: %s, now %s", name, old, sum)
		}
	}
	for name := range v1 {
		if _, ok := after[name]; !ok {
			t.Errorf("%s of layout v1 is gone after the upgrade", name)
		}
	}
	if v2metas == 0 {
		t.Errorf("no layout v2 meta after the upgrade")
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("stop the v2 replica: %v", err)
	}

	rdb := c.Redis.Client(t)
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	res := oracleRun(t, "recover", append(c.oracleConn(), "--brokers", c.Broker.Addr))
	if res.code != 0 {
		t.Fatalf("consumer recover exited %d:\n%s", res.code, res.out)
	}
	t.Logf("consumer recover:\n%s", res.out)
	p = c.startConsumer(t, "mig-1")
	crashWaitAssigned(t, p, 0, 30*time.Second)
	rep3 := oracleCheck(t, c, "mig", []int64{1, 2}, cfg1, cfg2)
	t.Logf("after recover: %s", rep3)
	crashCheckOffsetsAtEnd(t, c)
	if err := p.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}
