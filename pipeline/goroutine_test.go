package pipeline_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/sink"
)

// goroutineStacks returns the stack of every goroutine of the process.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// sessionGoroutines are the goroutines that run a session's code: any
// frame of package pipeline (the flusher, a rebalance callback, the
// consume loop) but Run itself and the test, or the group management of a
// Kafka client (only a session's client joins a group). kafkaClients is
// how many Kafka clients of any owner run.
func sessionGoroutines() (leaked []string, kafkaClients int) {
	for _, g := range goroutineStacks() {
		if strings.Contains(g, "kgo.(*Client).updateMetadataLoop") {
			kafkaClients++
		}
		if strings.Contains(g, "pipeline_test.") || strings.Contains(g, "runtime.Stack(") {
			continue
		}
		if strings.Contains(g, "kgo.(*groupConsumer)") {
			leaked = append(leaked, g)
			continue
		}
		for _, line := range strings.Split(g, "\n") {
			if strings.Contains(line, "flowlog/pipeline.") && !strings.Contains(line, "pipeline.(*Consumer).Run(") &&
				!strings.Contains(line, "pipeline.(*Consumer).haltOwnerLost(") {
				leaked = append(leaked, g)
				break
			}
		}
	}
	return leaked, kafkaClients
}

// waitNoSessionGoroutine polls until no session goroutine runs and
// kafkaClients Kafka clients do, and fails naming what still runs.
func waitNoSessionGoroutine(t *testing.T, when string, kafkaClients int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		leaked, clients := sessionGoroutines()
		if len(leaked) == 0 && clients == kafkaClients {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d goroutines of the session still run, and %d Kafka clients (want %d):\n\n%s",
				when, len(leaked), clients, kafkaClients, strings.Join(leaked, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSessionEndLeavesNoGoroutine: when a session ends, nothing it started
// still runs (its flusher, its Kafka client and what runs in the client's
// callbacks), both when it fails and Run stays (Redis lost the prefix's
// state: the consumer waits for its stop) and after a graceful stop. A
// goroutine left behind would keep a session's files, leases or group
// membership alive after the consumer let go of them (pipeline/doc.go,
// "Goroutines").
func TestSessionEndLeavesNoGoroutine(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail bool // the session fails before the stop
	}{{"graceful stop", false}, {"session fails, then stop", true}} {
		t.Run(tc.name, func(t *testing.T) { testSessionEnd(t, tc.fail) })
	}
}

func testSessionEnd(t *testing.T, fail bool) {
	ctx := context.Background()
	r := newRig(t, 2, sink.NewMemBucket(), nil)
	if err := r.store.ClaimOwner(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	r.start()
	id := r.createFlow("f", 1)
	r.produceBatch(putBatch(1, 1, 0, 3, 0))
	r.flush()
	if refs, err := r.store.Metas(ctx, id); err != nil || len(refs) != 1 {
		t.Fatalf("metas = %v, %v; want 1", refs, err)
	}
	leaked, running := sessionGoroutines()
	if len(leaked) == 0 {
		t.Fatal("no session goroutine found while a session runs: the test would prove nothing")
	}

	if fail {
		// Redis loses the prefix's state: the session fails, and Run
		// stays out of the group until its stop.
		if err := r.store.Client().FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		r.produceBatch(putBatch(2, 1, 100, 3, 100))
		fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_ = r.cons.Flush(fctx) // fails, or finds the session ended already
		cancel()
		r.eventually(30*time.Second, func() bool { return !r.cons.Ready() && r.cons.Status().Stopped != "" },
			"the session ended and the consumer stopped")
		waitNoSessionGoroutine(t, "after the session ended", running-1)
	}

	r.cancel()
	r.cancel = nil
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		leaked, _ := sessionGoroutines()
		t.Fatalf("Run did not return 60s after its stop; goroutines of the consumer:\n\n%s", strings.Join(leaked, "\n\n"))
	}
	waitNoSessionGoroutine(t, "after the stop", running-1)
}
