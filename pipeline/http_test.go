package pipeline_test

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// idleConsumer is a Consumer that is not running, built from a valid config
// changed by tweak.
func idleConsumer(t *testing.T, tweak func(*pipeline.Config)) *pipeline.Consumer {
	t.Helper()
	cfg := idleConfig(t.TempDir())
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := pipeline.New(cfg, pipeline.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFlushNeedsTokenOrLoopback: with no admin token only loopback clients
// reach /flush; with one, every client needs it. A request that passes gets
// 503 here because the consumer is not running.
func TestFlushNeedsTokenOrLoopback(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("  from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		token  string // --admin-token
		file   bool   // --admin-token-file holding "from-file"
		remote string
		header string
		want   int
	}{
		{"no token, remote v4", "", false, "192.0.2.7:5000", "", http.StatusForbidden},
		{"no token, remote v6", "", false, "[2001:db8::1]:5000", "", http.StatusForbidden},
		{"no token, remote with a bearer", "", false, "192.0.2.7:5000", "Bearer x", http.StatusForbidden},
		{"no token, loopback v4", "", false, "127.0.0.1:5000", "", http.StatusServiceUnavailable},
		{"no token, loopback v6", "", false, "[::1]:5000", "", http.StatusServiceUnavailable},
		{"token, loopback without it", "s3cret", false, "127.0.0.1:5000", "", http.StatusUnauthorized},
		{"token, wrong", "s3cret", false, "127.0.0.1:5000", "Bearer s3cre", http.StatusUnauthorized},
		{"token, not bearer", "s3cret", false, "127.0.0.1:5000", "Basic s3cret", http.StatusUnauthorized},
		{"token, right, remote", "s3cret", false, "192.0.2.7:5000", "Bearer s3cret", http.StatusServiceUnavailable},
		{"token file, right", "", true, "192.0.2.7:5000", "Bearer from-file", http.StatusServiceUnavailable},
		{"token file, wrong", "", true, "127.0.0.1:5000", "Bearer s3cret", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := idleConsumer(t, func(cfg *pipeline.Config) {
				cfg.AdminToken = tc.token
				if tc.file {
					cfg.AdminTokenFile = tokenFile
				}
			})
			h := pipeline.Handler(c, prometheus.NewRegistry())
			req := httptest.NewRequest(http.MethodPost, "/flush", nil)
			req.RemoteAddr = tc.remote
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Errorf("POST /flush = %d %q, want %d", rec.Code, rec.Body.String(), tc.want)
			}
			if tc.want == http.StatusUnauthorized && !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without a Bearer challenge: %v", rec.Header())
			}
			// The rest of the surface stays open.
			req = httptest.NewRequest(http.MethodGet, "/healthz", nil)
			req.RemoteAddr = tc.remote
			rec = httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Errorf("GET /healthz = %d", rec.Code)
			}
		})
	}
}

func TestAdminTokenValidation(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, token, file, want string
	}{
		{"both", "a", empty, "--admin-token and --admin-token-file"},
		{"missing file", "", filepath.Join(dir, "nope"), "--admin-token-file"},
		{"empty file", "", empty, "--admin-token-file " + empty + ": empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c pipeline.Config
			c.RegisterFlags(flag.NewFlagSet("run", flag.ContinueOnError))
			c.TempDir = t.TempDir()
			c.AdminToken, c.AdminTokenFile = tc.token, tc.file
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// slowBucket delays every upload, so a flush cycle takes a while.
type slowBucket struct {
	sink.Bucket
	delay time.Duration
}

func (b *slowBucket) Upload(ctx context.Context, obj sink.Object) error {
	select {
	case <-time.After(b.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.Bucket.Upload(ctx, obj)
}

func (b *slowBucket) Overwrite(ctx context.Context, obj sink.Object) error {
	return b.Bucket.(sink.Overwriter).Overwrite(ctx, obj)
}

// requestCycles is flush_cycles_total{trigger="request"} over all results.
func requestCycles(t *testing.T, g prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "flowlog_flush_cycles_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "trigger" && l.GetValue() == "request" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

func post(url string) (int, string, error) {
	resp, err := http.Post(url, "", nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestConcurrentFlushRequestsShareCycles: 20 requests during one slow flush
// cost at most two cycles (the one in flight and one after it), and each
// returns after data written before it is committed.
func TestConcurrentFlushRequestsShareCycles(t *testing.T) {
	r := newRig(t, 1, &slowBucket{Bucket: sink.NewMemBucket(), delay: 500 * time.Millisecond}, nil)
	r.start()
	id := r.createFlow("coalesce", 1)
	r.produceBatch(putBatch(1, 1, 0, 10, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 10 }, "events written")
	srv := httptest.NewServer(pipeline.Handler(r.cons, r.prom))
	defer srv.Close()

	const n = 20
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for range n {
		wg.Go(func() {
			code, body, err := post(srv.URL + "/flush")
			if err != nil || code != http.StatusOK {
				errs <- body
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("POST /flush failed: %q", e)
	}
	if got := requestCycles(t, r.prom); got < 1 || got > 2 {
		t.Errorf("%d concurrent POST /flush ran %v cycles, want 1 or 2", n, got)
	}
	if _, got := r.entries(id); len(got) != 10 {
		t.Errorf("after /flush returned, %d entries are committed, want 10", len(got))
	}
	// A later request still gets a cycle of its own.
	before := requestCycles(t, r.prom)
	if code, body, err := post(srv.URL + "/flush"); err != nil || code != http.StatusOK {
		t.Fatalf("POST /flush: %d %q %v", code, body, err)
	}
	if got := requestCycles(t, r.prom); got != before+1 {
		t.Errorf("a later POST /flush ran %v cycles, want 1", got-before)
	}
}

// TestFlushOutlastsWriteTimeout: the server's WriteTimeout is far below
// /flush's own wait; a flush slower than it still gets its answer.
func TestFlushOutlastsWriteTimeout(t *testing.T) {
	r := newRig(t, 1, &slowBucket{Bucket: sink.NewMemBucket(), delay: 1500 * time.Millisecond}, nil)
	r.start()
	r.createFlow("slow", 1)
	r.produceBatch(putBatch(1, 1, 0, 5, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 5 }, "events written")

	srv := pipeline.NewHTTPServer(pipeline.Handler(r.cons, r.prom))
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("server timeouts not all set: header %v read %v write %v idle %v",
			srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
	srv.WriteTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	start := time.Now()
	code, body, err := post("http://" + ln.Addr().String() + "/flush")
	if err != nil || code != http.StatusOK || body != "flushed\n" {
		t.Fatalf("POST /flush after %v: %d %q %v", time.Since(start), code, body, err)
	}
	if d := time.Since(start); d < srv.WriteTimeout {
		t.Errorf("flush took %v, not longer than the WriteTimeout: the test proves nothing", d)
	}
}

// TestReadyzProbesAtMostOncePerSecond: a burst of /readyz requests probes
// the backends about once a second, not once per request.
func TestReadyzProbesAtMostOncePerSecond(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	var probes atomic.Int64
	srv := httptest.NewServer(pipeline.Handler(r.cons, r.prom, pipeline.Probe{Name: "backend", Check: func(context.Context) error {
		probes.Add(1)
		return nil
	}}))
	defer srv.Close()
	get := func() int {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	r.eventually(20*time.Second, func() bool { return get() == http.StatusOK }, "/readyz 200")

	before := probes.Load()
	start := time.Now()
	const n = 50
	for range n {
		if code := get(); code != http.StatusOK {
			t.Fatalf("GET /readyz = %d", code)
		}
	}
	elapsed := time.Since(start)
	got := probes.Load() - before
	if limit := int64(elapsed/time.Second) + 2; got > limit {
		t.Errorf("%d GET /readyz in %v probed the backends %d times, want at most %d", n, elapsed, got, limit)
	}
}
