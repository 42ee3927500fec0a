package e2e

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The sweep knobs of BenchmarkPipeline (docs/SIZING.md, "Cost curves"):
// each varies one axis of the load or the cluster while the others keep
// their defaults.
var (
	benchPartitionsFlag = flag.Int("bench-partitions", benchPartitions, "BenchmarkPipeline: partitions of the apply topic")
	benchValueFlag      = flag.Int("bench-value-size", benchShortValue, "BenchmarkPipeline: bytes per value of the transactions that are not large (at least 32; above 255 the default CF)")
	benchIdleFlowsFlag  = flag.Int("bench-idle-flows", 0, "BenchmarkPipeline: more flows, each over a table of its own that the load never writes")
	benchSteadyFlag     = flag.Int("bench-steady-after", 2, "BenchmarkPipeline: the commits after the first record that the steady Redis figures leave out")
	benchFlushSizeFlag  = flag.String("bench-flush-size", "", "BenchmarkPipeline: the consumer's --flush-size (default: the consumer's default); smaller makes more commits")
	benchRestoreFlag    = flag.Bool("bench-restore", true, "BenchmarkPipeline: restore the first flow after the run and report its planning time and peak RSS")
)

// idleTableBase is the first table of the idle flows: far past any table
// the load writes.
const idleTableBase = 1_000_000

// addIdleFlows appends n flows to sh, each over a table no event of the
// load is in.
func addIdleFlows(sh *benchShape, n int) {
	for i := range n {
		sh.flows = append(sh.flows, benchFlow{name: fmt.Sprintf("fbench-idle-%04d", i), tables: []int64{idleTableBase + int64(i)}})
	}
	sh.idle = n
}

// loadBatchSize is the producer's --batch-size for values of size bytes: 64
// events a record (the producer's default) up to 4 KiB values, fewer above,
// so that one record stays within about 512 KiB (Kafka's default
// max.message.bytes is 1 MiB).
func loadBatchSize(size int) int {
	return max(1, min(64, (512<<10)/max(size, 1)))
}

// redisTotals is the Redis work a redisMeter counted: commands sent and
// bytes each way.
type redisTotals struct {
	cmds     int64 // commands (RESP arrays) the clients sent
	inBytes  int64 // bytes to the server
	outBytes int64 // bytes from the server
}

func (t redisTotals) sub(o redisTotals) redisTotals {
	return redisTotals{cmds: t.cmds - o.cmds, inBytes: t.inBytes - o.inBytes, outBytes: t.outBytes - o.outBytes}
}

// consumerMetrics is what the benchmark takes from a consumer's /metrics.
type consumerMetrics struct {
	commits     int64   // flowlog_flush_duration_seconds_count{stage="commit"}
	commitP99   float64 // seconds, interpolated in the commit histogram's buckets
	gcsRequests int64   // flowlog_object_operation_seconds_count summed over op
}

// scrapeConsumerMetrics reads addr's /metrics.
func scrapeConsumerMetrics(b *testing.B, addr string) consumerMetrics {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	var (
		m       consumerMetrics
		buckets []histBucket
	)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		name, v, ok := strings.Cut(l, " ")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		val, err := strconv.ParseFloat(v, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "flowlog_object_operation_seconds_count"):
			m.gcsRequests += int64(val)
		case name == `flowlog_flush_duration_seconds_count{stage="commit"}`:
			m.commits = int64(val)
		case strings.HasPrefix(name, "flowlog_flush_duration_seconds_bucket{") && strings.Contains(name, `stage="commit"`):
			_, le, _ := strings.Cut(name, `le="`)
			le, _, _ = strings.Cut(le, `"`)
			ub, err := strconv.ParseFloat(le, 64)
			if err != nil {
				continue
			}
			buckets = append(buckets, histBucket{upper: ub, count: val})
		}
	}
	if err := sc.Err(); err != nil {
		b.Fatalf("metrics: %v", err)
	}
	m.commitP99 = histQuantile(0.99, buckets)
	return m
}

// histBucket is one cumulative bucket of a Prometheus histogram.
type histBucket struct {
	upper float64 // le; +Inf for the last
	count float64
}

// histQuantile is Prometheus's histogram_quantile: linear interpolation
// in the bucket that holds the q-quantile; the last finite bound when it
// falls in the +Inf bucket, NaN without observations.
func histQuantile(q float64, bs []histBucket) float64 {
	slices.SortFunc(bs, func(a, b histBucket) int {
		switch {
		case a.upper < b.upper:
			return -1
		case a.upper > b.upper:
			return 1
		}
		return 0
	})
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for i, bk := range bs {
		if bk.count >= rank {
			if math.IsInf(bk.upper, 1) {
				if i == 0 {
					return math.NaN()
				}
				return bs[i-1].upper
			}
			if bk.count == below {
				return bk.upper
			}
			return lower + (bk.upper-lower)*(rank-below)/(bk.count-below)
		}
		lower, below = bk.upper, bk.count
	}
	return bs[len(bs)-1].upper
}

// latencies are the times of calls of one kind.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// summary is the calls' count, median and max.
func (l *latencies) summary() (n int, median, most time.Duration) {
	l.mu.Lock()
	d := slices.Clone(l.d)
	l.mu.Unlock()
	if len(d) == 0 {
		return 0, 0, 0
	}
	slices.Sort(d)
	return len(d), d[len(d)/2], d[len(d)-1]
}

// flowsCaller runs `consumer flows` against a consumer's Redis prefix and
// bucket prefix, and times it.
type flowsCaller struct {
	bin  string
	args []string
	lat  latencies
}

func newFlowsCaller(b *testing.B, c *cluster, group, prefix string) *flowsCaller {
	return &flowsCaller{bin: binary(b, "consumer"), args: []string{"flows", "--redis-url", c.Redis.URL, "--redis-prefix", prefix,
		"--gcs-bucket", c.GCS.Bucket, "--gcs-endpoint", c.GCS.Addr, "--gcs-prefix", prefix, "--group", group, "--json"}}
}

// call runs `consumer flows` once, timing it when it succeeds.
func (f *flowsCaller) call(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, f.bin, f.args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("consumer flows: %w\n%s", err, out.String())
	}
	f.lat.add(time.Since(start))
	return nil
}

// during calls `consumer flows` now and every period until stop is closed, and
// returns a function that waits for the last call and says the first
// error.
func (f *flowsCaller) during(ctx context.Context, period time.Duration, stop <-chan struct{}) func() error {
	done := make(chan error, 1)
	go func() {
		var first error
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			if err := f.call(ctx); err != nil && first == nil {
				first = err
			}
			select {
			case <-stop:
				done <- first
				return
			case <-tick.C:
			}
		}
	}()
	return func() error { return <-done }
}

// sweepResult is what BenchmarkPipeline measures beyond benchResult for
// the cost curves.
type sweepResult struct {
	metrics       consumerMetrics
	objects       int         // every object under the run's prefix
	redis         redisTotals // the consumer's, from the first record to everything committed
	commitsRun    int64       // the consumer's commits meanwhile
	steady        redisTotals // the consumer's, from the -bench-steady-after-th commit after the first record on
	steadyCommits int64       // the commits meanwhile (0: too few commits for a steady figure)
	steadyTop     string      // the most sent commands meanwhile, /status polls included
	statusN       int
	statusMedian  time.Duration
	statusMax     time.Duration
	flowsN        int
	flowsMedian   time.Duration
	flowsMax      time.Duration
	restored      bool
	restoreFlow   string
	restorePlan   time.Duration // wall time less the read's own time
	restoreWall   time.Duration
	restoreMaxRSS int64
}

// topCommands lists the n commands sent most between two counts by name,
// as "name count, ...".
func topCommands(now, before map[string]int64, n int) string {
	type kv struct {
		name string
		n    int64
	}
	var all []kv
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			all = append(all, kv{k, d})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].name < all[j].name })
	var parts []string
	for _, e := range all[:min(n, len(all))] {
		parts = append(parts, fmt.Sprintf("%s %d", e.name, e.n))
	}
	return strings.Join(parts, ", ")
}

// reportSweep reports the sweep's figures per GB of record values (mb in
// MB) and per commit.
func reportSweep(b *testing.B, r sweepResult, mb float64) {
	gb := mb / 1e3
	commits := float64(max(r.commitsRun, 1))
	b.ReportMetric(float64(r.objects)/gb, "objects/GB")
	b.ReportMetric(float64(r.metrics.gcsRequests)/gb, "gcs_requests/GB")
	b.ReportMetric(float64(r.commitsRun), "commits")
	b.ReportMetric(float64(r.redis.cmds)/commits, "redis_cmds/commit")
	b.ReportMetric(float64(r.redis.inBytes)/commits, "redis_in_B/commit")
	// The /status polls' cost is measured once after the run, when its
	// replies are their longest: with many flows, the polls' estimated
	// output can exceed all the output measured, and the difference says
	// nothing. It is then left out, and the line below says so.
	if r.redis.outBytes >= 0 {
		b.ReportMetric(float64(r.redis.outBytes)/commits, "redis_out_B/commit")
	}
	if r.steadyCommits > 0 {
		b.ReportMetric(float64(r.steady.cmds)/float64(r.steadyCommits), "redis_cmds/commit_steady")
		b.ReportMetric(float64(r.steady.inBytes)/float64(r.steadyCommits), "redis_in_B/commit_steady")
	}
	b.ReportMetric(r.metrics.commitP99*1e3, "commit_p99_ms")
	b.ReportMetric(float64(r.statusMedian.Microseconds())/1e3, "status_ms")
	b.ReportMetric(float64(r.flowsMedian.Microseconds())/1e3, "flows_ms")
	if r.restored {
		b.ReportMetric(r.restorePlan.Seconds(), "restore_plan_s")
		b.ReportMetric(float64(r.restoreMaxRSS)/(1<<20), "restore_peak_RSS_MiB")
	}
	out := fmt.Sprintf("%.0f B out", float64(r.redis.outBytes)/commits)
	if r.redis.outBytes < 0 {
		out = "B out not measured (less than the /status polls' estimate)"
	}
	fmt.Printf("  sweep     %d objects (%.0f/GB), %d GCS requests of the consumer (%.0f/GB); %d commits, commit p99 %.1f ms;\n"+
		"            Redis per commit %.1f commands, %.0f B in, %s (the consumer's, from the first record to all committed: %d commits, %d commands, %.1f MB in)\n"+
		"            /status %d calls during the run, median %.1f ms, max %.1f ms; consumer flows %d calls, median %.0f ms, max %.0f ms\n",
		r.objects, float64(r.objects)/gb, r.metrics.gcsRequests, float64(r.metrics.gcsRequests)/gb, r.metrics.commits, r.metrics.commitP99*1e3,
		float64(r.redis.cmds)/commits, float64(r.redis.inBytes)/commits, out, r.commitsRun, r.redis.cmds, float64(r.redis.inBytes)/1e6,
		r.statusN, ms(r.statusMedian), ms(r.statusMax), r.flowsN, ms(r.flowsMedian), ms(r.flowsMax))
	if r.steadyCommits > 0 {
		fmt.Printf("            steady, from commit %d after the first record on: %.1f commands and %.0f B in per commit (%d commits); most sent: %s\n",
			*benchSteadyFlag, float64(r.steady.cmds)/float64(r.steadyCommits), float64(r.steady.inBytes)/float64(r.steadyCommits), r.steadyCommits, r.steadyTop)
	}
	if r.restored {
		fmt.Printf("  restore   flow %s: planning %.2fs (wall %.2fs), peak RSS %.1f MiB\n",
			r.restoreFlow, r.restorePlan.Seconds(), r.restoreWall.Seconds(), float64(r.restoreMaxRSS)/(1<<20))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
