package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/pipeline"
)

// healthGet is one GET of path on a consumer: status, body and how long it
// took. A client timeout far past the probes' deadline leaves the server's
// own deadline as what is measured.
func healthGet(t *testing.T, addr, path string) (int, string, time.Duration) {
	t.Helper()
	cl := &http.Client{Timeout: 15 * time.Second}
	start := time.Now()
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v after %v", path, err, time.Since(start))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("GET %s: body: %v", path, err)
	}
	return resp.StatusCode, string(b), took
}

// TestHealthDuringRedisPause: while the real redis-server is paused
// (CLIENT PAUSE, every client), /readyz and /status answer within their
// 1 s deadline: /readyz 503 naming Redis as the dependency that does not
// answer, and only Redis; /status with the flows and partitions the
// consumer holds, the Redis part from its last read, and Redis reported
// slow. After the pause both are whole again.
func TestHealthDuringRedisPause(t *testing.T) {
	const deadline = time.Second
	// slack is for a shared, busy machine: scheduling, not waiting.
	const slack = 500 * time.Millisecond
	c := startCluster(t, 2)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumer(t, "health-1")
	// Records on both partitions establish the flow's windows.
	load := faultLoad(500, 2403, time.Date(2026, 6, 3, 10, 0, 0, 0, time.UTC))
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load)...)...)
	waitCheckpointOrExit(t, c, cons, faultExpect(load).maxResolved, time.Minute)
	waitFor(t, time.Minute, func() (bool, string) {
		code, body, _ := healthGet(t, cons.Addr, "/readyz")
		return code == http.StatusOK, "/readyz before the pause: " + body
	})
	waitFor(t, time.Minute, func() (bool, string) {
		_, body, _ := healthGet(t, cons.Addr, "/status")
		var st pipeline.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return false, err.Error()
		}
		return len(st.Flows) == 1 && len(st.Flows[0].Windows) == 2, "/status before the pause: " + body
	})

	rdb := c.Redis.Client(t)
	const pause = 8 * time.Second
	ctx := context.Background()
	if err := rdb.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	paused := time.Now()
	defer rdb.Do(context.Background(), "CLIENT", "UNPAUSE")

	// A check's outcome is reused for a second: the first answers may
	// still be those of before the pause. Every answer must come within
	// the deadline; within a few seconds they must name Redis, and only
	// Redis.
	answers := 0
	waitFor(t, 5*time.Second, func() (bool, string) {
		code, body, took := healthGet(t, cons.Addr, "/readyz")
		answers++
		t.Logf("/readyz %.1fs into the pause: %d %q in %v", time.Since(paused).Seconds(), code, strings.TrimSpace(body), took.Round(time.Millisecond))
		if took > deadline+slack {
			t.Errorf("/readyz during the pause took %v, want within %v", took, deadline)
		}
		return code == http.StatusServiceUnavailable, "/readyz during the pause: " + body
	})
	for range 2 { // the checks are running now: these find them so
		code, body, took := healthGet(t, cons.Addr, "/readyz")
		t.Logf("/readyz %.1fs into the pause: %d %q in %v", time.Since(paused).Seconds(), code, strings.TrimSpace(body), took.Round(time.Millisecond))
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "redis: no answer") ||
			strings.Contains(body, "kafka") || strings.Contains(body, "gcs") {
			t.Errorf("/readyz during the pause: %d %q, want 503 naming redis alone", code, body)
		}
		if took > deadline+slack {
			t.Errorf("/readyz during the pause took %v, want within %v", took, deadline)
		}
	}
	code, body, took := healthGet(t, cons.Addr, "/status")
	t.Logf("/status %.1fs into the pause: %d in %v", time.Since(paused).Seconds(), code, took.Round(time.Millisecond))
	if took > deadline+slack {
		t.Errorf("/status during the pause took %v, want within %v", took, deadline)
	}
	var st pipeline.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != http.StatusOK {
		t.Fatalf("/status during the pause: %d %v\n%s", code, err, body)
	}
	if !strings.Contains(st.FlowsError, "redis") || len(st.Flows) != 1 || len(st.Flows[0].Windows) != 2 || len(st.Partitions) != 2 {
		t.Errorf("/status during the pause: flows_error %q, %d flows, %d partitions: want the flow with its windows as last read, both partitions, and redis named",
			st.FlowsError, len(st.Flows), len(st.Partitions))
	}
	slow := map[string]bool{}
	for _, d := range st.Dependencies {
		slow[d.Name] = d.Slow || !d.OK
	}
	if !slow["redis"] || slow["kafka"] || slow["gcs"] {
		t.Errorf("/status dependencies during the pause %+v: want redis alone not ok", st.Dependencies)
	}
	if time.Since(paused) > pause-time.Second {
		t.Fatalf("the checks took %v of the %v pause: they did not run during it", time.Since(paused), pause)
	}

	if err := rdb.Do(ctx, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatalf("CLIENT UNPAUSE: %v", err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		code, body, _ := healthGet(t, cons.Addr, "/readyz")
		return code == http.StatusOK, "/readyz after the pause: " + body
	})
	waitFor(t, 30*time.Second, func() (bool, string) {
		_, body, _ := healthGet(t, cons.Addr, "/status")
		var st pipeline.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			return false, err.Error()
		}
		return st.FlowsError == "", "/status after the pause: " + body
	})
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
