package pipeline_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// TestOwnerLostStopsCommitting: a running consumer whose Redis is flushed
// under it (FLUSHALL) stops: its next cycle is not committed, it leaves the
// group instead of taking leases and offsets over from nothing, applies no
// DDL published after the flush (a new flow would get id 1 again, which
// the bucket already holds), /readyz answers 503 naming the owner key and
// `consumer recover`, /status says why, redis_state_lost is 1, and Run
// returns the cause once stopped. Redis stays empty under the prefix, so
// that `consumer recover` can rebuild it.
func TestOwnerLostStopsCommitting(t *testing.T) {
	for _, tc := range []struct {
		name string
		ddl  bool // a create DDL follows the flush: the applier finds the loss first
	}{{"commit finds it", false}, {"ddl finds it", true}} {
		t.Run(tc.name, func(t *testing.T) { testOwnerLost(t, tc.ddl) })
	}
}

func testOwnerLost(t *testing.T, ddl bool) {
	ctx := context.Background()
	r := newRig(t, 2, sink.NewMemBucket(), nil)
	if err := r.store.ClaimOwner(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	r.start()
	srv := httptest.NewServer(pipeline.Handler(r.cons, r.prom))
	defer srv.Close()
	id := r.createFlow("f", 1)
	r.produceBatch(putBatch(1, 1, 0, 3, 0))
	r.eventually(20*time.Second, func() bool {
		return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 3
	}, "the events written to temp files")
	r.flush()
	if refs, err := r.store.Metas(ctx, id); err != nil || len(refs) != 1 {
		t.Fatalf("metas before the flush = %v, %v; want 1", refs, err)
	}

	rdb := r.store.Client()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	r.produceBatch(putBatch(2, 1, 100, 3, 100))
	if ddl {
		r.createFlowAsync("g2", 2)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := r.cons.Flush(fctx) // fails, or finds the session ended already
	cancel()
	if err == nil {
		t.Fatal("a flush after FLUSHALL committed")
	}

	var body string
	r.eventually(30*time.Second, func() bool {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "owner key")
	}, "/readyz 503 naming the lost owner key")
	for _, want := range []string{r.store.Keys().Owner(), "consumer recover"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz body %q does not name %q", body, want)
		}
	}
	st := r.cons.Status()
	if st.Running || !strings.Contains(st.Stopped, "consumer recover") {
		t.Errorf("status running %v, stopped %q; want stopped naming `consumer recover`", st.Running, st.Stopped)
	}
	if got := testutil.ToFloat64(r.cons.MetricRedisStateLost()); got != 1 {
		t.Errorf("redis_state_lost = %v, want 1", got)
	}
	// Stopped for good: it stays out of the group, so nothing it does
	// later can write either.
	if ks, err := rdb.Keys(ctx, r.store.Keys().Base()+"*").Result(); err != nil || len(ks) != 0 {
		t.Fatalf("keys under the prefix after the stop: %v, %v; want none", ks, err)
	}
	if err := r.stop(); !errors.Is(err, meta.ErrOwnerLost) {
		t.Fatalf("Run returned %v, want the owner-lost cause", err)
	}
	if ks, err := rdb.Keys(ctx, r.store.Keys().Base()+"*").Result(); err != nil || len(ks) != 0 {
		t.Fatalf("keys under the prefix after Run returned: %v, %v; want none", ks, err)
	}
}
