//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// TestLogFormatAndRedisDown runs `consumer run` without --log-format
// against a Redis that refuses connections, once with stderr on a terminal
// and once on a pipe: on the terminal it logs text, on the pipe JSON
// (--log-format auto), and in both the failure is one clear line naming
// Redis, with no line of the Redis client's own retries before it.
func TestLogFormatAndRedisDown(t *testing.T) {
	redisURL := "redis://" + testenv.ClosedAddr(t) + "/0"
	args := []string{"run", "--redis-url", redisURL, "--gcs-endpoint", testenv.ClosedAddr(t), "--http-addr", "", "--temp-dir", t.TempDir()}
	check := func(t *testing.T, out string, wantText bool) {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(out, "\r\n", "\n")), "\n")
		last := lines[len(lines)-1]
		if !strings.HasPrefix(last, "consumer run: redis at "+redisURL+": ") || !strings.Contains(last, "connection refused") {
			t.Errorf("last line %q, want the one line naming Redis", last)
		}
		for _, l := range lines[:len(lines)-1] {
			if strings.Contains(l, "redis") {
				t.Errorf("a line about Redis before the clear one: %s", l)
			}
			isJSON := json.Valid([]byte(l))
			isText := strings.HasPrefix(l, "time=") && strings.Contains(l, " level=")
			if wantText && !isText || !wantText && !isJSON {
				t.Errorf("log line in the wrong format (want text: %v): %s", wantText, l)
			}
		}
		if len(lines) < 2 {
			t.Errorf("no log line before the error:\n%s", out)
		}
	}

	t.Run("terminal", func(t *testing.T) {
		master, slave := testenv.OpenPTY(t)
		cmd := exec.Command(binary(t, "consumer"), args...)
		cmd.Stdout, cmd.Stderr = slave, slave
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		slave.Close() // the child holds it; reads end when it exits
		var out bytes.Buffer
		copied := make(chan struct{})
		go func() { _, _ = io.Copy(&out, master); close(copied) }()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("consumer run exited 0 with Redis down")
			}
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatal("consumer run did not exit with Redis down")
		}
		<-copied // the master reads EIO once the last slave is closed
		check(t, out.String(), true)
	})
	t.Run("pipe", func(t *testing.T) {
		code, stdout, stderr := cliRun(t, binary(t, "consumer"), nil, args...)
		if code != 1 || stdout != "" {
			t.Fatalf("exit %d, stdout %q", code, stdout)
		}
		check(t, stderr, false)
	})
}

// TestLogsIdleCycles: an idle consumer's interval cycles, which commit
// offsets and checkpoints but no file, are not logged at info level; a
// cycle that backs data up is.
func TestLogsIdleCycles(t *testing.T) {
	c := startCluster(t, 2)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f", "--tables", "1")
	cons := c.startConsumer(t, "consumer-1")
	idle := map[string]bool{}
	waitFor(t, 60*time.Second, func() (bool, string) {
		var st struct {
			LastCycle struct {
				ID      string `json:"id"`
				Trigger string `json:"trigger"`
				Files   int    `json:"files"`
			} `json:"last_cycle"`
		}
		resp, err := http.Get("http://" + cons.Addr + "/status")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return false, err.Error()
		}
		if l := st.LastCycle; l.ID != "" && l.Files == 0 && l.Trigger == "interval" {
			idle[l.ID] = true
		}
		return len(idle) >= 3, fmt.Sprintf("%d idle cycles committed", len(idle))
	})
	cfg := loadgen.Config{Events: 500, Tables: []int64{1}, Regions: 2, Seed: 2304, StartTime: time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)}
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFlowCheckpoint(ctx, t, meta.NewStore(c.Redis.Client(t), "flowlog", nil), "f", expectLoad(cfg).maxResolved, 45*time.Second)
	// The checkpoint is in Redis before the cycle that moved it logs its
	// line: wait for the line.
	dataCycles := func() int {
		n := 0
		for _, l := range crashLogLines(cons, 0, "flush cycle committed") {
			if files, _ := l["files"].(float64); files > 0 {
				n++
			}
		}
		return n
	}
	waitFor(t, 30*time.Second, func() (bool, string) { return dataCycles() > 0, "no data cycle logged yet" })
	for _, l := range crashLogLines(cons, 0, "flush cycle committed") {
		id, _ := l["cycle"].(string)
		files, _ := l["files"].(float64)
		if idle[id] || files == 0 && l["trigger"] == "interval" {
			t.Errorf("an idle cycle logged at %v: %v", l["level"], l)
		}
	}
}
