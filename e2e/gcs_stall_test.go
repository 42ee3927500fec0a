package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// TestGCSStallFatal: a GCS that accepts every write and never answers. With
// --gcs-request-timeout 500ms each upload fails as an attempt (counted in
// flush_failures_total), --fatal-after 3 failed cycles make the flow fatal,
// as for any other GCS failure. With every request stalled, /readyz names
// GCS within its deadline. Once GCS answers again and the flow is resumed,
// everything is backed up exactly once.
func TestGCSStallFatal(t *testing.T) {
	const partitions = 2
	c := startCluster(t, partitions)
	proxy := startFaultProxy(t, c.GCS.Addr)
	load := faultLoad(4000, 2401, time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC))
	want := faultExpect(load)
	label := `flow="default/` + faultFlow + `"`

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	proxy.setFaults(1, faultHang)
	cons := c.startConsumer(t, "stall-1", "--gcs-endpoint", proxy.Addr, "--gcs-request-timeout", "500ms",
		"--fatal-after", "3", "--retry-backoff", "50ms", "--max-retry-delay", "200ms")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load)...)...)

	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	start := time.Now()
	faultWaitStatus(t, store, meta.StatusFatal, 2*time.Minute, func() string {
		return fmt.Sprintf("after %d hung writes", proxy.hangs.Load())
	})
	took := time.Since(start)
	failures, _ := faultMetric(t, cons.Addr, "flowlog_flush_failures_total", label)
	if failures < 3 {
		t.Errorf("flowlog_flush_failures_total{%s} = %v at fatal, want >= 3", label, failures)
	}
	st, err := faultFlowState(store)
	if err != nil || st.Error == "" {
		t.Errorf("fatal flow state %+v (%v): want the upload error recorded", st, err)
	}
	t.Logf("fatal %v after the first hung write, %d writes hung, %v failed cycles; error %q",
		took.Round(time.Millisecond), proxy.hangs.Load(), failures, st.Error)

	// Every request stalled, reads too: /readyz names GCS, and only GCS,
	// within its deadline (here the 500 ms request timeout fails the check
	// before the probe deadline calls it slow), and /status answers within
	// the deadline as well.
	proxy.setLatency(time.Minute)
	waitFor(t, 30*time.Second, func() (bool, string) {
		code, body, took := healthGet(t, cons.Addr, "/readyz")
		if took > 1500*time.Millisecond {
			t.Errorf("/readyz with GCS stalled took %v, want within 1s", took)
		}
		return code == http.StatusServiceUnavailable && strings.HasPrefix(body, "gcs: ") && !strings.Contains(body, "redis") && !strings.Contains(body, "kafka"),
			fmt.Sprintf("/readyz with GCS stalled: %d %q", code, body)
	})
	if _, _, took := healthGet(t, cons.Addr, "/status"); took > 1500*time.Millisecond {
		t.Errorf("/status with GCS stalled took %v, want within 1s", took)
	}
	proxy.setLatency(0)

	proxy.setFaults(0, fault503)
	runProducer(t, "flow", "resume", "--brokers", c.Broker.Addr, "--name", faultFlow)
	faultWaitStatus(t, store, meta.StatusActive, time.Minute, func() string { return "after resume" })
	faultCheckBackup(t, c, want, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", store, partitions)
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
