package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
)

// memoryEventsFlag sizes TestConsumerMemoryBound's backlog
// (FLOWLOG_MEMORY_TEST_EVENTS when not given).
var memoryEventsFlag = flag.Int("memory-events", 0,
	"TestConsumerMemoryBound: transactions in the backlog (default 400000, about 170 MB of values; 1650000 is about 700 MB; or FLOWLOG_MEMORY_TEST_EVENTS)")

const (
	// memoryDefaultEvents keeps the test within about 15 s on a shared 2-core
	// machine; the 700 MB backlog of the full run is opt-in.
	memoryDefaultEvents = 400_000
	// memoryBound is the container the test runs the consumer in: its
	// default --max-memory (128 MiB, also its Go soft memory limit) plus
	// 64 MiB for the binary's text and what the runtime does not count.
	memoryBound = 192 << 20
)

// memoryEvents is the backlog size: -memory-events, else
// FLOWLOG_MEMORY_TEST_EVENTS, else memoryDefaultEvents.
func memoryEvents(t *testing.T) int {
	if *memoryEventsFlag > 0 {
		return *memoryEventsFlag
	}
	if v := os.Getenv("FLOWLOG_MEMORY_TEST_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("FLOWLOG_MEMORY_TEST_EVENTS=%q: want a positive number", v)
		}
		return n
	}
	return memoryDefaultEvents
}

// TestConsumerMemoryBound checks that memory does not grow with the backlog:
// the consumer binary with default flags (but the flush interval) works off a
// backlog of the benchmark's shape (8 partitions, 3 flows over overlapping
// tables, short and 1 KiB values) inside a 192 MiB memory bound and must
// commit all of it with its peak RSS (VmHWM) under the bound.
//
// This machine's cgroup v2 hierarchy has no memory controller (the v1 memory
// cgroups belong to the sandbox), so the bound is kept the other way: the
// consumer's Go soft memory limit, which it sets from its default
// --max-memory (checked in its start log), plus an RSS watchdog that samples
// /proc/<pid>/status VmRSS every 20 ms and SIGKILLs the consumer past the
// bound, as the OOM killer would a container.
//
// The consumer binary is built without the race detector unless
// FLOWLOG_E2E_RACE=1 (whose shadow memory would multiply RSS: the test skips
// then); a -race test binary is fine. The backlog is 400k events by default;
// -memory-events 1650000 (FLOWLOG_MEMORY_TEST_EVENTS) is the full 700 MB run
// (about a minute), skipped with -short.
func TestConsumerMemoryBound(t *testing.T) {
	if os.Getenv("FLOWLOG_E2E_RACE") == "1" {
		t.Skip("FLOWLOG_E2E_RACE=1: a race-detector consumer's RSS says nothing about its memory bound")
	}
	events := memoryEvents(t)
	if testing.Short() && events > memoryDefaultEvents {
		t.Skipf("-short: a backlog of %d events takes minutes", events)
	}
	c := startCluster(t, benchPartitions)
	for _, f := range benchFlows {
		runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", f.name, "--tables", f.tableList())
	}
	var (
		maxResolved uint64
		mb          float64 // produced, keys and values
	)
	for _, cfg := range benchLoads(events, defaultBenchShape()) {
		out := benchProduce(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
		res, err := parseMaxResolved(out)
		if err != nil {
			t.Fatal(err)
		}
		maxResolved = max(maxResolved, res)
		if m := producedMBRE.FindStringSubmatch(out); m != nil {
			v, _ := strconv.ParseFloat(m[1], 64)
			mb += v
		}
	}
	timeout := time.Minute + time.Duration(events/5000)*time.Second // 20 MB/s and more
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	adm := newAdmin(t, c.Broker.Addr)
	end := map[int32]int64{}
	endOffsets(ctx, t, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	adm.Close()

	var defaults pipeline.Config
	defaults.RegisterFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	cons := c.startConsumer(t, "consumer-mem", "--flush-interval", benchFlushInterval, "--flush-size", defaults.FlushSize.String())
	took, mem, sampled := commitWithinBound(ctx, t, c, cons, maxResolved, end, timeout)
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
	if limit, src := memoryLimitLogged(t, cons.Log()); limit != pipeline.GoMemoryLimit(defaults.MemoryBudget()) || src != "--max-memory" {
		t.Errorf("consumer logged go memory limit %d from %q, want %d from --max-memory", limit, src, pipeline.GoMemoryLimit(defaults.MemoryBudget()))
	}
	var records int64
	for _, o := range end {
		records += o
	}
	t.Logf("%d events (%d records, %.1f MB) committed in %v; VmHWM %.1f MiB (largest VmRSS sample %.1f MiB) against a bound of %d MiB",
		events, records, mb, took.Round(time.Millisecond), float64(mem.peak)/(1<<20), float64(sampled)/(1<<20), memoryBound>>20)
	if mem.peak >= memoryBound {
		t.Errorf("consumer VmHWM %.1f MiB, want under %d MiB", float64(mem.peak)/(1<<20), memoryBound>>20)
	}
}

// commitWithinBound watches cons's VmRSS against memoryBound (a SIGKILL
// past it, as the OOM killer would) until every flow's checkpoint reaches
// resolved and the Redis offsets equal end, and returns how long that took,
// the consumer's memory and the largest VmRSS sampled. A kill or an exit
// fails the test.
func commitWithinBound(ctx context.Context, t *testing.T, c *cluster, cons *proc, resolved uint64, end map[int32]int64, timeout time.Duration) (time.Duration, procMemory, int64) {
	t.Helper()
	start := time.Now()
	dog := watchRSS(t, cons, memoryBound)
	defer dog.halt()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitForOrStop(t, timeout, func() (bool, string, error) {
		if over := dog.killed.Load(); over > 0 {
			return false, "", fmt.Errorf("RSS %.1f MiB passed the %d MiB bound: the watchdog killed the consumer", float64(over)/(1<<20), memoryBound>>20)
		}
		if cons.hasExited() {
			return false, "", errors.New("the consumer exited")
		}
		ok, msg := commitDone(ctx, store, resolved, end)
		return ok, msg, nil
	})
	took := time.Since(start)
	dog.halt()
	mem, err := peakRSS(cons)
	if err != nil {
		t.Fatalf("peak RSS: %v", err)
	}
	return took, mem, dog.peak.Load()
}

// producedMBRE takes the MB from the producer's final line.
var producedMBRE = regexp.MustCompile(`records \(([\d.]+) MB\)`)

// memoryLimitLogged reads the consumer's JSON start line "go memory limit":
// the limit in bytes and what it came from.
func memoryLimitLogged(t *testing.T, log string) (int64, string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			Msg    string `json:"msg"`
			Limit  int64  `json:"memory_limit"`
			Source string `json:"source"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "go memory limit" {
			return l.Limit, l.Source
		}
	}
	t.Fatalf("no \"go memory limit\" line in the consumer's log")
	return 0, ""
}

// rssWatchdog samples a process's VmRSS and kills it past a bound.
type rssWatchdog struct {
	peak   atomic.Int64 // largest VmRSS sampled
	killed atomic.Int64 // the VmRSS that made it kill the process; 0 if it did not
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// watchRSS samples p's VmRSS every 20 ms until halted or p exits, and
// sends p SIGKILL the first time it exceeds bound.
func watchRSS(t testing.TB, p *proc, bound int64) *rssWatchdog {
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	w := &rssWatchdog{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			st, _ := testenv.ProcStatus(pid, "VmRSS")
			rss := st["VmRSS"] // 0 once it exited
			if rss > w.peak.Load() {
				w.peak.Store(rss)
			}
			if rss > bound {
				w.killed.Store(rss)
				t.Logf("watchdog: VmRSS %.1f MiB > %d MiB: SIGKILL", float64(rss)/(1<<20), bound>>20)
				p.Signal(syscall.SIGKILL)
				return
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *rssWatchdog) halt() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// TestConsumerMemoryBoundCompressedTopic is TestConsumerMemoryBound on a
// topic whose producer compressed its batches (zstd) and whose values
// compress about fortyfold: a fetch's limit counts compressed bytes, and
// franz-go holds a fetch decompressed, so the consumer must size its
// fetches by the ratio it sees (flowlog_fetch_max_bytes) to stay in its
// bound. Before it did, it passed 400 MiB within half a second.
func TestConsumerMemoryBoundCompressedTopic(t *testing.T) {
	if os.Getenv("FLOWLOG_E2E_RACE") == "1" {
		t.Skip("FLOWLOG_E2E_RACE=1: a race-detector consumer's RSS says nothing about its memory bound")
	}
	const (
		want    = 300 << 20 // uncompressed bytes of records
		regions = 16
	)
	c := startCluster(t, benchPartitions)
	for _, f := range benchFlows {
		runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", f.name, "--tables", f.tableList())
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Broker.Addr), kgo.DefaultProduceTopic(testenv.ApplyTopic),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	text := []byte(strings.Repeat("the quick brown fox jumps over the lazy dog; ", 24)[:1024])
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
	var (
		produced int64
		ts       uint64
		h        int64
		failed   atomic.Pointer[error]
	)
	onProduced := func(_ *kgo.Record, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}
	for produced < want {
		for r := 1; r <= regions; r++ {
			b := &event.Batch{RegionID: uint64(r)}
			for range 64 {
				h++
				ts = event.ComposeTS(base+h/1000, uint64(h%1000))
				b.Events = append(b.Events, event.Event{Key: event.AppendDataKey(nil, event.RowKey(1+h%4, h), ts), Value: text})
			}
			v := event.EncodeBatch(nil, b)
			produced += int64(len(v))
			cl.Produce(ctx, &kgo.Record{Key: []byte(strconv.Itoa(r)), Value: v}, onProduced)
		}
	}
	resolved := ts + 1
	for r := 1; r <= regions; r++ {
		hb := event.EncodeBatch(nil, &event.Batch{RegionID: uint64(r), ResolvedTS: resolved})
		cl.Produce(ctx, &kgo.Record{Key: []byte(strconv.Itoa(r)), Value: hb}, onProduced)
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := failed.Load(); err != nil {
		t.Fatalf("produce: %v", *err)
	}
	adm := newAdmin(t, c.Broker.Addr)
	end := map[int32]int64{}
	endOffsets(ctx, t, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	adm.Close()

	cons := c.startConsumer(t, "consumer-zstd", "--flush-interval", benchFlushInterval)
	took, mem, _ := commitWithinBound(ctx, t, c, cons, resolved, end, 3*time.Minute)
	fetchLimit, _ := scrapeMetrics(t, "http://"+cons.Addr).get("flowlog_fetch_max_bytes")
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
	t.Logf("%.1f MB of zstd-compressed records committed in %v; VmHWM %.1f MiB against a bound of %d MiB; fetch limit at the end %.0f KiB",
		float64(produced)/1e6, took.Round(time.Millisecond), float64(mem.peak)/(1<<20), memoryBound>>20, fetchLimit/1024)
	if mem.peak >= memoryBound {
		t.Errorf("consumer VmHWM %.1f MiB, want under %d MiB", float64(mem.peak)/(1<<20), memoryBound>>20)
	}
	var defaults pipeline.Config
	defaults.RegisterFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	if share := defaults.MemoryBudget() / 4 / 3; fetchLimit <= 0 || fetchLimit > float64(share)/8 {
		t.Errorf("flowlog_fetch_max_bytes = %.0f, want above 0 and under an eighth of the %d B fetch share for data compressed over eightfold", fetchLimit, share)
	}
}
