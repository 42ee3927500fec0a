package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// alertScale is how much faster than in deploy/prometheus/alerts.yml the
// flush-failure alert's windows and `for` run in TestPrometheusMonitoring:
// its 10m window becomes 15s and its 5m `for` 8s.
const alertScale = 40

// TestPrometheusMonitoring runs a real Prometheus against a running
// consumer (scraped every second, with deploy/prometheus.yml's jobs) and a
// real Pushgateway. During a load, every GCS write fails for a while:
// FlowlogFlushFailing (its windows scaled down, its expression the same)
// must reach "firing" in /api/v1/alerts and clear once GCS heals. Then
// snapshot, truncate and gc push their metrics to the Pushgateway, and
// every PromQL expression of every Grafana dashboard panel must parse and
// return at least one series from /api/v1/query: a panel that cannot show
// data on a stack that did all of this is a defect.
func TestPrometheusMonitoring(t *testing.T) {
	const partitions = 4
	c := startCluster(t, partitions)
	proxy := startFaultProxy(t, c.GCS.Addr)
	pg := startPushgateway(t)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--gcs-endpoint", proxy.Addr, "--fatal-after", "100000",
		"--retry-backoff", "100ms", "--max-retry-delay", "1s")
	prom := startPrometheus(t, scaledAlerts(t, alertScale, "FlowlogFlushFailing"), func(self string) map[string]string {
		return map[string]string{"flowlog-consumer": cons.Addr, "pushgateway": pg.Addr, "prometheus": self}
	})

	// A record with a bad key: the DLQ panels have a reason to show.
	dlqProducer, err := kgo.NewClient(kgo.SeedBrokers(c.Broker.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer dlqProducer.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bad := event.EncodeBatch(nil, &event.Batch{RegionID: 77, Events: []event.Event{{Key: []byte("tshort"), Value: []byte("v"), CF: event.CFWrite, Op: event.Op_OP_PUT}}})
	if err := dlqProducer.ProduceSync(ctx, &kgo.Record{Topic: testenv.ApplyTopic, Key: []byte("77"), Value: bad}).FirstErr(); err != nil {
		t.Fatalf("produce a bad record: %v", err)
	}

	load := faultLoad(30_000, 3001, time.Date(2026, 7, 1, 10, 0, 0, 0, time.UTC))
	want := faultExpect(load)
	l := crashLoadAsync(t, c, load, 1500) // about 20 s
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFor(t, time.Minute, func() (bool, string) {
		st, err := faultFlowState(store)
		return err == nil && st.CheckpointTS > 0, fmt.Sprintf("no checkpoint yet (%v)", err)
	})

	proxy.setFaults(1, fault503)
	failedAt := time.Now()
	waitForOrStop(t, 2*time.Minute, func() (bool, string, error) {
		if !cons.Running() {
			return false, "", fmt.Errorf("consumer exited: %v", cons.Wait())
		}
		st, err := promAlertState(prom.Addr, "FlowlogFlushFailing")
		return st == "firing", fmt.Sprintf("FlowlogFlushFailing %q (%v), %d GCS writes failed", st, err, proxy.injected()), nil
	})
	t.Logf("FlowlogFlushFailing firing %v after GCS began failing every write", time.Since(failedAt).Round(time.Second))
	proxy.setFaults(0, fault503)
	healedAt := time.Now()
	waitFor(t, 2*time.Minute, func() (bool, string) {
		st, err := promAlertState(prom.Addr, "FlowlogFlushFailing")
		return err == nil && st == "", fmt.Sprintf("FlowlogFlushFailing still %q (%v) after GCS healed", st, err)
	})
	t.Logf("FlowlogFlushFailing cleared %v after GCS healed", time.Since(healedAt).Round(time.Second))
	l.Wait(t)
	faultCheckBackup(t, c, want, 2*time.Minute)

	// The retention commands push to the Pushgateway, as the compose
	// stack's retention job does.
	push := []string{"--metrics-push-url", "http://" + pg.Addr}
	for _, cmd := range [][]string{
		{"snapshot", "--flow", faultFlow},
		{"truncate", "--flow", faultFlow, "--until", "-1s"},
		{"gc", "--grace", "1s"},
	} {
		if r := oracleRun(t, cmd[0], c.oracleConn(), append(cmd[1:], push...)...); r.code != 0 {
			t.Fatalf("consumer %s exited %d:\n%s", strings.Join(cmd, " "), r.code, r.out)
		}
	}
	waitFor(t, time.Minute, func() (bool, string) {
		n, err := promQuery(prom.Addr, `flowlog_op_last_success_timestamp_seconds`)
		return n == 3, fmt.Sprintf("%d of the 3 commands' last-success series scraped from the Pushgateway (%v)", n, err)
	})

	panels := dashboardPanels(t)
	names := make([]string, 0, len(panels))
	for name := range panels {
		names = append(names, name)
	}
	sort.Strings(names)
	// A panel may need a scrape or two after the pushes; keep asking until
	// every one answers, and report the ones that never did.
	var empty []string
	waitFor(t, time.Minute, func() (bool, string) {
		empty = empty[:0]
		for _, name := range names {
			expr := grafanaExpr(panels[name])
			n, err := promQuery(prom.Addr, expr)
			if err != nil {
				t.Fatalf("panel %s: %q does not run: %v", name, expr, err)
			}
			if n == 0 {
				empty = append(empty, fmt.Sprintf("%s (%s)", name, expr))
			}
		}
		return len(empty) == 0, fmt.Sprintf("%d of %d panel queries return no series:\n%s", len(empty), len(names), strings.Join(empty, "\n"))
	})
	t.Logf("%d panel queries of the dashboards each returned data", len(names))
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
