package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// brokenListener accepts nothing: its Accept fails for good, as when the
// process runs out of descriptors for the listening socket's peers.
type brokenListener struct{ net.Listener }

var errAcceptBroken = errors.New("accept: broken listener")

func (brokenListener) Accept() (net.Conn, error) { return nil, errAcceptBroken }

// A failing HTTP server ends the run: runHTTP hands its error to the run's
// failure path (the context serve runs the consumer under is canceled with
// it, which serve returns), instead of only logging it.
func TestHTTPServerFailureEndsTheRun(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	runCtx, fail := context.WithCancelCause(context.Background())
	defer fail(nil)
	stop := runHTTP(brokenListener{ln}, &http.Server{Handler: http.NotFoundHandler()}, slog.New(slog.DiscardHandler), fail)
	select {
	case <-runCtx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the run was not stopped by the HTTP server's failure")
	}
	stop()
	cause := context.Cause(runCtx)
	if !errors.Is(cause, errHTTPServer) || !errors.Is(cause, errAcceptBroken) {
		t.Fatalf("run ended with %v, want the HTTP server's error", cause)
	}

	// A shutdown is no failure.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx2, fail2 := context.WithCancelCause(context.Background())
	defer fail2(nil)
	runHTTP(ln2, &http.Server{Handler: http.NotFoundHandler()}, slog.New(slog.DiscardHandler), fail2)()
	if ctx2.Err() != nil {
		t.Fatalf("a clean shutdown ended the run: %v", context.Cause(ctx2))
	}
}
