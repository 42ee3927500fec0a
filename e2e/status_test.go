package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
)

// statusNext returns the next offset of each partition in the consumer's
// /status at base ("http://host:port"), as reported: -1 for a partition
// with nothing consumed yet.
func statusNext(cl *http.Client, base string) (map[int32]int64, error) {
	resp, err := cl.Get(base + "/status")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/status: %s", resp.Status)
	}
	var st struct {
		Partitions []struct {
			Partition int32 `json:"partition"`
			Next      int64 `json:"next_offset"`
		} `json:"partitions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("/status: %w", err)
	}
	next := map[int32]int64{}
	for _, p := range st.Partitions {
		next[p.Partition] = p.Next
	}
	return next, nil
}

// opsStatusNextWith is statusNext with a partition that has nothing
// consumed yet at 0.
func opsStatusNextWith(cl *http.Client, base string) (map[int32]int64, error) {
	next, err := statusNext(cl, base)
	for p, n := range next {
		next[p] = max(n, 0)
	}
	return next, err
}

// TestStatusText: `consumer status` against a running consumer prints the
// partitions and flows as tables and the consumer's own state in a few
// lines, not its raw /status JSON, and shows every coverage bound and
// checkpoint TSO with its time; `status --json` has the whole document.
func TestStatusText(t *testing.T) {
	c := startCluster(t, 2)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f", "--tables", "1")
	cons := c.startConsumer(t, "consumer-1")
	cfg := loadgen.Config{Events: 500, Tables: []int64{1}, Regions: 2, Seed: 2305, StartTime: time.Date(2026, 3, 4, 13, 0, 0, 0, time.UTC)}
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFlowCheckpoint(ctx, t, meta.NewStore(c.Redis.Client(t), "flowlog", nil), "f", expectLoad(cfg).maxResolved, 45*time.Second)
	args := append([]string{"status", "--brokers", c.Broker.Addr, "--http-addr", cons.Addr}, c.oracleConn()...)
	code, out, stderr := cliRun(t, binary(t, "consumer"), nil, args...)
	if code != 0 {
		t.Fatalf("status: exit %d, stderr:\n%s", code, stderr)
	}
	if strings.Contains(out, "{") || strings.Contains(out, `"running"`) {
		t.Errorf("status prints JSON:\n%s", out)
	}
	if !strings.Contains(out, "consumer at "+cons.Addr+": running; partitions ") || !strings.Contains(out, "  last cycle ") {
		t.Errorf("status lacks the consumer's state:\n%s", out)
	}
	// The coverage window (since 0: the flow predates the data, a bound
	// of no time) and the checkpoint TSO beside its time.
	if !regexp.MustCompile(`1:\[(0|\d+ \(20\d\d-[0-9T:.-]+Z\)), now\]`).MatchString(out) ||
		!regexp.MustCompile(`\d{18} +20\d\d-[0-9T:.-]+Z`).MatchString(out) {
		t.Errorf("status shows no coverage window or checkpoint TSO with its time:\n%s", out)
	}
	code, js, _ := cliRun(t, binary(t, "consumer"), nil, append(args, "--json")...)
	var doc struct {
		Consumer struct {
			Running bool `json:"running"`
		} `json:"consumer"`
	}
	if code != 0 || json.Unmarshal([]byte(js), &doc) != nil || !doc.Consumer.Running {
		t.Errorf("status --json: exit %d, consumer not running in:\n%s", code, js)
	}
}
