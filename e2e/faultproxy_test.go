package e2e

import (
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"
)

// faultMode is how the fault proxy fails a request it picks.
type faultMode int32

const (
	fault503   faultMode = iota // answer 503 Service Unavailable
	faultReset                  // reset the TCP connection (RST) without an answer
	faultMixed                  // either, half and half
	fault403                    // answer 403 Forbidden, as GCS does without the permission
	faultHang                   // read the request and never answer (until the client gives up)
)

// faultProxy is an HTTP reverse proxy between the consumer's --gcs-endpoint
// and the fake-gcs-server process. At runtime a test sets the share of write
// requests (POST, PUT, PATCH, DELETE: uploads) that fail, how they fail, and
// a latency added before every request is forwarded. Reads always pass, so
// a test can check what GCS holds through the proxy or around it.
type faultProxy struct {
	// Addr is the proxy's host:port, for --gcs-endpoint.
	Addr string

	failRate atomic.Uint64 // math.Float64bits of the share of writes to fail
	mode     atomic.Int32
	latency  atomic.Int64 // time.Duration

	requests, writes, failed503, resets, forbidden, hangs atomic.Int64
}

// startFaultProxy starts a proxy to target (host:port) on a free loopback
// port; it stops when the test ends.
func startFaultProxy(t testing.TB, target string) *faultProxy {
	t.Helper()
	u, err := url.Parse("http://" + target)
	if err != nil {
		t.Fatalf("proxy target %q: %v", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	fp := &faultProxy{Addr: ln.Addr().String()}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = nil
	srv := &http.Server{Handler: fp.handler(rp), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return fp
}

// setFaults makes the share rate (0..1) of write requests fail in mode.
func (fp *faultProxy) setFaults(rate float64, mode faultMode) {
	fp.failRate.Store(math.Float64bits(rate))
	fp.mode.Store(int32(mode))
}

// setLatency delays every request by d before it is forwarded.
func (fp *faultProxy) setLatency(d time.Duration) { fp.latency.Store(int64(d)) }

// injected is the number of requests failed so far (503s, resets, 403s).
func (fp *faultProxy) injected() int64 {
	return fp.failed503.Load() + fp.resets.Load() + fp.forbidden.Load()
}

func isWrite(method string) bool {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

func (fp *faultProxy) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fp.requests.Add(1)
		if d := time.Duration(fp.latency.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		if isWrite(r.Method) {
			fp.writes.Add(1)
			if rand.Float64() < math.Float64frombits(fp.failRate.Load()) {
				mode := faultMode(fp.mode.Load())
				if mode == faultMixed {
					mode = faultMode(rand.IntN(2))
				}
				if mode == fault403 {
					fp.forbidden.Add(1)
					http.Error(w, `{"error":{"code":403,"message":"injected: permission denied"}}`, http.StatusForbidden)
					return
				}
				if mode == faultReset && fp.reset(w) {
					fp.resets.Add(1)
					return
				}
				if mode == faultHang {
					fp.hangs.Add(1)
					_, _ = io.Copy(io.Discard, r.Body)
					<-r.Context().Done() // the client's timeout, or the proxy's end
					return
				}
				fp.failed503.Add(1)
				http.Error(w, "injected fault", http.StatusServiceUnavailable)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// reset closes the request's connection with an RST; false if it cannot
// take the connection over.
func (fp *faultProxy) reset(w http.ResponseWriter) bool {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return false
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return false
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
	return true
}
