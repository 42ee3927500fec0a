package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// TestOpsLifecycle checks that SIGTERM during a load exits 0 within
// --shutdown-timeout with everything consumed so far committed and the temp
// dir empty; a second signal right after the first exits 130 at once without
// committing. A last consumer then drains the rest, and the backup holds
// every event exactly once.
func TestOpsLifecycle(t *testing.T) {
	const partitions = 2
	c := startCluster(t, partitions)
	cfg := loadgen.Config{Events: 60_000, Tables: []int64{1, 2}, Regions: 6, Seed: 6002, StartTime: time.Now().UTC().Add(-time.Hour)}
	want := expectedEvents(cfg, map[int64]bool{1: true, 2: true})
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f1", "--tables", "1,2")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	bucket, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatalf("gcs bucket: %v", err)
	}
	defer bucket.Close()

	load := opsStartLoad(t, c, cfg, 6000) // ~10 s
	slow := []string{"--flush-interval", "1m", "--flush-size", "256MiB", "--max-temp-bytes", "1GiB"}

	// 1. SIGTERM during the load.
	tempDir := filepath.Join(t.TempDir(), "ops-term-temp")
	cons := c.startConsumer(t, "ops-term", append(slow, "--temp-dir", tempDir, "--shutdown-timeout", "20s")...)
	base := "http://" + cons.Addr
	var seen map[int32]int64
	cl := &http.Client{Timeout: 5 * time.Second}
	waitFor(t, 30*time.Second, func() (bool, string) {
		next, err := opsStatusNextWith(cl, base)
		if err != nil {
			return false, err.Error()
		}
		seen = next
		total := int64(0)
		for _, n := range seen {
			total += n
		}
		if total < 200 {
			return false, fmt.Sprintf("consumed offsets %v", seen)
		}
		// Unflushed data is held (in temp file buffers and the segment
		// file): the stop has something to flush. The gauge follows the
		// offsets a moment later, so "not yet" is not a failure.
		m, err := scrapeMetricsWith(cl, base)
		if err != nil {
			return false, err.Error()
		}
		held, _ := m.get("flowlog_temp_bytes")
		return held > 0, fmt.Sprintf("no unflushed temp bytes while consuming with a 1m flush interval (offsets %v)", seen)
	})
	start := time.Now()
	cons.Signal(syscall.SIGTERM)
	err = cons.Wait()
	took := time.Since(start)
	t.Logf("SIGTERM during the load: exit %v after %v", err, took)
	if err != nil || took > 25*time.Second {
		t.Fatalf("SIGTERM: exit %v after %v, want 0 within --shutdown-timeout 20s + 5s", err, took)
	}
	if !strings.Contains(cons.Log(), "consumer stopped cleanly") {
		t.Errorf("no clean-stop line in the log")
	}
	if n := opsTempFiles(t, tempDir); n != 0 {
		t.Errorf("%d temp files left after a graceful stop", n)
	}
	committed := opsRedisOffsets(ctx, t, store, partitions)
	for p, n := range seen {
		if committed[p] < n {
			t.Errorf("partition %d: Redis offset %d after SIGTERM, but %d were consumed before it", p, committed[p], n)
		}
	}
	id := waitFlowCheckpoint(ctx, t, store, "f1", 0, 5*time.Second)
	got := readFlowBackup(ctx, t, store, bucket, id)
	prefix := opsEventsBelow(t, c.Broker.Addr, committed)
	opsCompareEvents(t, "after SIGTERM", got.events, prefix)
	metasBefore := got.metas

	// 2. A second signal right after the first: exit 130 at once, nothing
	// committed.
	cons2 := c.startConsumer(t, "ops-twice", append(slow, "--session-timeout", "6s")...) // it dies in the group
	waitFor(t, 30*time.Second, func() (bool, string) {
		next, err := opsStatusNextWith(cl, "http://"+cons2.Addr)
		if err != nil {
			return false, err.Error()
		}
		for p, n := range next {
			if n > committed[p]+100 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("consumed %v, committed %v", next, committed)
	})
	// GCS is frozen so that the final flush cannot finish; the second
	// signal is sent once the first has been taken (two pending SIGTERMs
	// would merge into one).
	c.GCS.Signal(syscall.SIGSTOP)
	cons2.Signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(cons2.Log(), "signal received"), "no signal line in the log"
	})
	start = time.Now()
	cons2.Signal(syscall.SIGTERM)
	err = cons2.Wait()
	took = time.Since(start)
	c.GCS.Signal(syscall.SIGCONT)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 || took > 3*time.Second {
		t.Fatalf("two SIGTERMs: exit %v after %v, want code 130 at once", err, took)
	}
	t.Logf("second SIGTERM: exit 130 %v after it", took)
	if after := opsRedisOffsets(ctx, t, store, partitions); fmt.Sprint(after) != fmt.Sprint(committed) {
		t.Errorf("Redis offsets %v after the second signal, were %v", after, committed)
	}
	if refs, err := store.Metas(ctx, id); err != nil || len(refs) != metasBefore {
		t.Errorf("metas:%d has %d entries (%v) after the second signal, had %d", id, len(refs), err, metasBefore)
	}

	// 3. The rest is consumed again by a new consumer; nothing lost or
	// doubled.
	if err := load.Wait(); err != nil {
		t.Fatalf("producer: %v", err)
	}
	cons3 := c.startConsumer(t, "ops-last")
	waitFlowCheckpoint(ctx, t, store, "f1", want.maxResolved, 60*time.Second)
	got = readFlowBackup(ctx, t, store, bucket, id)
	opsCompareEvents(t, "final", got.events, want.events)
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", store, partitions)
	if err := cons3.Stop(); err != nil {
		t.Errorf("last consumer exit after SIGTERM: %v", err)
	}
	for _, p := range []*proc{cons, cons2, cons3} {
		logsCheckRedacted(t, p, cfg)
	}
}

// opsRedisOffsets returns offset:<apply>:<p> of every partition (0 if unset).
func opsRedisOffsets(ctx context.Context, t testing.TB, store *meta.Store, partitions int) map[int32]int64 {
	t.Helper()
	out := map[int32]int64{}
	for p := range int32(partitions) {
		o, _, err := store.Offset(ctx, testenv.ApplyTopic, p)
		if err != nil {
			t.Fatalf("offset of %d: %v", p, err)
		}
		out[p] = o
	}
	return out
}

// opsTempFiles counts the regular files under dir.
func opsTempFiles(t testing.TB, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && d.Name() != ".flowlog-temp" { // not the marker
			n++
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return n
}

// opsStartLoad starts `producer load` of cfg at rate events/s in the
// background; the caller waits for it. It is killed when the test ends.
func opsStartLoad(t *testing.T, c *cluster, cfg loadgen.Config, rate int) *exec.Cmd {
	t.Helper()
	args := append([]string{"load", "--brokers", c.Broker.Addr, "--rate", strconv.Itoa(rate)}, loadArgs(cfg)...)
	cmd := exec.Command(binary(t, "producer"), args...)
	out, err := os.Create(filepath.Join(t.TempDir(), "producer.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start producer: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = out.Close()
	})
	return cmd
}

// opsEventsBelow reads the apply topic below upto[p] in every partition and
// returns the events of tables 1 and 2 in it (lock-CF ones skipped), as
// readFlowBackup keys them.
func opsEventsBelow(t testing.TB, brokers string, upto map[int32]int64) map[eventKey]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(testenv.ApplyTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	events := map[eventKey]int{}
	left := 0
	next := map[int32]int64{}
	for p, n := range upto {
		if n > 0 {
			left++
		}
		next[p] = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b event.Batch
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read apply topic up to %v: reached %v", upto, next)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= upto[r.Partition] {
				return
			}
			next[r.Partition] = r.Offset + 1
			if r.Offset+1 == upto[r.Partition] {
				left--
			}
			if err := event.DecodeBatch(&b, r.Value, event.ContentType(r)); err != nil {
				t.Fatalf("load record %d/%d: %v", r.Partition, r.Offset, err)
			}
			for _, e := range b.Events {
				if e.CF == event.CFLock {
					continue
				}
				raw, _, err := event.DecodeDataKey(e.Key)
				if err != nil {
					t.Fatalf("load key %x: %v", e.Key, err)
				}
				if table, ok := event.TableIDOfRaw(raw); ok && (table == 1 || table == 2) {
					events[eventKey{table, sink.CFName(e.CF), sink.OpName(e.Op), string(e.Key), string(e.Value)}]++
				}
			}
		})
	}
	return events
}

// opsCompareEvents fails the test unless got holds exactly want.
func opsCompareEvents(t testing.TB, what string, got, want map[eventKey]int) {
	t.Helper()
	missing, wrong, extra, total := 0, 0, 0, 0
	for k, n := range want {
		total += n
		switch g := got[k]; {
		case g == 0:
			if missing++; missing <= 3 {
				t.Errorf("%s: missing %s", what, k)
			}
		case g != n:
			if wrong++; wrong <= 3 {
				t.Errorf("%s: %s stored %d times, produced %d", what, k, g, n)
			}
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			if extra++; extra <= 3 {
				t.Errorf("%s: extra %s", what, k)
			}
		}
	}
	if missing+wrong+extra > 0 {
		t.Errorf("%s: %d events missing, %d with a wrong count, %d extra (of %d expected)", what, missing, wrong, extra, total)
	} else {
		t.Logf("%s: backup holds exactly the %d expected events", what, total)
	}
}
