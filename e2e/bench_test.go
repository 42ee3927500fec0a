package e2e

import (
	"bufio"
	"cloud.google.com/go/storage"
	"context"
	"errors"
	"fmt"
	"google.golang.org/api/iterator"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// Benchmark shape: one load, produced once, consumed by both sides.
const (
	benchEvents     = 300_000
	benchPartitions = 4
	benchRegions    = 16
	benchValueSize  = 200
	// The pipeline's flush settings: a cycle every 0.8 s at most, as a
	// deployment that wants a low checkpoint lag would run it.
	benchFlushInterval = "1s"
	benchFlushSize     = "64MiB"
)

// BenchmarkPipeline measures, against the same broker process and the same
// data, (a) raw franz-go consume throughput: a group consumer that polls and
// discards records until it reaches the end offsets, and (b) the full
// pipeline: a consumer process from empty state until its checkpoint reaches
// the load's max resolved ts and its Redis offsets equal the end offsets,
// that is, until everything is committed in GCS. Run it with
//
//	go test ./e2e -run '^$' -bench Pipeline -benchtime 1x
//
// It reports records/s and MB/s (bytes of record values) of both, their
// ratio (pipeline/raw) and the consumer process's peak RSS.
func BenchmarkPipeline(b *testing.B) {
	c := startCluster(b, benchPartitions)
	cfg := loadgen.Config{
		Events: benchEvents, Tables: []int64{1, 2, 3}, Regions: benchRegions, ValueSize: benchValueSize,
		Seed: 9, StartTime: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC),
	}
	runProducer(b, "flow", "create", "--brokers", c.Broker.Addr, "--name", "fbench", "--tables", "1,2,3")
	loadStart := time.Now()
	out := runProducer(b, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	b.Logf("produced the load in %v", time.Since(loadStart).Round(time.Millisecond))
	maxResolved, err := parseMaxResolved(out)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	adm := newAdmin(b, c.Broker.Addr)
	end := map[int32]int64{}
	endOffsets(ctx, b, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	adm.Close()
	rdb := c.Redis.Client(b)

	b.ResetTimer()
	for i := range b.N {
		raw := rawConsume(ctx, b, c.Broker.Addr, fmt.Sprintf("bench-raw-%d", i), end)

		prefix := fmt.Sprintf("bench%d", i)
		store := meta.NewStore(rdb, prefix, nil)
		start := time.Now()
		cons := c.startConsumer(b, fmt.Sprintf("bench-consumer-%d", i),
			"--group", fmt.Sprintf("bench-pipe-%d", i), "--redis-prefix", prefix, "--gcs-prefix", prefix,
			"--flush-interval", benchFlushInterval, "--flush-size", benchFlushSize)
		pt := waitCommitted(ctx, b, cons.Addr, store, "fbench", maxResolved, end)
		hwm, err := peakRSS(cons)
		if err != nil {
			b.Errorf("peak RSS: %v", err)
		}
		logStageTimes(b, cons.Addr)
		if err := cons.Stop(); err != nil {
			b.Errorf("consumer exit after SIGTERM: %v", err)
		}
		report(b, raw, pt.done.Sub(pt.first), pt.done.Sub(start), pt.done.Sub(pt.consumed), hwm)
		gcsCeiling(ctx, b, c, prefix, raw)
	}
}

// report reports both throughputs from the first record on (the group
// join, about 3 s against kfake for either client, is excluded), their
// ratio, the ratio with the join included, the pipeline's commit tail after
// its last record, and the consumer's peak RSS.
func report(b *testing.B, raw rawResult, pipe, pipeTotal, tail time.Duration, rss int64) {
	mb := float64(raw.bytes) / 1e6
	rawData := raw.took - raw.first
	rate := func(d time.Duration) (float64, float64) { return float64(raw.records) / d.Seconds(), mb / d.Seconds() }
	rawRPS, rawMBs := rate(rawData)
	pipeRPS, pipeMBs := rate(pipe)
	ratio, ratioTotal := rawData.Seconds()/pipe.Seconds(), raw.took.Seconds()/pipeTotal.Seconds()
	b.ReportMetric(rawRPS, "raw_records/s")
	b.ReportMetric(rawMBs, "raw_MB/s")
	b.ReportMetric(pipeRPS, "pipeline_records/s")
	b.ReportMetric(pipeMBs, "pipeline_MB/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(ratioTotal, "ratio_incl_join")
	b.ReportMetric(tail.Seconds(), "pipeline_tail_s")
	b.ReportMetric(float64(rss)/(1<<20), "peak_RSS_MiB")
	fmt.Printf("BenchmarkPipeline: %d records, %.1f MB of values (%d events, %d partitions, %d regions, value size %d, flush %s/%s):\n"+
		"  raw      %.2fs %.0f rec/s %.1f MB/s (%.2fs incl. group join)\n"+
		"  pipeline %.2fs %.0f rec/s %.1f MB/s (%.2fs incl. start and join; %.2fs of it after the last record)\n"+
		"  ratio pipeline/raw %.2f (%.2f incl. join); consumer peak RSS %.1f MiB\n",
		raw.records, mb, benchEvents, benchPartitions, benchRegions, benchValueSize, benchFlushInterval, benchFlushSize,
		rawData.Seconds(), rawRPS, rawMBs, raw.took.Seconds(),
		pipe.Seconds(), pipeRPS, pipeMBs, pipeTotal.Seconds(), tail.Seconds(),
		ratio, ratioTotal, float64(rss)/(1<<20))
}

// logStageTimes logs the consumer's flush stage and batch handling
// totals from /metrics, to show where the pipeline's time went.
func logStageTimes(b *testing.B, addr string) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Logf("metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		for _, m := range []string{"flowlog_flush_duration_seconds_sum", "flowlog_batch_handle_seconds_sum", "flowlog_tempfile_write_seconds_sum"} {
			if strings.HasPrefix(l, m) {
				b.Log(l)
			}
		}
	}
}

// parseMaxResolved takes the max resolved ts from the producer's final
// line ("... max resolved ts N").
func parseMaxResolved(out string) (uint64, error) {
	i := strings.LastIndex(out, "max resolved ts ")
	if i < 0 {
		return 0, fmt.Errorf("no max resolved ts in producer output %q", out)
	}
	f := strings.Fields(out[i+len("max resolved ts "):])
	if len(f) == 0 {
		return 0, fmt.Errorf("no max resolved ts in producer output %q", out)
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// rawResult is what rawConsume read and how long it took.
type rawResult struct {
	records, bytes int64
	took           time.Duration // from creating the client to the last record
	first          time.Duration // from creating the client to the first record (group join)
}

// rawConsume joins group with franz-go, using the pipeline's fetch sizes,
// and polls from the start of the apply topic, discarding records, until
// every partition reached its end offset. The time includes joining.
func rawConsume(ctx context.Context, b *testing.B, brokers, group string, end map[int32]int64) rawResult {
	b.Helper()
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumerGroup(group), kgo.ConsumeTopics(testenv.ApplyTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(16<<20))
	if err != nil {
		b.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	left := 0
	for _, o := range end {
		if o > 0 {
			left++
		}
	}
	var res rawResult
	for left > 0 {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				b.Fatalf("fetch %s/%d: %v", topic, p, err)
			}
		})
		if ctx.Err() != nil {
			b.Fatalf("raw consume: %d records read, %d partitions short of the end", res.records, left)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if res.records == 0 {
				res.first = time.Since(start)
			}
			res.records++
			res.bytes += int64(len(r.Value))
			if r.Offset+1 == end[r.Partition] {
				left--
			}
		})
	}
	res.took = time.Since(start)
	return res
}

// pipeTimes are the moments waitCommitted observed.
type pipeTimes struct {
	first    time.Time // /status first showed a partition consumed past offset 0
	consumed time.Time // /status first showed every partition consumed to its end
	done     time.Time // checkpoint and Redis offsets at the end
}

// waitCommitted polls (every 10 ms) until flow's checkpoint reaches ts and
// every apply partition's Redis offset equals its end offset, watching the
// consumer's /status at addr for its first record and its end of input.
func waitCommitted(ctx context.Context, b *testing.B, addr string, store *meta.Store, flow string, ts uint64, end map[int32]int64) pipeTimes {
	b.Helper()
	var (
		pt  pipeTimes
		msg string
		cl  = &http.Client{Timeout: time.Second}
	)
	for ctx.Err() == nil {
		if pt.consumed.IsZero() {
			if next, err := statusNext(cl, "http://"+addr); err == nil {
				now, sum, all := time.Now(), int64(0), len(next) == len(end)
				for p, n := range next {
					sum += max(n, 0)
					all = all && n == end[p]
				}
				if sum > 0 && pt.first.IsZero() {
					pt.first = now
				}
				if all {
					pt.consumed = now
				}
			}
		}
		ok, m := commitDone(ctx, store, flow, ts, end)
		if ok {
			pt.done = time.Now()
			if pt.consumed.IsZero() {
				pt.consumed = pt.done
			}
			if pt.first.IsZero() {
				b.Fatalf("never saw the consumer's first record in /status")
			}
			return pt
		}
		msg = m
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatalf("pipeline did not commit everything: %s", msg)
	return pt
}

func commitDone(ctx context.Context, store *meta.Store, flow string, ts uint64, end map[int32]int64) (bool, string) {
	id, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, flow)
	if err != nil || !ok {
		return false, fmt.Sprintf("flow %s not created (%v)", flow, err)
	}
	st, err := store.FlowState(ctx, id)
	if err != nil {
		return false, err.Error()
	}
	if st.CheckpointTS < ts {
		return false, fmt.Sprintf("checkpoint %d < %d", st.CheckpointTS, ts)
	}
	for p, e := range end {
		if o, _, err := store.Offset(ctx, testenv.ApplyTopic, p); err != nil || o != e {
			return false, fmt.Sprintf("partition %d: Redis offset %d (%v), end %d", p, o, err, e)
		}
	}
	return true, ""
}

// peakRSS returns the process's VmHWM in bytes.
func peakRSS(p *proc) (int64, error) {
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// gcsCeiling uploads the data objects the pipeline wrote once more, straight
// through the GCS client to the same emulator, and reports how long that
// alone takes: the floor under any pipeline's time on this machine, and the
// best pipeline/raw ratio the emulator allows.
func gcsCeiling(ctx context.Context, b *testing.B, c *cluster, prefix string, raw rawResult) {
	bkt := c.GCS.Client.Bucket(c.GCS.Bucket)
	var names []string
	it := bkt.Objects(ctx, &storage.Query{Prefix: prefix + "/"})
	for {
		attrs, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			b.Fatalf("list objects: %v", err)
		}
		if strings.HasSuffix(attrs.Name, ".log") {
			names = append(names, attrs.Name)
		}
	}
	var took time.Duration
	var n int64
	for _, name := range names {
		r, err := bkt.Object(name).NewReader(ctx)
		if err != nil {
			b.Fatal(err)
		}
		data, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		w := bkt.Object("ceiling/" + name).NewWriter(ctx)
		if len(data) <= 16<<20 {
			w.ChunkSize = 0
		}
		if _, err := w.Write(data); err != nil {
			b.Fatal(err)
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		n += int64(len(data))
	}
	if took == 0 {
		return
	}
	rawData := raw.took - raw.first
	b.ReportMetric(float64(n)/1e6/took.Seconds(), "gcs_upload_MB/s")
	b.ReportMetric(rawData.Seconds()/took.Seconds(), "ratio_ceiling_gcs")
	fmt.Printf("  GCS emulator alone: the pipeline's %d data objects (%.1f MB) upload in %.2fs (%.1f MB/s);\n"+
		"  no pipeline can beat ratio %.3f against this emulator on this machine\n",
		len(names), float64(n)/1e6, took.Seconds(), float64(n)/1e6/took.Seconds(), rawData.Seconds()/took.Seconds())
}
