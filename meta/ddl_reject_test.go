package meta_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// holdProduce blocks the first record its client buffers until release is
// closed, and closes held when it starts blocking.
type holdProduce struct {
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (h *holdProduce) OnProduceRecordBuffered(*kgo.Record) {
	h.once.Do(func() {
		close(h.held)
		<-h.release
	})
}

// applierWith is e.applier with its own DLQ client options and claim
// takeover time.
func (e *ddlEnv) applierWith(t *testing.T, claim time.Duration, dlqOpts ...kgo.Opt) *applier {
	t.Helper()
	reg := prometheus.NewRegistry()
	r := meta.NewRegistry(e.s)
	dcl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(e.k.ListenAddrs()...)}, dlq.ClientOpts(testenv.DLQTopic)...), dlqOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	a, err := meta.NewApplier(e.s, r, meta.ApplierConfig{
		Topic:        testenv.DDLTopic,
		KafkaOpts:    []kgo.Opt{kgo.SeedBrokers(e.k.ListenAddrs()...)},
		DLQ:          dlq.New(dcl, testenv.DLQTopic, reg),
		Logger:       slog.New(slog.DiscardHandler),
		Registerer:   reg,
		ClaimTimeout: claim,
	})
	if err != nil {
		t.Fatalf("NewApplier: %v", err)
	}
	t.Cleanup(func() { a.Close(); dcl.Close() })
	return &applier{Applier: a, reg: reg, r: r}
}

// Two replicas race on the same rejected DDL: the first is inside its DLQ
// send when the second reaches the record. Exactly one DLQ record comes out,
// and ddl:offset is past the record.
func TestRejectedDDLRacingAppliersOneDLQRecord(t *testing.T) {
	e := newDDLEnv(t)
	offs := e.publish(t, ddlJSON("create", "f", 1), ddlJSON("create", "f", 2), `not json`)
	hold := &holdProduce{held: make(chan struct{}), release: make(chan struct{})}
	first := e.applierWith(t, 30*time.Second, kgo.WithHooks(hold))
	second := e.applierWith(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	done := make(chan error, 1)
	go func() {
		_, err := first.CatchUp(ctx)
		done <- err
	}()
	select {
	case <-hold.held:
	case err := <-done:
		t.Fatalf("first CatchUp returned %v before sending to the DLQ", err)
	}
	// The first replica is inside its DLQ send of the rejected create.
	if _, err := second.CatchUp(ctx); err != nil {
		t.Fatalf("second CatchUp: %v", err)
	}
	close(hold.release)
	if err := <-done; err != nil {
		t.Fatalf("first CatchUp: %v", err)
	}
	// The first replica's send was held; the invalid record was claimed
	// by whichever got there first. Catch up once more so any owed send
	// of either is done.
	for _, a := range []*applier{first, second} {
		if _, err := a.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}

	dl, n := e.dlqRecords(t)
	if n != 2 || !strings.Contains(dl[offs[1]], meta.ReasonDDLRejected) || !strings.Contains(dl[offs[2]], meta.ReasonDDLInvalid) {
		t.Fatalf("dlq = %v (%d records), want exactly one record each of offsets %d (rejected) and %d (invalid)", dl, n, offs[1], offs[2])
	}
	if off, _, _ := e.s.DDLOffset(ctx, testenv.DDLTopic, 0); off != offs[2]+1 {
		t.Errorf("ddl offset = %d, want %d", off, offs[2]+1)
	}
	r1, r2 := first.results(t), second.results(t)
	if r1["rejected"]+r2["rejected"] != 1 || r1["invalid"]+r2["invalid"] != 1 || r1["applied"]+r2["applied"] != 1 {
		t.Errorf("results: first %v, second %v; want one applied, one rejected and one invalid in all", r1, r2)
	}
	if left, err := e.s.PendingDDLRejects(ctx, testenv.DDLTopic, 0); err != nil || len(left) != 0 {
		t.Errorf("claims left = %v, %v; want none", left, err)
	}
}

// A replica that claimed a rejected DDL and died before its DLQ send
// completed leaves the claim in Redis; another replica sends the record
// once the claim is older than its takeover time. Nothing is lost, and the
// record is in the DLQ once.
func TestRejectedDDLClaimOfACrashedReplicaIsSent(t *testing.T) {
	e := newDDLEnv(t)
	offs := e.publish(t, ddlJSON("create", "f", 1), ddlJSON("create", "f", 2))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The dying replica's DLQ client reaches no broker: its send fails
	// within half the takeover time, and it is then closed (crashed).
	dead := e.applierWith(t, time.Second, kgo.SeedBrokers("127.0.0.1:1"))
	if _, err := dead.CatchUp(ctx); err != nil {
		t.Fatalf("dying CatchUp: %v", err)
	}
	dead.Close()
	claims, err := e.s.PendingDDLRejects(ctx, testenv.DDLTopic, 0)
	if err != nil || len(claims) != 1 || claims[0].Offset != offs[1] {
		t.Fatalf("claims after the failed send = %+v, %v; want one of offset %d", claims, err, offs[1])
	}
	if off, _, _ := e.s.DDLOffset(ctx, testenv.DDLTopic, 0); off != offs[1]+1 {
		t.Fatalf("ddl offset = %d, want %d (the claim advanced it)", off, offs[1]+1)
	}

	other := e.applierWith(t, time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for {
		// A failed catch-up is "not yet" like an owed claim: only the
		// deadline fails the test.
		_, cerr := other.CatchUp(ctx)
		left, err := e.s.PendingDDLRejects(ctx, testenv.DDLTopic, 0)
		if cerr == nil && err == nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim of the crashed replica still owed after 20s: %+v, %v (last CatchUp: %v)", left, err, cerr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dl, n := e.dlqRecords(t)
	if n != 1 || !strings.Contains(dl[offs[1]], meta.ReasonDDLRejected) {
		t.Fatalf("dlq = %v (%d records), want one record of offset %d", dl, n, offs[1])
	}
	if r := other.results(t); r["rejected"] != 0 {
		t.Errorf("results of the replica that took over = %v; want no rejection counted twice", r)
	}
}

// failHDel fails the next HDEL while armed: Redis goes away right after the
// DLQ acknowledged a claimed record and before the claim is deleted.
type failHDel struct{ armed atomic.Bool }

func (h *failHDel) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failHDel) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failHDel) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hdel" && h.armed.CompareAndSwap(true, false) {
			err := errors.New("injected: connection refused")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// A claim whose DLQ record was acknowledged but whose deletion failed is
// only deleted by the retry, not sent again (found by the churn test: a
// Redis restart right after the DLQ's ack wrote the record twice).
func TestRejectedDDLNotSentAgainWhenTheClaimDeleteFails(t *testing.T) {
	e := newDDLEnv(t)
	hook := &failHDel{}
	e.rdb.AddHook(hook)
	offs := e.publish(t, ddlJSON("create", "f", 1), ddlJSON("create", "f", 2))
	a := e.applierWith(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hook.armed.Store(true)
	if _, err := a.CatchUp(ctx); err != nil {
		t.Fatalf("CatchUp: %v", err)
	}
	if hook.armed.Load() {
		t.Fatal("the injected HDEL failure was not hit")
	}
	if left, err := e.s.PendingDDLRejects(ctx, testenv.DDLTopic, 0); err != nil || len(left) != 1 {
		t.Fatalf("claims after the failed delete = %+v, %v; want the one of offset %d", left, err, offs[1])
	}
	if _, err := a.CatchUp(ctx); err != nil { // the retry
		t.Fatalf("CatchUp: %v", err)
	}
	if left, err := e.s.PendingDDLRejects(ctx, testenv.DDLTopic, 0); err != nil || len(left) != 0 {
		t.Fatalf("claims after the retry = %+v, %v; want none", left, err)
	}
	if dl, n := e.dlqRecords(t); n != 1 || dl[offs[1]] == "" {
		t.Fatalf("dlq = %v (%d records), want one record of offset %d", dl, n, offs[1])
	}
}
