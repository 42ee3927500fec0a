package main

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/kafkaconf"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// TestFlowWait checks that producer flow --wait tells applied from rejected,
// with a running DDL applier over real Redis and Kafka: a script may publish
// data only once its flow exists.
func TestFlowWait(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	rd := testenv.StartRedis(t)
	store := meta.NewStore(rd.Client(t), meta.DefaultPrefix, nil)
	a, err := meta.NewApplier(store, meta.NewRegistry(store), meta.ApplierConfig{
		Topic:     testenv.DDLTopic,
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(k.ListenAddrs()...)},
		DLQ:       dlq.New(k.Client(t), testenv.DLQTopic, prometheus.NewRegistry()),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // the consumer's DDL barrier, as a running consumer passes it
		defer close(done)
		for ctx.Err() == nil {
			_, _ = a.CatchUp(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; a.Close() })

	conn := []string{"--brokers", k.Brokers(), "--redis-url", rd.URL, "--timeout", "10s"}
	for i, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string // contained in stderr
	}{
		{"create applied", []string{"flow", "create", "--name", "f", "--tables", "1,2", "--wait"}, 0,
			"published create default/f at partition 0 offset 0\napplied create default/f (flow id 1)\n", ""},
		{"create again rejected", []string{"flow", "create", "--name", "f", "--tables", "3", "--wait"}, 1,
			"published create default/f at partition 0 offset 1\nrejected create default/f\n",
			"producer flow: create of default/f rejected by the consumer: ddl_rejected: apply create of flow default/f: name maps to flow 1: meta: flow already exists (flowlog.dlq partition 0 offset 0)\n"},
		{"create if not exists", []string{"flow", "create", "--name", "f", "--tables", "3", "--if-not-exists", "--wait"}, 0,
			"published create default/f at partition 0 offset 2\napplied create default/f (flow id 1)\n", ""},
		{"replace with another flow id rejected", []string{"flow", "replace", "--name", "f", "--tables", "1", "--flow-id", "9", "--wait"}, 1,
			"published replace default/f at partition 0 offset 3\nrejected replace default/f\n", "rejected by the consumer: ddl_rejected: "},
		{"drop applied", []string{"flow", "drop", "--name", "f", "--wait"}, 0,
			"published drop default/f at partition 0 offset 4\napplied drop default/f\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runProducer(t, time.Minute, nil, append(tc.args, conn...)...)
			if r.code != tc.code || r.stdout != tc.stdout || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("case %d: exit %d, stdout %q, stderr %q\nwant exit %d, stdout %q, stderr containing %q",
					i, r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
	if _, ok, err := store.FlowIDByName(context.Background(), meta.DefaultCatalog, "f"); err != nil || ok {
		t.Errorf("flow f after the drop: exists %v, %v", ok, err)
	}

	t.Run("no consumer", func(t *testing.T) {
		r := runProducer(t, time.Minute, nil, append([]string{"flow", "create", "--name", "g", "--tables", "1", "--wait",
			"--redis-prefix", "nobody", "--wait-timeout", "3s"}, conn...)...)
		lines := withoutBrokerWait(r.stderr)
		if r.code != 1 || len(lines) != 2 || !strings.HasPrefix(lines[0], "waiting for a consumer to apply offset 5 (nobody:{flowlog}:ddl:offset:flowlog.ddl:0 is unset") ||
			!strings.Contains(lines[1], "no consumer handled offset 5 within 3s (--wait-timeout)") {
			t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
		}
	})
	t.Run("redis unreachable", func(t *testing.T) {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		url := "redis://:s3cret@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/0"
		r := runProducer(t, time.Minute, nil, "flow", "create", "--name", "h", "--tables", "1", "--wait",
			"--brokers", k.Brokers(), "--redis-url", url)
		want := "producer flow: --wait: redis at redis://:xxxxx@127.0.0.1:" + strconv.Itoa(port) + "/0: dial tcp"
		lines := withoutBrokerWait(r.stderr)
		if r.code != 1 || r.stdout != "" || len(lines) != 1 || !strings.HasPrefix(lines[0], want) || strings.Contains(r.stderr, "s3cret") {
			t.Fatalf("exit %d, stdout %q, stderr %q; want 1, nothing published, and %q", r.code, r.stdout, r.stderr, want)
		}
	})
}

// withoutBrokerWait splits stderr into lines, less the "waiting for broker"
// notice a loaded machine may print before the broker answers.
func withoutBrokerWait(stderr string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if !strings.HasPrefix(l, "waiting for broker ") {
			out = append(out, l)
		}
	}
	return out
}

// TestFlowWaitPendingRejection checks the window between a consumer's
// claim of a rejected DDL record (which moves ddl:offset past it) and the
// DLQ record it sends after: --wait must report the rejection, never an
// apply, however long the send takes.
func TestFlowWaitPendingRejection(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	rd := testenv.StartRedis(t)
	ctx := context.Background()
	kc := kafkaconf.Config{Brokers: k.Brokers(), DDLTopic: testenv.DDLTopic, DLQTopic: testenv.DLQTopic}
	cl := k.Client(t)
	w, err := newDDLWaiter(ctx, kc, meta.Config{URL: rd.URL, Prefix: meta.DefaultPrefix}, cl, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rec, err := cl.ProduceSync(ctx, &kgo.Record{Topic: testenv.DDLTopic, Value: []byte(`{"op":"create"}`)}).First()
	if err != nil {
		t.Fatal(err)
	}
	store := meta.NewStore(rd.Client(t), meta.DefaultPrefix, nil)
	claim := meta.RejectedDDL{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Owner: "test",
		Reason: meta.ReasonDDLRejected, Detail: "flow already exists", Value: rec.Value}
	if won, err := store.ClaimDDLReject(ctx, claim); err != nil || !won {
		t.Fatalf("claim: won %v, %v", won, err)
	}
	if off, ok, err := store.DDLOffset(ctx, rec.Topic, rec.Partition); err != nil || !ok || off <= rec.Offset {
		t.Fatalf("ddl:offset after the claim: %d %v %v; want past %d", off, ok, err, rec.Offset)
	}
	verdict := make(chan error, 1)
	go func() { verdict <- w.wait(ctx, rec, io.Discard) }()
	// The DLQ record is sent only after several of the waiter's polls.
	time.Sleep(3 * waitPoll)
	select {
	case err := <-verdict:
		t.Fatalf("verdict before the DLQ record was sent: %v", err)
	default:
	}
	d := dlq.New(cl, testenv.DLQTopic, prometheus.NewRegistry())
	if err := d.Send(ctx, rec, claim.Reason, claim.Detail); err != nil {
		t.Fatal(err)
	}
	if err := store.DoneDDLReject(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := <-verdict; !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "flow already exists") {
		t.Fatalf("verdict: %v; want %v with the DLQ's detail", err, ErrRejected)
	}
}
