package e2e

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
)

// logsNeedles are strings that only a leak of record bytes can put into a
// log: the payload marker (in clear and hex) and, for the first events of
// cfg's load, the data key and raw key in hex and base64 and the value in
// base64.
func logsNeedles(cfg loadgen.Config) []string {
	needles := []string{loadgen.Marker, hex.EncodeToString([]byte(loadgen.Marker))}
	g := loadgen.New(cfg)
	n := 0
	for b, ok := g.Next(); ok && n < 8; b, ok = g.Next() {
		for _, e := range b.Events {
			if n++; n > 8 {
				break
			}
			needles = append(needles, hex.EncodeToString(e.Key), strings.ToUpper(hex.EncodeToString(e.Key)),
				base64.StdEncoding.EncodeToString(e.Key), base64.StdEncoding.EncodeToString(e.Value))
			if raw, _, err := event.DecodeDataKey(e.Key); err == nil {
				needles = append(needles, hex.EncodeToString(raw), base64.StdEncoding.EncodeToString(raw))
			}
		}
	}
	return needles
}

// logsCheckRedacted fails the test if the log of p (a consumer run with
// default --redact-logs) holds any of logsNeedles(cfg) or extra.
func logsCheckRedacted(t testing.TB, p *proc, cfg loadgen.Config, extra ...string) {
	t.Helper()
	log := p.Log()
	if log == "" {
		t.Errorf("%s: empty log", p.name)
	}
	for _, n := range append(logsNeedles(cfg), extra...) {
		if len(n) < 8 {
			continue // empty values and the like match anything
		}
		if i := strings.Index(log, n); i >= 0 {
			line := log[strings.LastIndexByte(log[:i], '\n')+1:]
			if j := strings.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			t.Errorf("%s: log leaks record bytes %q in line: %s", p.name, n, line)
		}
	}
}

// TestLogsRedaction checks that with default flags no key or value bytes
// reach the log, even for records that go to the DLQ (whose decode errors may
// quote the payload); --redact-logs=false puts the record key into the DLQ
// line, which proves the switch works.
func TestLogsRedaction(t *testing.T) {
	c := startCluster(t, 1)
	cfg := loadgen.Config{Events: 2000, Tables: []int64{1}, Regions: 2, Seed: 8001, StartTime: time.Now().UTC().Add(-time.Hour)}
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f1", "--tables", "1")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)

	cl := badClient(t, c.Broker.Addr)
	jsonHeader := []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/json")}}
	bad := func(key string) []*kgo.Record {
		return []*kgo.Record{
			{Key: []byte(key), Value: []byte("\x07" + loadgen.Marker + key)},
			{Key: []byte(key), Value: []byte(`{"regionId": "` + loadgen.Marker + key + `"}`), Headers: jsonHeader},
			{Key: []byte(key), Value: []byte(`{"` + loadgen.Marker + key + `": 1}`), Headers: jsonHeader},
		}
	}
	produce := func(recs []*kgo.Record) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}

	const hidden, shown = "logs-hidden-key-1", "logs-shown-key-2"
	produce(bad(hidden))
	cons := c.startConsumer(t, "logs-default")
	consumeAll(t, c.Broker.Addr, testenv.DLQTopic, 3)
	if err := cons.Stop(); err != nil {
		t.Fatalf("consumer exit: %v", err)
	}
	if n := strings.Count(cons.Log(), "apply record sent to the DLQ"); n != 3 {
		t.Errorf("default consumer logged %d DLQ lines, want 3", n)
	}
	logsCheckRedacted(t, cons, cfg, hidden)

	produce(bad(shown))
	open := c.startConsumer(t, "logs-unredacted", "--redact-logs=false")
	consumeAll(t, c.Broker.Addr, testenv.DLQTopic, 6)
	if err := open.Stop(); err != nil {
		t.Fatalf("consumer exit: %v", err)
	}
	lines := 0
	for _, line := range strings.Split(open.Log(), "\n") {
		if strings.Contains(line, "apply record sent to the DLQ") {
			lines++
			if !strings.Contains(line, `"key":"`+shown+`"`) {
				t.Errorf("--redact-logs=false: DLQ line without the record key: %s", line)
			}
		}
	}
	if lines != 3 {
		t.Errorf("--redact-logs=false consumer logged %d DLQ lines, want 3", lines)
	}
}
