package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/pipeline"
)

// bpSample is what the backpressure sampler saw at one instant.
type bpSample struct {
	at        time.Duration
	tempBytes int64 // sum of file sizes under --temp-dir
	rss       int64 // VmRSS of the consumer, bytes
	paused    bool
}

// bpPID is the pid of p's current process.
func bpPID(p *proc) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// bpRSS reads VmRSS of pid from /proc, in bytes.
func bpRSS(pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// bpPaused reports /status fetching_paused (false if /status fails: the
// sampler runs off the test goroutine and must not t.Fatal).
func bpPaused(addr string) bool {
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var st pipeline.Status
	return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Paused
}

// bpSampler samples the consumer every 100ms until stop is called.
type bpSampler struct {
	mu      sync.Mutex
	samples []bpSample
	stop    chan struct{}
	done    chan struct{}
}

func startSampler(t *testing.T, cons *proc, tempDir string) *bpSampler {
	s := &bpSampler{stop: make(chan struct{}), done: make(chan struct{})}
	pid := bpPID(cons)
	start := time.Now()
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			_, b := faultDirBytes(tempDir)
			smp := bpSample{at: time.Since(start), tempBytes: b, rss: bpRSS(pid), paused: bpPaused(cons.Addr)}
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.halt)
	return s
}

func (s *bpSampler) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// TestBackpressure: with --max-temp-bytes 2MiB and every GCS request
// delayed 300ms, a backlog of several times the bound is consumed with
// fetching paused whenever temp files (current and in flight) pass the
// bound: the temp dir stays under the bound plus a documented slack, RSS
// stays flat, and all data arrives in the end.
//
// Slack: the consumer checks the bound after it has written a whole poll's
// records, and a poll holds one fetch per broker (one here) of at most
// max(--max-temp-bytes/8, 1 MiB) bytes (pipeline.Config.FetchOpts). The
// temp files are the objects' compressed chunks, counted uncompressed in the
// bound, so the dir holds less than the bound says; the check still allows
// a second max-temp-bytes, which older versions needed for a spool copy of
// the cycle being uploaded. So the bound checked is max-temp-bytes + 1 MiB
// (one fetch) + max-temp-bytes.
func TestBackpressure(t *testing.T) {
	const (
		partitions   = 4
		maxTempBytes = 2 << 20
		slack        = 1<<20 + maxTempBytes
	)
	c := startCluster(t, partitions)
	proxy := startFaultProxy(t, c.GCS.Addr)
	proxy.setLatency(300 * time.Millisecond)
	load := loadgen.Config{Events: 30_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 512, Seed: 506,
		StartTime: time.Date(2026, 4, 5, 10, 0, 0, 0, time.UTC)}
	want := faultExpect(load)

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load)...)...)
	tempDir := t.TempDir()
	cons := c.startConsumer(t, "consumer-1", "--gcs-endpoint", proxy.Addr, "--temp-dir", tempDir,
		"--max-temp-bytes", "2MiB", "--flush-size", "1MiB", "--flush-interval", "1s")
	smp := startSampler(t, cons, tempDir)
	got, dup := faultCheckBackup(t, c, want, 80*time.Second)
	smp.halt()

	var peakTemp, peakRSS, firstRSS, lateRSS int64
	paused := 0
	n := len(smp.samples)
	for i, s := range smp.samples {
		peakTemp, peakRSS = max(peakTemp, s.tempBytes), max(peakRSS, s.rss)
		if s.paused {
			paused++
		}
		if i < n/3 {
			firstRSS = max(firstRSS, s.rss)
		} else if i >= 2*n/3 {
			lateRSS = max(lateRSS, s.rss)
		}
	}
	t.Logf("backpressure: %d events produced, %d of the flow, %d backed up in %d chunks of %d metas; %d duplicates; "+
		"%d samples over %v, paused in %d; peak temp dir %d bytes (bound %d + slack %d); peak RSS %d MiB (first third %d MiB, last third %d MiB); %d GCS requests delayed",
		expectLoad(load).events, want.total, got.entries, got.chunks, got.metas, dup,
		n, smp.samples[n-1].at.Round(time.Millisecond), paused, peakTemp, maxTempBytes, slack, peakRSS>>20, firstRSS>>20, lateRSS>>20, proxy.requests.Load())
	if paused == 0 {
		t.Errorf("/status fetching_paused never seen true")
	}
	if peakTemp > maxTempBytes+slack {
		t.Errorf("temp dir peaked at %d bytes, over the bound %d + slack %d", peakTemp, maxTempBytes, slack)
	}
	// Flat: the late peak is not much above the early one (a leak would
	// grow with the backlog consumed).
	if lateRSS > firstRSS+firstRSS/2+32<<20 {
		t.Errorf("RSS grew from %d MiB (first third) to %d MiB (last third)", firstRSS>>20, lateRSS>>20)
	}
}
