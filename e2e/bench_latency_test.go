package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/api/iterator"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// BenchmarkLatency's knobs: the defaults are the steady load the consumer's
// latency target is set for.
var (
	latencyRate     = flag.Float64("latency-rate", 20, "BenchmarkLatency: MB/s of record values produced")
	latencyDuration = flag.Duration("latency-duration", 60*time.Second, "BenchmarkLatency: how long to produce")
	latencyFlush    = flag.Duration("latency-flush-interval", time.Second, "BenchmarkLatency: the consumer's --flush-interval")
	latencyValue    = flag.Int("latency-value-size", 300, "BenchmarkLatency: bytes per value (above 255 they go to the default CF)")
)

// BenchmarkLatency measures produce -> committed-in-Redis latency under a
// steady load: a consumer with default flags (but --flush-interval) runs
// caught up on an empty topic of 8 partitions with the benchmark's 3 flows,
// then the producer publishes at -latency-rate MB/s of record values (default
// 20) for -latency-duration (60 s), one load of -latency-value-size (300 B)
// values over 4 tables and 16 regions. Meanwhile the benchmark polls every
// partition's committed offset in Redis every 10 ms and keeps the moments it
// moved. Afterwards it reads the topic back: a record's latency is the first
// moment its partition's committed offset passed it minus the record's
// timestamp (set by the producer's client when it produced it). It reports
// p50, p99 and max of the records' latencies (the poll adds up to 10 ms), the
// rate achieved, the consumer's CPU per GB and peak RSS, and the data and
// meta objects it uploaded from the first produce to all committed, scaled
// to an hour, with the data objects' mean size (a steady trickle must not
// turn into a stream of tiny objects). The target is
// p99 <= flush interval + 2 s: a cycle's upload and commit should take at
// most 2 s beyond its trigger. Run it with (-count for more runs: each
// iteration of -benchtime would start its consumer behind the previous
// iteration's load)
//
//	go test ./e2e -run '^$' -bench Latency -benchtime 1x [-count 3] [-latency-duration 60s -latency-rate 20]
func BenchmarkLatency(b *testing.B) {
	c := startCluster(b, benchPartitions)
	for _, f := range benchFlows {
		runProducer(b, "flow", "create", "--brokers", c.Broker.Addr, "--name", f.name, "--tables", f.tableList())
	}
	cfg := loadgen.Config{Tables: []int64{1, 2, 3, 4}, Regions: benchRegions, ValueSize: *latencyValue, Seed: 31, StartTime: time.Now().UTC()}
	eventsPerSec, txns := latencyPlan(cfg, *latencyRate*1e6, *latencyDuration)
	cfg.Events = txns
	var defaults pipeline.Config
	defaults.RegisterFlags(flag.NewFlagSet("defaults", flag.ContinueOnError))
	rdb := c.Redis.Client(b)
	ctx, cancel := context.WithTimeout(context.Background(), *latencyDuration+10*time.Minute)
	defer cancel()

	b.ResetTimer()
	for i := range b.N {
		prefix := fmt.Sprintf("lat%d", i)
		store := meta.NewStore(rdb, prefix, nil)
		cons := c.startConsumer(b, fmt.Sprintf("latency-consumer-%d", i), "--group", fmt.Sprintf("latency-%d", i),
			"--redis-prefix", prefix, "--gcs-prefix", prefix,
			"--flush-interval", latencyFlush.String(), "--flush-size", defaults.FlushSize.String())
		waitFor(b, 60*time.Second, func() (bool, string) { // joined and caught up on what came before
			resp, err := http.Get("http://" + cons.Addr + "/readyz")
			if err != nil {
				return false, err.Error()
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK, "/readyz: " + resp.Status
		})
		adm := newAdmin(b, c.Broker.Addr)
		from := map[int32]int64{}
		endOffsets(ctx, b, adm).Each(func(o kadm.ListedOffset) { from[o.Partition] = o.Offset })
		poll := pollCommits(ctx, store, benchPartitions)
		cpu0 := restoreProcCPU(cons)
		objs0, loadStart := countPrefixObjects(ctx, b, c, prefix), time.Now()
		out := benchProduce(b, append([]string{"load", "--brokers", c.Broker.Addr, "--rate", strconv.FormatFloat(eventsPerSec, 'f', 1, 64)}, loadArgs(cfg)...)...)
		maxResolved, err := parseMaxResolved(out)
		if err != nil {
			b.Fatal(err)
		}
		end := map[int32]int64{}
		endOffsets(ctx, b, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
		adm.Close()
		var msg string
		for ok := false; !ok && ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
			ok, msg = commitDone(ctx, store, maxResolved, end)
		}
		if ctx.Err() != nil {
			b.Fatalf("the load was not committed: %s", msg)
		}
		commits := poll.halt()
		objs, window := countPrefixObjects(ctx, b, c, prefix).minus(objs0), time.Since(loadStart)
		perHour := float64(objs.data+objs.meta) * float64(time.Hour) / float64(window)
		cpu := restoreProcCPU(cons) - cpu0
		mem, err := peakRSS(cons)
		if err != nil {
			b.Errorf("peak RSS: %v", err)
		}
		if err := cons.Stop(); err != nil {
			b.Errorf("consumer exit after SIGTERM: %v", err)
		}
		recs, bytes, span := recordLatencies(ctx, b, c.Broker.Addr, from, end, commits)
		lat := make([]float64, len(recs))
		for i, r := range recs {
			lat[i] = r.latency
		}
		slices.Sort(lat)
		p50, p99, worst := quantile(lat, 0.50), quantile(lat, 0.99), lat[len(lat)-1]
		mb := float64(bytes) / 1e6
		b.ReportMetric(p50, "p50_s")
		b.ReportMetric(p99, "p99_s")
		b.ReportMetric(worst, "max_s")
		b.ReportMetric(mb/span.Seconds(), "produced_MB/s")
		b.ReportMetric(cpu/(mb/1e3), "cpu_s/GB")
		b.ReportMetric(float64(mem.peak)/(1<<20), "peak_RSS_MiB")
		b.ReportMetric(perHour, "objects/h")
		b.ReportMetric(objs.meanData()/1e6, "MB/data_object")
		fmt.Printf("BenchmarkLatency: %d records, %.1f MB of values produced over %.1fs (%.1f MB/s; asked %.1f MB/s for %v: %d transactions of %d B values at %.0f events/s; %d partitions, %d regions, %d flows; --flush-interval %v, other flags default):\n"+
			"  produce -> committed in Redis per record: p50 %.2fs, p99 %.2fs, max %.2fs (target p99 <= %.1fs)\n"+
			"  p99 per 10 s of produce time: %s\n"+
			"  consumer %.1f CPU s (%.1f core-s/GB of values), peak RSS %.1f MiB\n"+
			"  objects  %d data and %d meta objects in the %.1fs from the first produce to all committed: %.0f per hour, data objects of %.2f MB on average\n",
			len(lat), mb, span.Seconds(), mb/span.Seconds(), *latencyRate, *latencyDuration, cfg.Events, cfg.ValueSize, eventsPerSec,
			benchPartitions, benchRegions, len(benchFlows), *latencyFlush,
			p50, p99, worst, (*latencyFlush + 2*time.Second).Seconds(), windowP99(recs, 10*time.Second),
			cpu, cpu/(mb/1e3), float64(mem.peak)/(1<<20),
			objs.data, objs.meta, window.Seconds(), perHour, objs.meanData()/1e6)
	}
}

// quantile is the q quantile (nearest rank) of sorted xs.
func quantile(xs []float64, q float64) float64 {
	return xs[max(0, min(len(xs)-1, int(math.Ceil(q*float64(len(xs))))-1))]
}

// windowP99 is the p99 latency of the records of each window of produce
// time, in order: a p99 that grows window after window is a consumer
// falling behind the load, a flat one a consumer keeping up.
func windowP99(recs []recordLatency, w time.Duration) string {
	if len(recs) == 0 {
		return ""
	}
	first := recs[0].produced
	for _, r := range recs {
		if r.produced.Before(first) {
			first = r.produced
		}
	}
	var wins [][]float64
	for _, r := range recs {
		i := int(r.produced.Sub(first) / w)
		for len(wins) <= i {
			wins = append(wins, nil)
		}
		wins[i] = append(wins[i], r.latency)
	}
	var out []string
	for _, l := range wins {
		if len(l) == 0 {
			out = append(out, "-")
			continue
		}
		slices.Sort(l)
		out = append(out, fmt.Sprintf("%.2fs", quantile(l, 0.99)))
	}
	return strings.Join(out, " ")
}

// recordLatency is one record's produce time and produce -> commit latency
// in seconds.
type recordLatency struct {
	produced time.Time
	latency  float64
}

// latencyPlan sizes a load of cfg's shape to bytesPerSec of record values
// for d from a 20,000-transaction sample: the producer's --rate (events per
// second) and the number of transactions.
func latencyPlan(cfg loadgen.Config, bytesPerSec float64, d time.Duration) (eventsPerSec float64, txns int) {
	cfg.Events = 20_000
	g := loadgen.New(cfg)
	var bytes int
	var buf []byte
	for bt, ok := g.Next(); ok; bt, ok = g.Next() {
		buf = event.EncodeBatch(buf[:0], bt)
		bytes += len(buf)
	}
	eventsPerSec = bytesPerSec / (float64(bytes) / float64(g.Events()))
	txns = int(eventsPerSec * d.Seconds() * float64(g.Transactions()) / float64(g.Events()))
	return eventsPerSec, max(txns, 1)
}

// commitSample is a moment at which a partition's committed offset (the
// next offset to consume) was seen in Redis.
type commitSample struct {
	at     time.Time
	offset int64
}

// commitPoller polls the committed offsets of partitions 0..n-1 in Redis
// every 10 ms, keeping each change with the time it was seen.
type commitPoller struct {
	stop    chan struct{}
	done    chan struct{}
	samples map[int32][]commitSample
}

func pollCommits(ctx context.Context, store *meta.Store, n int32) *commitPoller {
	p := &commitPoller{stop: make(chan struct{}), done: make(chan struct{}), samples: map[int32][]commitSample{}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			for part := range n {
				o, _, err := store.Offset(ctx, testenv.ApplyTopic, part)
				if err != nil {
					continue // not yet, or Redis busy: the next poll sees it
				}
				now := time.Now()
				s := p.samples[part]
				if len(s) == 0 || o > s[len(s)-1].offset {
					p.samples[part] = append(s, commitSample{now, o})
				}
			}
			select {
			case <-p.stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// halt stops the poller and returns what it saw.
func (p *commitPoller) halt() map[int32][]commitSample {
	close(p.stop)
	<-p.done
	return p.samples
}

// recordLatencies reads the records of every partition from from[p] to
// end[p] and returns each record's produce -> commit latency, the records'
// value bytes and the span of their timestamps.
func recordLatencies(ctx context.Context, b *testing.B, brokers string, from, end map[int32]int64, commits map[int32][]commitSample) ([]recordLatency, int64, time.Duration) {
	b.Helper()
	offsets := map[string]map[int32]kgo.Offset{testenv.ApplyTopic: {}}
	left := 0
	for p, o := range from {
		offsets[testenv.ApplyTopic][p] = kgo.NewOffset().At(o)
		if end[p] > o {
			left++
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumePartitions(offsets))
	if err != nil {
		b.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	var (
		lat         []recordLatency
		bytes       int64
		first, last time.Time
	)
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			b.Fatalf("read back the load: %d partitions short of the end", left)
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				b.Fatalf("fetch %s/%d: %v", topic, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end[r.Partition] {
				return
			}
			s := commits[r.Partition]
			i := sort.Search(len(s), func(i int) bool { return s[i].offset > r.Offset })
			if i == len(s) {
				b.Fatalf("record %d/%d: never seen committed", r.Partition, r.Offset)
			}
			lat = append(lat, recordLatency{r.Timestamp, s[i].at.Sub(r.Timestamp).Seconds()})
			bytes += int64(len(r.Value))
			if first.IsZero() || r.Timestamp.Before(first) {
				first = r.Timestamp
			}
			if r.Timestamp.After(last) {
				last = r.Timestamp
			}
			if r.Offset+1 == end[r.Partition] {
				left--
			}
		})
	}
	if len(lat) == 0 {
		b.Fatal("no records produced")
	}
	return lat, bytes, last.Sub(first)
}

// objectCount is how many data and meta objects a prefix holds (either
// layout; checkpoints and catalogs are not counted), and the data
// objects' bytes.
type objectCount struct {
	data, meta int
	dataBytes  int64
}

// minus is what c holds beyond an earlier count.
func (c objectCount) minus(earlier objectCount) objectCount {
	return objectCount{data: c.data - earlier.data, meta: c.meta - earlier.meta, dataBytes: c.dataBytes - earlier.dataBytes}
}

// meanData is the mean size of the data objects in bytes (0 with none).
func (c objectCount) meanData() float64 {
	if c.data == 0 {
		return 0
	}
	return float64(c.dataBytes) / float64(c.data)
}

// countPrefixObjects counts the data and meta objects the consumer wrote under
// prefix (docs/FORMAT.md, "Object names" of both layouts).
func countPrefixObjects(ctx context.Context, b *testing.B, c *cluster, prefix string) objectCount {
	b.Helper()
	var n objectCount
	it := c.GCS.Client.Bucket(c.GCS.Bucket).Objects(ctx, &storage.Query{Prefix: prefix + "/"})
	for {
		attrs, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return n
		}
		if err != nil {
			b.Fatalf("list objects: %v", err)
		}
		kind := ""
		if _, k, ok := sink.V2Unit(prefix, attrs.Name); ok {
			kind = k
		} else if !strings.Contains(attrs.Name, "/catalog/") {
			switch path.Ext(attrs.Name) {
			case ".log":
				kind = sink.GCData
			case ".meta":
				kind = sink.GCMeta
			}
		}
		switch kind {
		case sink.GCData:
			n.data++
			n.dataBytes += attrs.Size
		case sink.GCMeta:
			n.meta++
		}
	}
}
