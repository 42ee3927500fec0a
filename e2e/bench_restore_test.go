package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
)

// restoreBenchMemory lists the --max-memory values BenchmarkRestore
// restores with ("" is the restore's default).
var restoreBenchMemory = flag.String("restore-max-memory", ",128MiB",
	"BenchmarkRestore: comma-separated --max-memory values to restore with (empty: the default)")

// restoreBenchFlow is the flow BenchmarkRestore restores: tables 2 and 3,
// half of the load's events.
const restoreBenchFlow = "fbench-b"

// BenchmarkRestore backs up BenchmarkPipeline's load (same shape and
// -bench-events knob, default 300,000 events; at 3,000,000 the restored flow
// holds about 700 MB of log) with a consumer of default flags (but
// --flush-interval), then restores flow fbench-b (tables 2 and 3) as of its
// checkpoint with each -restore-max-memory value (default: the restore's
// default, 256 MiB, and 128 MiB), each b.N times. It reports, per setting and
// run, the MB/s of log the restore read (its own figure: uncompressed chunk
// bytes over the time from planning to the last file written), its wall time,
// its peak RSS (the kernel's maxrss of the process, which is its VmHWM at
// exit), its CPU and the GCS emulator's meanwhile, and its peak temp dir. The
// targets are >= 150 MB/s and peak RSS <= --max-memory + 64 MiB: a restore's
// memory follows its flag, not the backup's size. Run it with
//
//	go test ./e2e -run '^$' -bench Restore -benchtime 1x -timeout 60m -bench-events 3000000
func BenchmarkRestore(b *testing.B) {
	events := benchEvents(b)
	c := startCluster(b, benchPartitions)
	for _, f := range benchFlows {
		runProducer(b, "flow", "create", "--brokers", c.Broker.Addr, "--name", f.name, "--tables", f.tableList())
	}
	var maxResolved uint64
	for _, cfg := range benchLoads(events, defaultBenchShape()) {
		res, err := parseMaxResolved(benchProduce(b, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...))
		if err != nil {
			b.Fatal(err)
		}
		maxResolved = max(maxResolved, res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	adm := newAdmin(b, c.Broker.Addr)
	end := map[int32]int64{}
	endOffsets(ctx, b, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	adm.Close()
	var defaults pipeline.Config
	defaults.RegisterFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	cons := c.startConsumer(b, "restore-bench-backup", "--flush-interval", benchFlushInterval, "--flush-size", defaults.FlushSize.String())
	start := time.Now()
	waitCommitted(ctx, b, cons.Addr, meta.NewStore(c.Redis.Client(b), "flowlog", nil), maxResolved, end, defaultBenchShape(), nil)
	b.Logf("backed up %d events in %v", events, time.Since(start).Round(time.Millisecond))
	if err := cons.Stop(); err != nil {
		b.Fatalf("consumer exit after SIGTERM: %v", err)
	}

	b.ResetTimer()
	for i := range b.N {
		for _, mem := range strings.Split(*restoreBenchMemory, ",") {
			r := restoreMeasured(ctx, b, c, restoreBenchFlow, mem)
			budget := int64(256 << 20)
			if mem != "" {
				var s cli.Size
				if err := s.Set(mem); err != nil {
					b.Fatalf("-restore-max-memory %q: %v", mem, err)
				}
				budget = int64(s)
			}
			verdict := func(ok bool) string {
				if ok {
					return "met"
				}
				return "MISSED"
			}
			unit := "default"
			if mem != "" {
				unit = mem
			}
			b.ReportMetric(r.logMB/r.took.Seconds(), "MB/s_"+unit)
			b.ReportMetric(float64(r.maxRSS)/(1<<20), "peak_RSS_MiB_"+unit)
			fmt.Printf("BenchmarkRestore run %d, --max-memory %s (%d MiB): flow %s of %d events: %.1f MB of log in %.2fs = %.1f MB/s (target 150: %s); wall %.2fs; "+
				"peak RSS %.1f MiB (target <= %d MiB: %s); CPU %.1fs user+sys (GCS emulator meanwhile %.1fs); peak temp dir %.1f MB; %s\n",
				i+1, unit, budget>>20, restoreBenchFlow, events, r.logMB, r.took.Seconds(), r.logMB/r.took.Seconds(), verdict(r.logMB/r.took.Seconds() >= 150),
				r.wall.Seconds(), float64(r.maxRSS)/(1<<20), (budget>>20)+64, verdict(r.maxRSS <= budget+64<<20), r.cpu, r.gcsCPU, float64(r.disk)/1e6, r.line)
			if !*restoreBenchReplay {
				continue
			}
			topic := fmt.Sprintf("replay.bench.%d.%s", i, strings.ReplaceAll(unit, "MiB", "m"))
			p := replayMeasured(ctx, b, c, mem, topic)
			b.ReportMetric(p.logMB/p.took.Seconds(), "replay_MB/s_"+unit)
			b.ReportMetric(float64(p.maxRSS)/(1<<20), "replay_peak_RSS_MiB_"+unit)
			fmt.Printf("BenchmarkRestore run %d, --max-memory %s: replay --mode log of the same flow into %s broker topic %s (%d partitions): %.1f MB of log in %.2fs = %.1f MB/s (target 150: %s; restore above: %.1f MB/s); "+
				"%d records, %.1f MB; wall %.2fs; peak RSS %.1f MiB (target <= %d MiB: %s); CPU %.1fs user+sys; broker CPU meanwhile %.1fs\n",
				i+1, unit, c.Broker.Kind, topic, benchPartitions, p.logMB, p.took.Seconds(), p.logMB/p.took.Seconds(), verdict(p.logMB/p.took.Seconds() >= 150), r.logMB/r.took.Seconds(),
				p.records, p.recordMB, p.wall.Seconds(), float64(p.maxRSS)/(1<<20), (budget>>20)+64, verdict(p.maxRSS <= budget+64<<20), p.cpu, p.brokerCPU)
		}
	}
}

// restoreBenchReplay makes BenchmarkRestore replay the flow after each
// restore, with restoreBenchCompression.
var (
	restoreBenchReplay = flag.Bool("restore-replay", true,
		"BenchmarkRestore: also replay (--mode log) the restored flow into a fresh topic of the benchmark's broker, with the same --max-memory")
	restoreBenchCompression = flag.String("restore-replay-compression", "", "BenchmarkRestore: the replay's --compression (default: its own default)")
)

// replayMeasure is what one measured replay did.
type replayMeasure struct {
	logMB     float64       // MB (1e6) of log read (log_bytes)
	took      time.Duration // the replay's own time (seconds)
	wall      time.Duration // the process's
	records   int64
	recordMB  float64 // MB of records written: keys, values, headers
	maxRSS    int64   // bytes
	cpu       float64 // user + system seconds
	brokerCPU float64 // the broker's user + system seconds meanwhile (0: not known)
}

// replayMeasured replays restoreBenchFlow (--mode log, the whole log) into
// a fresh topic of c's broker with benchPartitions partitions and
// --max-memory mem (none if empty), and measures it.
func replayMeasured(ctx context.Context, b *testing.B, c *cluster, mem, topic string) replayMeasure {
	b.Helper()
	adm := newAdmin(b, c.Broker.Addr)
	res, err := adm.CreateTopics(ctx, benchPartitions, 1, nil, topic)
	if err == nil {
		err = res.Error()
	}
	adm.Close()
	if err != nil {
		b.Fatalf("create topic %s: %v", topic, err)
	}
	args := append([]string{"replay"}, restoreConnArgs(c)...)
	args = append(args, "--brokers", c.Broker.Addr, "--flow", restoreBenchFlow, "--to-topic", topic, "--mode", "log", "--json")
	if mem != "" {
		args = append(args, "--max-memory", mem)
	}
	if *restoreBenchCompression != "" {
		args = append(args, "--compression", *restoreBenchCompression)
	}
	cmd, peak := peakCommand(ctx, b, binary(b, "consumer"), args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	brokerCPU := c.Broker.cpu()
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	brokerCPU = c.Broker.cpu() - brokerCPU
	if err != nil {
		b.Fatalf("replay: %v\n%s\n%s", err, out.String(), errOut.String())
	}
	var doc struct {
		Records  int64   `json:"records"`
		Bytes    int64   `json:"bytes"`
		LogBytes int64   `json:"log_bytes"`
		Seconds  float64 `json:"seconds"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		b.Fatalf("replay --json: %v in\n%s", err, out.String())
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		b.Fatalf("no rusage for the replay process")
	}
	maxRSS, err := peak()
	if err != nil {
		b.Fatalf("replay: %v", err)
	}
	return replayMeasure{
		logMB: float64(doc.LogBytes) / 1e6, took: time.Duration(doc.Seconds * float64(time.Second)), wall: wall,
		records: doc.Records, recordMB: float64(doc.Bytes) / 1e6,
		maxRSS: maxRSS,
		cpu:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(), brokerCPU: brokerCPU,
	}
}

// restoreMeasure is what one measured restore did.
type restoreMeasure struct {
	logMB  float64       // MB (1e6) of log read, from the restore's output
	took   time.Duration // the restore's own time, from its output
	wall   time.Duration // the process's, including connecting and listing metas
	maxRSS int64         // bytes
	cpu    float64       // user + system seconds
	gcsCPU float64       // the GCS emulator's user + system seconds meanwhile
	disk   int64         // peak bytes under --temp-dir
	line   string        // the restore's summary line
}

var restoreSummaryRE = regexp.MustCompile(`(?m)^(\d+ tables, \d+ keys, \d+ chunks from \d+ metas, ([\d.]+) MiB of log in ([\d.]+)s .*)$`)

// restoreMeasured restores flow into a fresh directory with --max-memory
// mem (none if empty) and the flags of extra (which replace those of
// restoreConnArgs), and measures it.
func restoreMeasured(ctx context.Context, b *testing.B, c *cluster, flow, mem string, extra ...string) restoreMeasure {
	b.Helper()
	dir := b.TempDir()
	temp := filepath.Join(dir, "temp")
	args := append([]string{"restore"}, overrideArgs(restoreConnArgs(c), extra...)...)
	args = append(args, "--flow", flow, "--out", filepath.Join(dir, "out"), "--temp-dir", temp)
	if mem != "" {
		args = append(args, "--max-memory", mem)
	}
	cmd, peak := peakCommand(ctx, b, binary(b, "consumer"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := os.MkdirAll(temp, 0o755); err != nil {
		b.Fatal(err)
	}
	disk := sampleTempDisk(temp)
	gcsCPU := restoreProcCPU(c.GCS.proc)
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	gcsCPU = restoreProcCPU(c.GCS.proc) - gcsCPU
	peakDisk := disk.halt()
	if err != nil {
		b.Fatalf("restore: %v\n%s", err, out.String())
	}
	m := restoreSummaryRE.FindStringSubmatch(out.String())
	if m == nil {
		b.Fatalf("no summary line in the restore's output:\n%s", out.String())
	}
	mib, _ := strconv.ParseFloat(m[2], 64)
	secs, _ := strconv.ParseFloat(m[3], 64)
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		b.Fatalf("no rusage for the restore process")
	}
	maxRSS, err := peak()
	if err != nil {
		b.Fatalf("restore: %v", err)
	}
	return restoreMeasure{
		logMB: mib * (1 << 20) / 1e6, took: time.Duration(secs * float64(time.Second)), wall: wall,
		maxRSS: maxRSS,
		cpu:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(),
		gcsCPU: gcsCPU, disk: peakDisk, line: m[1],
	}
}
