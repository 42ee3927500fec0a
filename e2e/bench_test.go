package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/api/iterator"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// benchEventsFlag sizes BenchmarkPipeline's load (FLOWLOG_BENCH_EVENTS when
// not given).
var benchEventsFlag = flag.Int("bench-events", 0, "BenchmarkPipeline: transactions in the load (default 300000, or FLOWLOG_BENCH_EVENTS)")

// The width of BenchmarkPipeline's load and the consumer's settings.
var (
	benchFlowsFlag   = flag.Int("bench-flows", 0, "BenchmarkPipeline: flows over overlapping ranges of the tables (default: the 3 flows over 4 tables of benchFlows)")
	benchTablesFlag  = flag.Int("bench-tables", 0, "BenchmarkPipeline: tables of the load, with -bench-flows (default 5 per 3 flows)")
	benchRegionsFlag = flag.Int("bench-regions", benchRegions, "BenchmarkPipeline: regions of the load")
	benchIntervalFlg = flag.String("bench-flush-interval", benchFlushInterval, "BenchmarkPipeline: the consumer's --flush-interval")
	benchLargeFlag   = flag.Int("bench-large-share", benchLargeShare, "BenchmarkPipeline: one transaction in N writes 1 KiB values (0: none, every value 200 B)")
	benchLayoutFlag  = flag.String("bench-layout", "", "BenchmarkPipeline: the consumer's --layout (default: its own default)")
)

// Benchmark shape: one load, produced once, consumed by both sides.
const (
	benchDefaultEvents = 300_000
	benchPartitions    = 8
	benchRegions       = 16
	// A quarter of the transactions write large values (TiKV puts them in
	// the default CF, with a write-CF record pointing at them), the rest
	// short values inlined in the write record.
	benchShortValue = 200
	benchLargeValue = 1024
	benchLargeShare = 4 // one transaction in benchLargeShare is large
	// The pipeline's flush interval: a cycle every 0.8 s at most, as a
	// deployment that wants a low checkpoint lag would run it. Every
	// other consumer flag is its default.
	benchFlushInterval = "1s"
)

// benchFlow is a flow of the benchmark and its tables.
type benchFlow struct {
	name   string
	tables []int64
}

// benchFlows are three flows over overlapping tables: an event of table 2
// or 3 goes to two flows.
var benchFlows = []benchFlow{
	{"fbench-a", []int64{1, 2}},
	{"fbench-b", []int64{2, 3}},
	{"fbench-c", []int64{3, 4}},
}

// tableList is the flow's tables as --tables takes them.
func (f benchFlow) tableList() string {
	parts := make([]string, len(f.tables))
	for i, t := range f.tables {
		parts[i] = strconv.FormatInt(t, 10)
	}
	return strings.Join(parts, ",")
}

// defaultBenchShape is the shape of the benchmarks and memory tests that
// take no shape flags: benchFlows over 4 tables, benchRegions regions, a
// quarter of the transactions with large values, --flush-interval
// benchFlushInterval.
func defaultBenchShape() benchShape {
	return benchShape{flows: benchFlows, tables: []int64{1, 2, 3, 4}, regions: benchRegions, partitions: benchPartitions,
		interval: benchFlushInterval, largeShare: benchLargeShare, valueSize: benchShortValue}
}

// benchShape is the load's and the consumer's width: flows, tables,
// regions, and how the consumer runs.
type benchShape struct {
	flows      []benchFlow
	tables     []int64
	regions    int
	partitions int    // of the apply topic
	interval   string // --flush-interval
	largeShare int    // one transaction in largeShare has 1 KiB values; 0: none
	valueSize  int    // bytes per value of the other transactions
	layout     string // --layout; "" the consumer's default
	idle       int    // the last idle flows of flows are over tables the load never writes
}

// benchShapeOf reads the shape flags. With -bench-flows F and -bench-tables
// T, flow i covers a run of ceil(T/F)+1 tables from table i*T/F+1, so that
// neighbouring flows share a table (3 flows over 5 tables: 1-3, 2-4, 4-5).
func benchShapeOf(b *testing.B) benchShape {
	sh := defaultBenchShape()
	sh.regions, sh.interval, sh.largeShare, sh.layout = *benchRegionsFlag, *benchIntervalFlg, *benchLargeFlag, *benchLayoutFlag
	sh.partitions, sh.valueSize = *benchPartitionsFlag, *benchValueFlag
	if sh.partitions <= 0 || sh.valueSize < 32 {
		b.Fatalf("-bench-partitions %d, -bench-value-size %d: want at least 1 and 32", sh.partitions, sh.valueSize)
	}
	if n := *benchFlowsFlag; n > 0 {
		tables := *benchTablesFlag
		if tables <= 0 {
			tables = (5*n + 2) / 3
		}
		if tables < n {
			b.Fatalf("-bench-tables %d below -bench-flows %d", tables, n)
		}
		run := (tables+n-1)/n + 1
		sh.flows, sh.tables = nil, nil
		for t := 1; t <= tables; t++ {
			sh.tables = append(sh.tables, int64(t))
		}
		for i := range n {
			f := benchFlow{name: fmt.Sprintf("fbench-%04d", i)}
			for t := i*tables/n + 1; t <= min(i*tables/n+run, tables); t++ {
				f.tables = append(f.tables, int64(t))
			}
			sh.flows = append(sh.flows, f)
		}
	}
	addIdleFlows(&sh, *benchIdleFlowsFlag)
	return sh
}

// String describes the shape as the benchmark's report does.
func (sh benchShape) String() string {
	layout := sh.layout
	if layout == "" {
		layout = "default"
	}
	flows := fmt.Sprintf("%d flows", len(sh.flows))
	if sh.idle > 0 {
		flows = fmt.Sprintf("%d flows (%d of them idle, over tables without events)", len(sh.flows), sh.idle)
	}
	return fmt.Sprintf("%s over %d tables, %d regions, %d partitions, --flush-interval %s, --layout %s", flows, len(sh.tables)+sh.idle, sh.regions, sh.partitions, sh.interval, layout)
}

// benchEvents is the load size: -bench-events, else FLOWLOG_BENCH_EVENTS,
// else benchDefaultEvents.
func benchEvents(b *testing.B) int {
	if *benchEventsFlag > 0 {
		return *benchEventsFlag
	}
	if v := os.Getenv("FLOWLOG_BENCH_EVENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("FLOWLOG_BENCH_EVENTS=%q: want a positive number", v)
		}
		return n
	}
	return benchDefaultEvents
}

// benchLoads are the loads of the benchmark, short values first, then large
// ones (when the shape has them); the second starts a day of TSO later, so
// every region's commit and resolved ts keep rising across both.
func benchLoads(events int, sh benchShape) []loadgen.Config {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	large := 0
	if sh.largeShare > 0 {
		large = events / sh.largeShare
	}
	loads := []loadgen.Config{
		{Events: events - large, Tables: sh.tables, Regions: sh.regions, ValueSize: sh.valueSize, Seed: 9, StartTime: start,
			BatchSize: loadBatchSize(sh.valueSize)},
	}
	if large > 0 {
		loads = append(loads, loadgen.Config{Events: large, Tables: sh.tables, Regions: sh.regions, ValueSize: benchLargeValue, Seed: 10,
			StartTime: start.Add(24 * time.Hour), BatchSize: loadBatchSize(benchLargeValue)})
	}
	return loads
}

// createBenchFlows publishes the shape's flows as create DDL records, all
// at once. Each run's consumer applies them under its own Redis prefix
// before it routes a record (the DDL barrier).
func createBenchFlows(ctx context.Context, b *testing.B, brokers string, sh benchShape) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, f := range sh.flows {
		d, _ := json.Marshal(map[string]any{"op": "create", "flow": map[string]any{
			"catalog_name": "default", "flow_name": f.name, "source_table_ids": f.tables,
			"sink_table_name": map[string]string{"catalog_name": "default", "schema_name": "public", "table_name": f.name + "_sink"},
			"flownode_ids":    map[string]uint64{"0": 1},
		}, "routes": map[string]any{"0": map[string]any{"peer": map[string]any{"id": 1, "addr": "n1:4000"}}}})
		recs = append(recs, &kgo.Record{Topic: testenv.DDLTopic, Key: []byte(f.name), Value: d,
			Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/json")}}})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatalf("produce flow DDL: %v", err)
	}
}

// BenchmarkPipeline measures, against the same broker process and the same
// data, (a) raw franz-go consume throughput: a group consumer with the
// pipeline's fetch options that polls and discards records until it
// reaches the end offsets; (b) the full pipeline: a consumer process with
// default flags (but --flush-interval) from empty state until every flow's
// checkpoint reaches the load's max resolved ts and its Redis offsets equal
// the end offsets, that is, until everything is committed in GCS; and (c)
// the GCS emulator alone: the pipeline's own objects uploaded again, cycle
// by cycle with the same parallelism, through the same GCS code. Run it
// with
//
//	go test ./e2e -run '^$' -bench Pipeline -benchtime 1x [-bench-events N]
//
// The load: -bench-events transactions (default 300,000) over 16 regions
// and 4 tables, a quarter of them with 1 KiB values (default CF), the rest
// with 200 B values; 8 partitions; 3 flows over overlapping tables. It
// reports the three times, the consumer's CPU seconds per GB of record
// values (utime+stime), its peak RSS (VmHWM) and the peak size of its temp
// dir; beside the CPU, its floor on the same bytes: the CPU of (a), plus
// zstd frames and sha256 of the framed bytes of the pipeline's data
// objects, measured in the same run (measureFloor), and the ratio of the
// two (cpu/floor). alone/pipeline is the GCS alone time over the
// pipeline's.
func BenchmarkPipeline(b *testing.B) {
	events := benchEvents(b)
	sh := benchShapeOf(b)
	c := startCluster(b, sh.partitions)
	loadStart := time.Now()
	createBenchFlows(context.Background(), b, c.Broker.Addr, sh)
	var maxResolved uint64
	for _, cfg := range benchLoads(events, sh) {
		out := benchProduce(b, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
		res, err := parseMaxResolved(out)
		if err != nil {
			b.Fatal(err)
		}
		maxResolved = max(maxResolved, res)
	}
	b.Logf("produced the load in %v", time.Since(loadStart).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	adm := newAdmin(b, c.Broker.Addr)
	end := map[int32]int64{}
	endOffsets(ctx, b, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	adm.Close()
	rdb := c.Redis.Client(b)
	// The consumer reaches Redis through a meter, so that its Redis work is
	// counted alone: the benchmark's polling and `consumer flows` go to the
	// server directly.
	meter := startRedisMeter(b, c.Redis.Addr)
	var defaults pipeline.Config
	defaults.RegisterFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))

	b.ResetTimer()
	for i := range b.N {
		rawCPU := selfCPU()
		raw := rawConsume(ctx, b, c.Broker.Addr, fmt.Sprintf("bench-raw-%d", i), end, defaults.FetchOpts())
		rawCPU = selfCPU() - rawCPU

		prefix := fmt.Sprintf("bench%d", i)
		store := meta.NewStore(rdb, prefix, nil)
		tempDir := filepath.Join(b.TempDir(), "temp")
		start := time.Now()
		args := []string{"--group", fmt.Sprintf("bench-pipe-%d", i), "--redis-prefix", prefix, "--gcs-prefix", prefix,
			"--temp-dir", tempDir, "--flush-interval", sh.interval, "--flush-size", cmp.Or(*benchFlushSizeFlag, defaults.FlushSize.String()),
			"--redis-url", meter.URL}
		if sh.layout != "" {
			args = append(args, "--layout", sh.layout)
		}
		cons := c.startConsumer(b, fmt.Sprintf("bench-consumer-%d", i), args...)
		disk := sampleTempDisk(tempDir)
		// The per-commit figures are of the run from the first record to
		// everything committed: the start (the flows' DDL, the group join)
		// is left out. `consumer flows` runs every 5 s of it.
		var (
			redisFirst redisTotals
			atFirst    consumerMetrics
			flows      = newFlowsCaller(b, c, fmt.Sprintf("bench-pipe-%d", i), prefix)
			stopFlows  = make(chan struct{})
			flowsDone  = func() error { return nil }
		)
		// The steady figures leave the first -bench-steady-after commits out:
		// what a run pays once (every flow's catalog, the session's first
		// advance, which writes every flow's checkpoint) falls in them.
		var (
			steadyFrom    redisTotals
			steadyCommits int64 = -1
			steadyStatus  int
			steadyNames   map[string]int64
		)
		pt := waitCommittedEach(ctx, b, cons.Addr, store, maxResolved, end, sh, func() {
			redisFirst = meter.totals()
			atFirst = scrapeConsumerMetrics(b, cons.Addr)
			flowsDone = flows.during(ctx, 5*time.Second, stopFlows)
		}, func(statusN int) bool {
			from := meter.totals()
			m := scrapeConsumerMetrics(b, cons.Addr)
			if m.commits-atFirst.commits < int64(*benchSteadyFlag) {
				return false
			}
			steadyFrom, steadyCommits, steadyStatus, steadyNames = from, m.commits, statusN, meter.byName()
			return true
		})
		redisDone, namesDone := meter.totals(), meter.byName()
		close(stopFlows)
		if err := flowsDone(); err != nil {
			b.Errorf("during the run: %v", err)
		}
		var sw sweepResult
		sw.statusN, sw.statusMedian, sw.statusMax = pt.status.summary()
		sw.flowsN, sw.flowsMedian, sw.flowsMax = flows.lat.summary()
		cpu := restoreProcCPU(cons)
		peakDisk := disk.halt()
		hwm, err := peakRSS(cons)
		if err != nil {
			b.Errorf("peak RSS: %v", err)
		}
		logStageTimes(b, cons.Addr)
		sw.metrics = scrapeConsumerMetrics(b, cons.Addr)
		sw.commitsRun = sw.metrics.commits - atFirst.commits
		// The consumer's Redis work from the first record to everything
		// committed, less what the benchmark's /status polls cost it (the
		// consumer answers them from Redis), measured alone below.
		statusCost := callCost(meter, func() error {
			_, err := statusNext(&http.Client{Timeout: 10 * time.Second}, "http://"+cons.Addr)
			return err
		}, b)
		if err := cons.Stop(); err != nil {
			b.Errorf("consumer exit after SIGTERM: %v", err)
		}
		less := func(t redisTotals, polls int) redisTotals {
			n := int64(polls)
			return redisTotals{cmds: t.cmds - n*statusCost.cmds, inBytes: t.inBytes - n*statusCost.inBytes,
				outBytes: t.outBytes - n*statusCost.outBytes}
		}
		sw.redis = less(redisDone.sub(redisFirst), sw.statusN-pt.statusBefore)
		if steadyCommits >= 0 && sw.metrics.commits > steadyCommits {
			sw.steady = less(redisDone.sub(steadyFrom), sw.statusN-steadyStatus)
			sw.steadyCommits = sw.metrics.commits - steadyCommits
			sw.steadyTop = topCommands(namesDone, steadyNames, 8)
		}
		up := gcsAlone(ctx, b, c, prefix, defaults)
		floor := measureFloor(ctx, b, c, prefix)
		floor.raw = rawCPU
		sw.objects = up.listed
		if *benchRestoreFlag {
			sw.restored, sw.restoreFlow = true, sh.flows[0].name
			r := restoreMeasured(ctx, b, c, sw.restoreFlow, "", "--group", fmt.Sprintf("bench-pipe-%d", i), "--redis-prefix", prefix, "--gcs-prefix", prefix)
			sw.restoreWall, sw.restorePlan, sw.restoreMaxRSS = r.wall, r.wall-r.took, r.maxRSS
		}
		res := benchResult{events: events, shape: sh, raw: raw, pipe: pt.done.Sub(pt.first), pipeTotal: pt.done.Sub(start),
			tail: pt.done.Sub(pt.consumed), up: up, cpu: cpu, floor: floor, mem: hwm, disk: peakDisk}
		report(b, res)
		reportSweep(b, sw, float64(raw.bytes)/1e6)
	}
}

// callCost runs call three times and returns the least Redis work the
// meter counted for one of them (a flush cycle of the consumer may land in
// the window of one), less the least it counted in three windows without a
// call.
func callCost(m *redisMeter, call func() error, b *testing.B) redisTotals {
	b.Helper()
	least := func(call func() error) redisTotals {
		var l redisTotals
		for i := range 3 {
			before := m.totals()
			if err := call(); err != nil {
				b.Fatalf("measure a call's Redis cost: %v", err)
			}
			d := m.totals().sub(before)
			if i == 0 || d.cmds < l.cmds || d.cmds == l.cmds && d.inBytes < l.inBytes {
				l = d
			}
		}
		return l
	}
	return least(call).sub(least(func() error { return nil }))
}

// benchProduce runs the producer with args like runProducer, with time for
// a load of millions of events.
func benchProduce(b testing.TB, args ...string) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(b, "producer"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		b.Fatalf("producer %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// benchResult is what one run of BenchmarkPipeline measured.
type benchResult struct {
	events    int
	shape     benchShape
	raw       rawResult
	pipe      time.Duration // first record to everything committed
	pipeTotal time.Duration // consumer start to everything committed
	tail      time.Duration // last record handled to everything committed
	up        uploadResult
	cpu       float64    // consumer CPU seconds (user + system)
	floor     cpuFloor   // the CPU no pipeline can skip, on the same bytes
	mem       procMemory // consumer VmHWM, RssFile, RssAnon
	disk      int64      // peak bytes under --temp-dir
}

// report reports the pipeline's time from its first record on (the group
// join, about 3 s against kfake for either client, is excluded), the raw
// consume time and the emulator-alone upload time, throughputs and ratios,
// the consumer's CPU seconds per GB of record values, its peak RSS and the
// peak size of its temp dir.
func report(b *testing.B, r benchResult) {
	raw := r.raw
	mb := float64(raw.bytes) / 1e6
	rawData := raw.took - raw.first
	rate := func(d time.Duration) (float64, float64) { return float64(raw.records) / d.Seconds(), mb / d.Seconds() }
	rawRPS, rawMBs := rate(rawData)
	pipeRPS, pipeMBs := rate(r.pipe)
	ratio, ratioTotal := rawData.Seconds()/r.pipe.Seconds(), raw.took.Seconds()/r.pipeTotal.Seconds()
	cpuPerGB := r.cpu / (mb / 1e3)
	b.ReportMetric(r.pipe.Seconds(), "pipeline_s")
	b.ReportMetric(rawData.Seconds(), "raw_s")
	b.ReportMetric(r.up.took.Seconds(), "gcs_alone_s")
	b.ReportMetric(rawMBs, "raw_MB/s")
	b.ReportMetric(pipeMBs, "pipeline_MB/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(ratioTotal, "ratio_incl_join")
	b.ReportMetric(r.up.took.Seconds()/r.pipe.Seconds(), "gcs_alone/pipeline")
	b.ReportMetric(r.tail.Seconds(), "pipeline_tail_s")
	b.ReportMetric(cpuPerGB, "cpu_s/GB")
	b.ReportMetric(r.floor.total()/(mb/1e3), "floor_cpu_s/GB")
	b.ReportMetric(r.cpu/r.floor.total(), "cpu/floor")
	b.ReportMetric(float64(r.mem.peak)/(1<<20), "peak_RSS_MiB")
	b.ReportMetric(float64(r.disk)/1e6, "peak_temp_MB")
	b.ReportMetric(float64(r.up.data), "data_objects")
	b.ReportMetric(float64(r.up.objects), "objects")
	b.ReportMetric(float64(r.up.objects)/float64(max(r.up.cycles, 1)), "data+meta/cycle")
	b.ReportMetric(float64(r.up.catalogs), "catalogs")
	fmt.Printf("BenchmarkPipeline: %d records, %.1f MB of values (%d events: 1 in %d with %d B values, the rest %d B; %d partitions; %s; other flags default):\n"+
		"  pipeline  %.2fs first record to all committed, %.0f rec/s %.1f MB/s (%.2fs incl. start and join; %.2fs of it after the last record)\n"+
		"  raw       %.2fs %.0f rec/s %.1f MB/s (%.2fs incl. group join); ratio raw/pipeline %.2f (%.2f incl. join)\n"+
		"  GCS alone %.2fs: the pipeline's %d data and meta objects (%.1f MB; %d data objects) of %d cycles uploaded again, %d data objects at a time (%.1f MB/s); %d catalog objects\n"+
		"  consumer  %.1f CPU s (%.1f core-s/GB of values), peak RSS %.1f MiB (at the end %.1f MiB of it file-backed, the binary; %.1f MiB anonymous), peak temp dir %.1f MB\n"+
		"  floor     %s (%.1f core-s/GB of values; consumer/floor %.2f); GCS alone/pipeline %.2f\n",
		raw.records, mb, r.events, r.shape.largeShare, benchLargeValue, r.shape.valueSize, r.shape.partitions, r.shape,
		r.pipe.Seconds(), pipeRPS, pipeMBs, r.pipeTotal.Seconds(), r.tail.Seconds(),
		rawData.Seconds(), rawRPS, rawMBs, raw.took.Seconds(), ratio, ratioTotal,
		r.up.took.Seconds(), r.up.objects, float64(r.up.bytes)/1e6, r.up.data, r.up.cycles, r.up.parallel, float64(r.up.bytes)/1e6/r.up.took.Seconds(), r.up.catalogs,
		r.cpu, cpuPerGB, float64(r.mem.peak)/(1<<20), float64(r.mem.file)/(1<<20), float64(r.mem.anonNow)/(1<<20), float64(r.disk)/1e6,
		r.floor, r.floor.total()/(mb/1e3), r.cpu/r.floor.total(), r.up.took.Seconds()/r.pipe.Seconds())
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
		for _, m := range []string{"flowlog_flush_duration_seconds_sum", "flowlog_batch_handle_seconds_sum", "flowlog_tempfile_write_seconds_sum", "flowlog_flush_cycles_total"} {
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

// rawConsume joins group with franz-go, using the pipeline's fetch options
// (fetch), and polls from the start of the apply topic, discarding records,
// until every partition reached its end offset. The time includes joining.
func rawConsume(ctx context.Context, b *testing.B, brokers, group string, end map[int32]int64, fetch []kgo.Opt) rawResult {
	b.Helper()
	start := time.Now()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers), kgo.ConsumerGroup(group), kgo.ConsumeTopics(testenv.ApplyTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit()}, fetch...)...)
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
	first    time.Time  // /status first showed a partition consumed past offset 0
	consumed time.Time  // /status first showed every partition consumed to its end
	done     time.Time  // checkpoint and Redis offsets at the end
	status   *latencies // of the /status calls that answered
	// statusBefore is how many of them answered up to the one that
	// showed the first record.
	statusBefore int
}

// waitCommitted polls (every 10 ms) until the global checkpoint reaches ts
// and every apply partition's Redis offset equals its end offset, watching
// the consumer's /status at addr (every 500 ms) for its first record and its
// end of input; then it checks every bench flow's checkpoint once. It calls
// onFirst, unless nil, when it sees the first record.
func waitCommitted(ctx context.Context, b *testing.B, addr string, store *meta.Store, ts uint64, end map[int32]int64, sh benchShape, onFirst func()) pipeTimes {
	return waitCommittedEach(ctx, b, addr, store, ts, end, sh, onFirst, nil)
}

// waitCommittedEach is waitCommitted that also calls each, unless nil,
// every 250 ms from the first record on with the number of /status calls
// answered so far, until it returns true.
func waitCommittedEach(ctx context.Context, b *testing.B, addr string, store *meta.Store, ts uint64, end map[int32]int64, sh benchShape, onFirst func(), each func(statusN int) bool) pipeTimes {
	b.Helper()
	var (
		pt  = pipeTimes{status: &latencies{}}
		msg string
		cl  = &http.Client{Timeout: time.Second}
	)
	var polled, eachAt time.Time
	for ctx.Err() == nil {
		if each != nil && !pt.first.IsZero() && time.Since(eachAt) >= 250*time.Millisecond {
			eachAt = time.Now()
			if each(len(pt.status.d)) {
				each = nil
			}
		}
		// /status costs the consumer a Redis round trip and a JSON document
		// of every flow: every 500 ms is enough for the first record and the
		// end of input at the resolution the runs need, and keeps the poll from
		// taking the CPU it measures (at 300 flows a poll costs about 5 ms).
		if pt.consumed.IsZero() && time.Since(polled) >= 500*time.Millisecond {
			polled = time.Now()
			if next, err := statusNext(cl, "http://"+addr); err == nil {
				now, sum, all := time.Now(), int64(0), len(next) == len(end)
				pt.status.add(now.Sub(polled))
				for p, n := range next {
					n = max(n, 0) // -1: nothing consumed, as in a partition no region hashed to
					sum += n
					all = all && n == end[p]
				}
				if sum > 0 && pt.first.IsZero() {
					pt.first = now
					pt.statusBefore = len(pt.status.d)
					if onFirst != nil {
						onFirst()
					}
				}
				if all {
					pt.consumed = now
				}
			}
		}
		ok, m := commitDone(ctx, store, ts, end)
		if ok {
			pt.done = time.Now()
			if ok, m := flowsAt(ctx, store, ts, sh); !ok {
				b.Fatalf("the global checkpoint is at %d but %s", ts, m)
			}
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

// commitDone reports whether the global checkpoint reached ts and every
// partition's Redis offset its end, and if not, what is missing. It costs
// Redis a few calls however many flows there are: the poll must not take
// the CPU it measures.
func commitDone(ctx context.Context, store *meta.Store, ts uint64, end map[int32]int64) (bool, string) {
	if g, _, err := store.GlobalCheckpointTS(ctx); err != nil || g < ts {
		return false, fmt.Sprintf("global checkpoint %d (%v) < %d", g, err, ts)
	}
	for p, e := range end {
		if o, _, err := store.Offset(ctx, testenv.ApplyTopic, p); err != nil || o != e {
			return false, fmt.Sprintf("partition %d: Redis offset %d (%v), end %d", p, o, err, e)
		}
	}
	return true, ""
}

// flowsAt reports whether every flow of the shape has its checkpoint at ts
// or past it, and if not, which has not.
func flowsAt(ctx context.Context, store *meta.Store, ts uint64, sh benchShape) (bool, string) {
	for _, f := range sh.flows {
		id, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, f.name)
		if err != nil || !ok {
			return false, fmt.Sprintf("flow %s not created (%v)", f.name, err)
		}
		st, err := store.FlowState(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		if st.CheckpointTS < ts {
			return false, fmt.Sprintf("flow %s: checkpoint %d < %d", f.name, st.CheckpointTS, ts)
		}
	}
	return true, ""
}

// procMemory is what /proc/<pid>/status says of a process's memory, in
// bytes.
type procMemory struct {
	peak    int64 // VmHWM: peak resident set
	file    int64 // RssFile now: resident pages of mapped files (the binary's text)
	anonNow int64 // RssAnon now
}

// peakRSS reads p's VmHWM, RssFile and RssAnon.
func peakRSS(p *proc) (procMemory, error) {
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	v, err := testenv.ProcStatus(pid, "VmHWM", "RssFile", "RssAnon")
	if err != nil {
		return procMemory{}, err
	}
	return procMemory{peak: v["VmHWM"], file: v["RssFile"], anonNow: v["RssAnon"]}, nil
}

// tempDiskSampler records the largest size of a temp dir it sees, every
// 100 ms, until halted.
type tempDiskSampler struct {
	peak atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func sampleTempDisk(dir string) *tempDiskSampler {
	s := &tempDiskSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			_, n := faultDirBytes(dir)
			if n > s.peak.Load() {
				s.peak.Store(n)
			}
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *tempDiskSampler) halt() int64 {
	close(s.stop)
	<-s.done
	return s.peak.Load()
}

// uploadResult is what gcsAlone uploaded and how long it took.
type uploadResult struct {
	objects, data, cycles, parallel int
	catalogs                        int // catalog objects in the listing (not uploaded again)
	listed                          int // every object under the prefix
	bytes                           int64
	took                            time.Duration
}

// gcsAlone uploads the data and meta objects the pipeline wrote under
// prefix once more, to the same emulator under "alone/", the way the
// pipeline's flush cycles did: cycle after cycle, --upload-parallelism data
// objects of a cycle at once (layout v1: one per flow; layout v2: the
// cycle's one), each data object and then its meta, through the same GCS
// code (sink/gcs, with the upload chunk `consumer run` derives from
// --max-memory). Objects are read into memory a cycle at a time before
// its clock starts. Catalogs and checkpoint objects are left out. The time
// is the floor under any pipeline's on this machine and emulator.
// eachObject calls fn with the name of every object under prefix, in the
// bucket's listing order.
func eachObject(ctx context.Context, b *testing.B, bkt *storage.BucketHandle, prefix string, fn func(name string)) {
	b.Helper()
	it := bkt.Objects(ctx, &storage.Query{Prefix: prefix + "/"})
	for {
		attrs, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return
		}
		if err != nil {
			b.Fatalf("list objects: %v", err)
		}
		fn(attrs.Name)
	}
}

func gcsAlone(ctx context.Context, b *testing.B, c *cluster, prefix string, cfg pipeline.Config) uploadResult {
	bkt := c.GCS.Client.Bucket(c.GCS.Bucket)
	// cycle -> upload (flow id, or "" in layout v2) -> its data and meta
	type pair struct{ data, meta string }
	cycles := map[string]map[string]*pair{}
	add := func(cycle, unit, name string, data bool) {
		units := cycles[cycle]
		if units == nil {
			units = map[string]*pair{}
			cycles[cycle] = units
		}
		p := units[unit]
		if p == nil {
			p = &pair{}
			units[unit] = p
		}
		if data {
			p.data = name
		} else {
			p.meta = name
		}
	}
	catalogs, listed := 0, 0
	eachObject(ctx, b, bkt, prefix, func(name string) {
		listed++
		if unit, kind, ok := sink.V2Unit(prefix, name); ok {
			add(unit, "", name, kind == sink.GCData)
			return
		}
		base := path.Base(name)
		ext := path.Ext(base)
		if strings.Contains(name, "/catalog/") {
			catalogs++
		}
		if ext != ".log" && ext != ".meta" {
			return // a checkpoint or catalog object
		}
		// <min_ts or min_resolved_ts>-<flow_id>-<cycle_id><ext>
		parts := strings.SplitN(strings.TrimSuffix(base, ext), "-", 3)
		if len(parts) != 3 {
			b.Fatalf("object %s: name not <ts>-<flow_id>-<cycle_id>", name)
		}
		add(parts[2], parts[1], name, ext == ".log")
	})
	ids := slices.Sorted(maps.Keys(cycles))
	gb, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr, ChunkSize: cfg.UploadChunkSize()})
	if err != nil {
		b.Fatalf("gcs: %v", err)
	}
	defer gb.Close()
	res := uploadResult{cycles: len(ids), parallel: cfg.UploadParallel, catalogs: catalogs, listed: listed}
	read := func(name string) []byte {
		r, err := bkt.Object(name).NewReader(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		data, err := io.ReadAll(r)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	for _, id := range ids {
		type unitBytes struct {
			names  []string
			bodies [][]byte
		}
		var units []unitBytes
		for _, u := range slices.Sorted(maps.Keys(cycles[id])) {
			p := cycles[id][u]
			if p.meta == "" {
				b.Fatalf("cycle %s: a data object without its meta", id)
			}
			var ub unitBytes
			for _, name := range []string{p.data, p.meta} {
				if name == "" {
					continue // a layout v2 meta of coverage reports only
				}
				ub.names = append(ub.names, name)
				ub.bodies = append(ub.bodies, read(name))
				res.objects++
				res.bytes += int64(len(ub.bodies[len(ub.bodies)-1]))
			}
			if p.data != "" {
				res.data++
			}
			units = append(units, ub)
		}
		start := time.Now()
		sem := make(chan struct{}, cfg.UploadParallel)
		errs := make([]error, len(units))
		var wg sync.WaitGroup
		for i, ub := range units {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				for j, body := range ub.bodies {
					err := gb.Upload(ctx, sink.Object{Name: "alone/" + ub.names[j], Body: bytes.NewReader(body),
						Size: int64(len(body)), CRC32C: sink.CRC32C(body)})
					if err != nil {
						errs[i] = err
						return
					}
				}
			})
		}
		wg.Wait()
		res.took += time.Since(start)
		if err := errors.Join(errs...); err != nil {
			b.Fatalf("upload cycle %s again: %v", id, err)
		}
	}
	return res
}
