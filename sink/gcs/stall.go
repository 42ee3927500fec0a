package gcs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// ErrStalled is what a GCS request returns (wrapped in a *StallError) when
// the server made no progress for the request timeout: no response headers
// within it after the last byte of the request went out, or no byte of the
// request or response body moved for that long. Callers count it as a
// failed attempt like any other error.
var ErrStalled = errors.New("gcs request stalled")

// StallError reports a request that the stall timeout ended: which
// request, in which phase, and after how long without progress.
type StallError struct {
	Method  string
	URL     string // without the query: it may carry upload ids
	Phase   string // "waiting for the response", "sending the request body" or "reading the response body"
	Timeout time.Duration
}

// Error names the phase and the timeout; the HTTP client's error around
// it names the request.
func (e *StallError) Error() string {
	return fmt.Sprintf("gcs server made no progress for %s while %s (--gcs-request-timeout)", e.Timeout, e.Phase)
}

// Unwrap makes errors.Is(err, ErrStalled) true.
func (e *StallError) Unwrap() error { return ErrStalled }

// stallTransport bounds every request by its progress rather than its
// total length: a large upload or download may take as long as its bytes
// need, but a server that accepts a connection and then stops answering
// (no response headers, no byte of a body accepted or sent) ends the
// request after timeout. The clock runs only while the request waits on
// the server: not while the caller produces the request body or consumes
// the response body, so a slow reader is never taken for a stalled server.
//
// The storage client retries none of these errors (a StallError is no
// net.Error, and its text matches none of the transient ones the client
// retries on), so an Upload that stalls returns after one timeout and the
// flush cycle counts a failed attempt, as for any other GCS failure.
type stallTransport struct {
	base    http.RoundTripper
	timeout time.Duration
}

// stallWatch is the clock of one request: armed while the request waits
// on the server, stopped while the caller has the turn.
type stallWatch struct {
	timeout time.Duration
	cancel  context.CancelFunc

	mu    sync.Mutex
	timer *time.Timer
	fired bool
	phase string
}

func (w *stallWatch) fire() {
	w.mu.Lock()
	w.fired = true
	w.mu.Unlock()
	w.cancel()
}

// arm restarts the clock for phase; a fired clock stays fired.
func (w *stallWatch) arm(phase string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.fired {
		w.phase = phase
		w.timer.Reset(w.timeout)
	}
}

// pause stops the clock while the caller has the turn.
func (w *stallWatch) pause() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.fired {
		w.timer.Stop()
	}
}

// stalled returns the phase the clock fired in, and false if it did not.
func (w *stallWatch) stalled() (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.phase, w.fired
}

func (t *stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	w := &stallWatch{timeout: t.timeout, cancel: cancel, phase: "waiting for the response"}
	w.timer = time.AfterFunc(t.timeout, w.fire)
	out := req.WithContext(ctx)
	if req.Body != nil && req.Body != http.NoBody {
		out.Body = &requestBody{rc: req.Body, w: w}
	}
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		w.pause()
		cancel()
		if phase, ok := w.stalled(); ok {
			return nil, t.stallError(req, phase)
		}
		return nil, err
	}
	w.pause()
	resp.Body = &responseBody{rc: resp.Body, w: w, cancel: cancel, err: func(phase string) error { return t.stallError(req, phase) }}
	return resp, nil
}

func (t *stallTransport) stallError(req *http.Request, phase string) error {
	u := *req.URL
	u.RawQuery = ""
	return &StallError{Method: req.Method, URL: u.String(), Phase: phase, Timeout: t.timeout}
}

// requestBody is a request body whose reads hand the turn to the caller:
// the transport reads it when the connection has taken what came before,
// so the clock runs between reads and stops during them.
type requestBody struct {
	rc io.ReadCloser
	w  *stallWatch
}

func (b *requestBody) Read(p []byte) (int, error) {
	b.w.pause()
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.w.arm("waiting for the response")
	} else {
		b.w.arm("sending the request body")
	}
	return n, err
}

func (b *requestBody) Close() error { return b.rc.Close() }

// responseBody is a response body whose reads wait on the server: the
// clock runs during each read and stops between them.
type responseBody struct {
	rc     io.ReadCloser
	w      *stallWatch
	cancel context.CancelFunc
	err    func(phase string) error
}

func (b *responseBody) Read(p []byte) (int, error) {
	b.w.arm("reading the response body")
	n, err := b.rc.Read(p)
	b.w.pause()
	if err != nil && err != io.EOF {
		if phase, ok := b.w.stalled(); ok {
			return n, b.err(phase)
		}
	}
	return n, err
}

func (b *responseBody) Close() error {
	b.w.pause()
	err := b.rc.Close()
	b.cancel()
	return err
}
