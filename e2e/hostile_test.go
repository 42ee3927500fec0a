package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// Hostile inputs: loads and records shaped to exhaust the consumer's
// descriptors or memory, or to wedge it on one record.

// startConsumerUlimit is c.startConsumer under `ulimit -n nofile`: bash sets
// the soft and the hard limit, so the consumer cannot raise it, and then
// execs the consumer (same pid).
func (c *cluster) startConsumerUlimit(t testing.TB, name string, nofile int, extra ...string) *proc {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := append(append(c.consumerArgs(t, name), extra...), "--http-addr", addr)
	script := `ulimit -n ` + strconv.Itoa(nofile) + ` && exec "$0" "$@"`
	p := newProc(t, name, "/bin/bash", append([]string{"-c", script, binary(t, "consumer"), "run"}, args...)...)
	p.ready = consumerReady(addr)
	p.Start()
	return p
}

// procLimit returns the soft limit named name ("Max open files") from
// /proc/<pid>/limits, or -1.
func procLimit(pid int, name string) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				if n, err := strconv.Atoi(f[0]); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// waitCheckpointOrExit waits until flow faultFlow's checkpoint reaches ts
// or cons exits, whichever comes first, and fails the test if cons exited.
func waitCheckpointOrExit(t *testing.T, c *cluster, cons *proc, ts uint64, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFor(t, timeout, func() (bool, string) {
		if cons.hasExited() {
			return true, ""
		}
		id, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, faultFlow)
		if err != nil || !ok {
			return false, fmt.Sprintf("flow %s not created (%v)", faultFlow, err)
		}
		st, err := store.FlowState(ctx, id)
		if err != nil {
			return false, err.Error()
		}
		return st.CheckpointTS >= ts, fmt.Sprintf("flow %s checkpoint_ts %d, want >= %d", faultFlow, st.CheckpointTS, ts)
	})
	if cons.hasExited() {
		t.Fatalf("consumer exited during the load: %v", cons.Wait())
	}
}

// TestHostileManyRegionsLowFileLimit checks that under `ulimit -n 256`, a
// backlog of 2,000 regions sending one event per record (several thousand
// temp files per cycle) is backed up completely, every event in exactly one
// referenced chunk, without the consumer dying on "too many open files" and
// with its peak RSS (VmHWM) under 150 MiB.
func TestHostileManyRegionsLowFileLimit(t *testing.T) {
	const (
		nofile  = 256
		regions = 2000
		maxHWM  = 150 << 20
	)
	c := startCluster(t, 4)
	load := loadgen.Config{Events: 6000, Tables: []int64{1, 2, 3}, Regions: regions, BatchSize: 1, Seed: 1302,
		StartTime: time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)}
	want := faultExpect(load)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	out := runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load)...)...)

	start := time.Now()
	cons := c.startConsumerUlimit(t, "hostile-1", nofile)
	pid := bpPID(cons)
	if got := procLimit(pid, "Max open files"); got != nofile {
		t.Fatalf("consumer runs with an open file limit of %d, want %d", got, nofile)
	}
	fds := testenv.SampleFDs(t, pid, 20*time.Millisecond)
	waitCheckpointOrExit(t, c, cons, want.maxResolved, 3*time.Minute)
	took := time.Since(start)
	got, dup := faultCheckBackup(t, c, want, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", meta.NewStore(c.Redis.Client(t), "flowlog", nil), 4)
	st, _ := testenv.ProcStatus(pid, "VmHWM") // nil once it exited: 0
	hwm := st["VmHWM"]
	peak := fds.Halt()
	t.Logf("%s; %d events of the flow backed up in %d chunks of %d metas (%d duplicates) in %v; "+
		"open descriptors peaked at %d of %d; VmHWM %d MiB",
		strings.TrimSpace(out), want.total, got.chunks, got.metas, dup, took.Round(time.Millisecond), peak, nofile, hwm>>20)
	if hwm == 0 || hwm > maxHWM {
		t.Errorf("consumer VmHWM %d MiB, want under %d MiB", hwm>>20, maxHWM>>20)
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
	if log := cons.Log(); strings.Contains(log, "too many open files") {
		t.Errorf("consumer log mentions \"too many open files\"")
	}
}

// hostileNoise is n random bytes, which no producer compression shrinks.
func hostileNoise(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// TestHostilePoisonPills checks poison pills on processes: a 1 MB bad-key
// apply record and a 1 MB invalid DDL record, of random bytes, reach a DLQ
// topic whose max.message.bytes is 64 KiB. Each goes there truncated
// (flowlog-truncated, flowlog-original-length, flowlog-original-sha256), the
// DDL path moves on (a flow created after it exists), and a load after them
// is backed up completely by the same consumer process.
func TestHostilePoisonPills(t *testing.T) {
	c := startCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	cons := c.startConsumer(t, "poison-1")

	adm := newAdmin(t, c.Broker.Addr)
	defer adm.Close()
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: kadm.StringPtr("65536")}}, testenv.DLQTopic)
	if err == nil {
		err = res[0].Err
	}
	if err != nil {
		t.Fatalf("limit the DLQ topic to 64 KiB: %v", err)
	}

	big, err := kgo.NewClient(kgo.SeedBrokers(c.Broker.Addr), kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(dlq.MaxRecordBytes))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer big.Close()
	applyPoison := event.EncodeBatch(nil, &event.Batch{RegionID: 9001, Events: []event.Event{{
		Key: []byte("tshort"), Value: hostileNoise(1_040_000), CF: event.CFWrite, Op: event.Op_OP_PUT,
	}}})
	ddlPoison := []byte(`{"op": "create", "flow": "` + hex.EncodeToString(hostileNoise(500_000)) + `"}`)
	for _, r := range []*kgo.Record{
		{Topic: testenv.ApplyTopic, Key: []byte("9001"), Value: applyPoison},
		{Topic: testenv.DDLTopic, Key: []byte("poison"), Value: ddlPoison},
	} {
		if err := big.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %d bytes to %s: %v", len(r.Value), r.Topic, err)
		}
	}

	// The DDL path is past the poison once a flow created after it exists.
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "after_poison", "--tables", "3")
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFor(t, time.Minute, func() (bool, string) {
		_, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, "after_poison")
		return err == nil && ok, fmt.Sprintf("flow after_poison not created (%v)", err)
	})

	load := faultLoad(5000, 1303, time.Date(2026, 5, 2, 10, 0, 0, 0, time.UTC))
	want := faultExpect(load)
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(load)...)...)
	waitCheckpointOrExit(t, c, cons, want.maxResolved, 2*time.Minute)
	got, dup := faultCheckBackup(t, c, want, 30*time.Second)
	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", store, 2)
	t.Logf("%d events of the flow after the poison backed up in %d chunks (%d duplicates)", want.total, got.chunks, dup)

	recs := consumeAll(t, c.Broker.Addr, testenv.DLQTopic, 2)
	if len(recs) != 2 {
		t.Fatalf("DLQ holds %d records, want the 2 poison records", len(recs))
	}
	bySource := map[string]*kgo.Record{}
	for _, r := range recs {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		bySource[h[event.HeaderSourceTopic]] = r
	}
	for _, tc := range []struct {
		topic, reason string
		orig          []byte
	}{
		{testenv.ApplyTopic, event.ReasonBadKey, applyPoison},
		{testenv.DDLTopic, meta.ReasonDDLInvalid, ddlPoison},
	} {
		r := bySource[tc.topic]
		if r == nil {
			t.Errorf("no DLQ record from %s", tc.topic)
			continue
		}
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		sum := sha256.Sum256(tc.orig)
		if h[event.HeaderTruncated] != "true" || h[event.HeaderOriginalLength] != strconv.Itoa(len(tc.orig)) ||
			h[event.HeaderOriginalSHA256] != hex.EncodeToString(sum[:]) {
			t.Errorf("DLQ record from %s: headers truncated=%q original-length=%q (want %d) original-sha256 match=%v",
				tc.topic, h[event.HeaderTruncated], h[event.HeaderOriginalLength], len(tc.orig), h[event.HeaderOriginalSHA256] == hex.EncodeToString(sum[:]))
		}
		if string(r.Value) != string(tc.orig[:event.TruncatedValueMax]) {
			t.Errorf("DLQ record from %s: value of %d bytes is not the original's first %d", tc.topic, len(r.Value), event.TruncatedValueMax)
		}
		if !strings.HasPrefix(h[event.HeaderError], tc.reason) {
			t.Errorf("DLQ record from %s: reason %q, want %s", tc.topic, h[event.HeaderError], tc.reason)
		}
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
