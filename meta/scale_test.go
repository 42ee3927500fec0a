package meta_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// The replica sweep of docs/SIZING.md, "Replicas and Redis". It is off by
// default (minutes of load on a shared machine); TestReplicaLoad runs the
// same simulation at a small size in every test run. Run it with
//
//	go test ./meta -run TestReplicaScale -meta-scale -timeout 2h -v
var (
	scaleOn         = flag.Bool("meta-scale", false, "run the replica sweep against one redis-server")
	scaleReplicas   = flag.String("meta-scale-replicas", "1,8,32,128,256,512", "replica counts to sweep")
	scaleFlows      = flag.String("meta-scale-flows", "3,300", "flow counts to sweep")
	scalePartitions = flag.Int("meta-scale-partitions", 1024, "apply partitions")
	scaleRegions    = flag.Int("meta-scale-regions", 4, "regions per partition")
	scaleDuration   = flag.Duration("meta-scale-duration", 20*time.Second, "measured time per point (after a warm-up of 3 intervals)")
	scaleRuns       = flag.Int("meta-scale-runs", 3, "runs per point")
	scaleDDL        = flag.Duration("meta-scale-ddl", 5*time.Second, "a replace adding a table to a flow this often (0: none)")
	scaleOut        = flag.String("meta-scale-out", "", "append the table rows to this file")
)

// simRun is one simulation against its own redis-server.
type simRun struct {
	shape    simShape
	redis    *testenv.Redis
	admin    *meta.Store
	replicas []*simReplica
	reg      *prometheus.Registry
	stats    simStats
	ddls     atomic.Uint64
	rec      atomic.Bool // cycles starting while set are recorded
}

// startSim starts a redis-server, creates the flows and assigns every
// partition to its replica.
func startSim(t testing.TB, shape simShape) *simRun {
	t.Helper()
	ctx := context.Background()
	r := &simRun{shape: shape, redis: testenv.StartRedis(t), reg: prometheus.NewRegistry()}
	r.admin = meta.NewStore(r.redis.Client(t), "", nil)
	if err := simFlows(ctx, r.admin, shape.Flows); err != nil {
		t.Fatalf("create flows: %v", err)
	}
	// The flows were created before any partition had records: their
	// creation's coverage entries are final at once. Created under load,
	// each entry takes a report from every partition in its owner's next
	// commit (see docs/SIZING.md, "Replicas and Redis").
	if _, err := r.admin.FinalizeCoverage(ctx, simTopic, nil); err != nil {
		t.Fatalf("finalize the creation's coverage: %v", err)
	}
	for i := range shape.Replicas {
		rep := newSimReplica(r.redis.Addr, i, shape, r.reg)
		t.Cleanup(rep.close)
		if err := rep.assign(ctx); err != nil {
			t.Fatalf("assign replica %d: %v", i, err)
		}
		r.replicas = append(r.replicas, rep)
	}
	return r
}

// run runs every replica and the DDL driver until done returns true (it is
// polled every 50 ms).
func (r *simRun) run(t testing.TB, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, rep := range r.replicas {
		phase := time.Duration(rand.Int64N(int64(r.shape.Interval)))
		wg.Go(func() { rep.run(ctx, phase, &r.rec, &stop, &r.ddls, &r.stats) })
	}
	ddlErr := make(chan error, 1)
	go func() { ddlErr <- ddlDriver(ctx, r.admin, r.shape, &r.rec, &r.ddls) }()
	for !done() {
		time.Sleep(50 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	cancel()
	if err := <-ddlErr; err != nil {
		t.Errorf("ddl driver: %v", err)
	}
}

// measure runs one point of the sweep: a warm-up of at least 3 intervals
// that lasts until the coverage entries of the flows' creation are final
// (every partition reports them once, a burst that is not the steady
// state), then the configured duration with DDLs.
func measure(t *testing.T, shape simShape) simResult {
	sim := startSim(t, shape)
	ctx := context.Background()
	info := sim.redis.Client(t)
	warm := time.Now().Add(3 * shape.Interval)
	var a, b redisSample
	var err error
	sim.run(t, func() bool {
		now := time.Now()
		if sim.failed() {
			return true
		}
		if !sim.rec.Load() {
			if now.Before(warm) {
				return false
			}
			if pending, err := sim.admin.PendingCoverage(ctx); err != nil || len(pending) > 0 {
				return false
			}
			if a, err = sampleRedis(ctx, info, sim.reg); err != nil {
				t.Error(err)
				return true
			}
			sim.rec.Store(true)
		}
		if now.Before(a.sampled.Add(*scaleDuration)) {
			return false
		}
		if b, err = sampleRedis(ctx, info, sim.reg); err != nil {
			t.Error(err)
		}
		sim.rec.Store(false) // cycles starting from now on are not counted
		return true
	})
	res := newSimResult(shape, &sim.stats, a, b)
	for _, rep := range sim.replicas {
		res.finErrs += rep.finErrs.Load()
		if err, ok := rep.lastFinErr.Load().(error); ok {
			res.finErr = err
		}
	}
	return res
}

// failed reports whether a replica ended on an error.
func (r *simRun) failed() bool {
	r.stats.mu.Lock()
	defer r.stats.mu.Unlock()
	return len(r.stats.errs) > 0
}

func ints(t *testing.T, s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("bad list %q: %v", s, err)
		}
		out = append(out, n)
	}
	return out
}

// TestReplicaScale sweeps replicas and flows (off without -meta-scale) and
// prints the rows of the table in docs/SIZING.md, "Replicas and Redis".
func TestReplicaScale(t *testing.T) {
	if !*scaleOn {
		t.Skip("the replica sweep runs with -meta-scale")
	}
	host, _ := os.Hostname()
	t.Logf("machine %s, %d CPUs (load: %s)", host, numCPU(), loadAvg())
	var rows []string
	for _, flows := range ints(t, *scaleFlows) {
		for _, n := range ints(t, *scaleReplicas) {
			for run := range *scaleRuns {
				shape := simShape{Replicas: n, Partitions: *scalePartitions, Flows: flows, Regions: *scaleRegions,
					Interval: time.Second, DDLEvery: *scaleDDL}
				var res simResult
				t.Run(fmt.Sprintf("replicas=%d/flows=%d/run=%d", n, flows, run), func(t *testing.T) {
					res = measure(t, shape)
				})
				row := res.row()
				rows = append(rows, row)
				t.Logf("%s\n  self %.2f cores, advance moved %.2f flows/cycle, retries %v, errors %d, failed finalisations %d, top: %s, top µs: %s, load %s",
					row, res.selfCores, res.flowsMovedPerCycle, res.retries, len(res.errs), res.finErrs, res.topCmds, res.topTime, loadAvg())
				if res.finErr != nil {
					t.Logf("  last failed finalisation: %v", res.finErr)
				}
				for _, err := range res.errs[:min(3, len(res.errs))] {
					t.Logf("  error: %v", err)
				}
				if *scaleOut != "" {
					appendLine(t, *scaleOut, row)
				}
			}
		}
	}
	t.Logf("\n%s\n%s", simHeader, strings.Join(rows, "\n"))
}

func appendLine(t *testing.T, path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, line); err != nil {
		t.Fatal(err)
	}
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	return strings.Join(f[:min(3, len(f))], " ")
}

func numCPU() int {
	raw, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(raw), "processor\t:")
}
