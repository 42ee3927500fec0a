package pipeline

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// flushWait bounds how long POST /flush waits for its cycle's commit.
const flushWait = 5 * time.Minute

// Handler serves the consumer's HTTP surface:
//
//	/metrics   Prometheus metrics of gatherer
//	/healthz   200 while the process runs
//	/readyz    200 when every probe passes and the consumer is in a group session
//	/status    JSON Status, with the probes' last outcomes
//	/flush     POST: run a flush cycle now and wait for its commit
//
// POST /flush needs "Authorization: Bearer <token>" when the Config has an
// admin token (--admin-token or --admin-token-file); without one it is served
// to loopback clients only. Requests that arrive while a flush is in flight
// share the one cycle started after it, so concurrent requests cost at most
// two cycles.
//
// /readyz and /status answer within a second whatever Redis, Kafka and GCS
// do (prober, Consumer.Status): a dependency that does not answer makes
// /readyz fail at once, naming it ("redis: no answer for 0.8s"), and
// /status answers from what the consumer holds and read last.
func Handler(c *Consumer, g prometheus.Gatherer, probes ...Probe) http.Handler {
	token, err := c.cfg.adminToken()
	if err != nil {
		// Validate read it moments ago; fail closed if it is gone now.
		c.log.Error("admin token unreadable: POST /flush refuses every request", "err", err)
	}
	auth := adminAuth{token: token, broken: err != nil}
	flushes := &flushGroup{flush: c.Flush}
	pr := newProber(probes)

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !c.Ready() {
			http.Error(w, "not in a consumer group session", http.StatusServiceUnavailable)
			return
		}
		// A dependency that fails comes first: it is the likely cause of a
		// stall or of a cycle that cannot upload, named after it.
		var bad []string
		for _, d := range pr.check(r.Context(), probeDeadline) {
			if p := d.problem(); p != "" {
				bad = append(bad, p)
			}
		}
		if err := c.Stalled(); err != nil {
			bad = append(bad, err.Error())
		}
		if len(bad) > 0 {
			http.Error(w, strings.Join(bad, "; "), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		st := c.Status()
		st.Dependencies = pr.check(r.Context(), 0)
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	})
	mux.HandleFunc("POST /flush", func(w http.ResponseWriter, r *http.Request) {
		if !auth.allow(w, r) {
			return
		}
		// The server's WriteTimeout is shorter than a flush may take.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(flushWait + 30*time.Second))
		ctx, cancel := context.WithTimeout(r.Context(), flushWait)
		defer cancel()
		if err := flushes.do(ctx); err != nil {
			http.Error(w, "flush: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("flushed\n"))
	})
	return mux
}

// NewHTTPServer returns the server of h with timeouts that keep slow or idle
// clients from holding connections: headers within 5s, a request within
// 30s, a response within 1m (POST /flush extends its own deadline past its
// 5m wait), idle keep-alive connections closed after 30s. Serve it on an
// HTTPListener, which bounds how many connections it holds at once.
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       30 * time.Second,
	}
}

// adminAuth guards POST /flush.
type adminAuth struct {
	token  string
	broken bool // the token file could not be read: refuse everything
}

// allow reports whether r may use the admin endpoint, and answers it if not.
func (a adminAuth) allow(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case a.broken:
		http.Error(w, "admin token unreadable", http.StatusServiceUnavailable)
		return false
	case a.token == "":
		if loopback(r.RemoteAddr) {
			return true
		}
		http.Error(w, "POST /flush is only served to loopback clients unless --admin-token is set", http.StatusForbidden)
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	// Hashing first makes the comparison constant-time in the length too.
	gh, wh := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(a.token))
	if ok && subtle.ConstantTimeCompare(gh[:], wh[:]) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="flowlog"`)
	http.Error(w, "POST /flush needs Authorization: Bearer <admin token>", http.StatusUnauthorized)
	return false
}

// loopback reports whether a request's RemoteAddr is a loopback address.
func loopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// flushGroup coalesces flush requests. A request joins the pending flush,
// which starts as soon as no flush is in flight; so a request never joins a
// cycle frozen before it arrived (that cycle may miss data the caller
// expects to be flushed), and however many requests arrive during one
// flush, they share the single next one.
type flushGroup struct {
	flush func(context.Context) error

	mu      sync.Mutex
	running bool
	pending *flushCall
}

type flushCall struct {
	done chan struct{}
	err  error
}

// do waits for a flush that starts after it was called.
func (g *flushGroup) do(ctx context.Context) error {
	g.mu.Lock()
	if g.pending == nil {
		g.pending = &flushCall{done: make(chan struct{})}
	}
	call := g.pending
	if !g.running {
		g.startLocked()
	}
	g.mu.Unlock()
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startLocked runs the pending flush in its own goroutine, which starts the
// next pending one when it is done. The flush is not tied to any request:
// one caller giving up does not cancel it for the others. Must hold g.mu.
func (g *flushGroup) startLocked() {
	call := g.pending
	g.pending = nil
	g.running = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), flushWait)
		call.err = g.flush(ctx)
		cancel()
		close(call.done)
		g.mu.Lock()
		g.running = false
		if g.pending != nil {
			g.startLocked()
		}
		g.mu.Unlock()
	}()
}
