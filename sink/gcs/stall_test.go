package gcs_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// TestRequestTimeoutSilentServer: against a server that accepts and never
// answers, every kind of request fails with ErrStalled after about the
// request timeout, instead of hanging until the caller's context ends.
func TestRequestTimeoutSilentServer(t *testing.T) {
	const timeout = 300 * time.Millisecond
	b, err := gcs.New(context.Background(), gcs.Config{Bucket: "b", Endpoint: testenv.SilentAddr(t), RequestTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	body := []byte("seven b")
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context) error
	}{
		{"upload", func(ctx context.Context) error {
			return b.Upload(ctx, sink.Object{Name: "o", Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)})
		}},
		{"size", func(ctx context.Context) error { _, err := b.Size(ctx, "o"); return err }},
		{"get", func(ctx context.Context) error {
			rc, err := b.Get(ctx, "o")
			if err == nil {
				_, err = io.ReadAll(rc)
				rc.Close()
			}
			return err
		}},
		{"list", func(ctx context.Context) error { return b.Iter(ctx, "p/", func(string) error { return nil }) }},
		{"delete", func(ctx context.Context) error { return b.Delete(ctx, "o") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The caller's own deadline is far away: only the request
			// timeout can end the request this early.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			err := tc.op(ctx)
			took := time.Since(start)
			if !errors.Is(err, gcs.ErrStalled) {
				t.Fatalf("%s against a silent server: %v after %v, want ErrStalled", tc.name, err, took)
			}
			var se *gcs.StallError
			if !errors.As(err, &se) || se.Timeout != timeout {
				t.Errorf("error %v: want a *StallError with the timeout %v", err, timeout)
			}
			if took > 20*timeout {
				t.Errorf("%s took %v, want about the request timeout %v", tc.name, took, timeout)
			}
		})
	}
}

// throttle is a TCP proxy to target that forwards at most chunk bytes
// every pause in each direction: a slow link that keeps moving.
func throttle(t *testing.T, target string, chunk int, pause time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, chunk)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
				time.Sleep(pause)
			}
			if err != nil {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				return
			}
		}
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go pipe(up, c)
			go pipe(c, up)
			t.Cleanup(func() { c.Close(); up.Close() })
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// TestRequestTimeoutSlowButMoving: the timeout bounds silence, not length.
// Through a link that moves 16 KiB every 40 ms, a 2 MiB upload in 256 KiB
// chunks and its download take seconds, past twice the 2 s timeout, and
// succeed; so does a read whose reader pauses longer than the timeout
// between reads (the caller's turn is never the server's stall). Each
// chunk leaves the socket buffers in about 0.7 s, well within the timeout
// even on a busy machine: bytes handed to the connection count as sent.
func TestRequestTimeoutSlowButMoving(t *testing.T) {
	const timeout = 2 * time.Second
	srv := testenv.StartGCS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: throttle(t, srv.Endpoint(), 16<<10, 40*time.Millisecond),
		RequestTimeout: timeout, ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<17) // 2 MiB
	start := time.Now()
	if err := b.Upload(ctx, sink.Object{Name: "slow", Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
		t.Fatalf("upload over a slow link: %v after %v", err, time.Since(start))
	}
	up := time.Since(start)
	rc, err := b.Get(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("download over a slow link: %d bytes, %v", len(got), err)
	}
	t.Logf("2 MiB up in %v, down in %v, with a %v request timeout", up.Round(time.Millisecond), (time.Since(start) - up).Round(time.Millisecond), timeout)
	if up < 2*timeout {
		t.Fatalf("upload took %v: the link is not slow enough to show anything against the %v timeout", up, timeout)
	}

	rc, err = b.GetRange(ctx, "slow", 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	buf := make([]byte, 4<<10)
	if _, err := io.ReadFull(rc, buf); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * timeout) // the reader's own pause
	rest, err := io.ReadAll(rc)
	if err != nil || len(rest)+len(buf) != 64<<10 {
		t.Fatalf("read after the reader paused %v: %d bytes, %v", 2*timeout, len(rest)+len(buf), err)
	}
}

// TestRequestTimeoutStalledBody: a server that sends the response headers
// and 10 bytes of a body, then nothing, has the read cut after the
// timeout; the storage client's ranged re-read then gets the rest, so the
// download completes instead of hanging.
func TestRequestTimeoutStalledBody(t *testing.T) {
	content := bytes.Repeat([]byte("x"), 1000)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var ranged atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				if req.Header.Get("Range") != "" {
					ranged.Add(1)
					_, _ = fmt.Fprintf(c, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-999/1000\r\nContent-Length: 990\r\nX-Goog-Generation: 1\r\n\r\n%s", content[10:])
					return
				}
				_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nX-Goog-Generation: 1\r\n\r\n%s", content[:10])
				_, _ = io.Copy(io.Discard, c) // and nothing more
			}()
		}
	}()
	const timeout = 300 * time.Millisecond
	b, err := gcs.New(context.Background(), gcs.Config{Bucket: "b", Endpoint: ln.Addr().String(), RequestTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	rc, err := b.Get(ctx, "o")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	took := time.Since(start)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("read of a body that stalled: %d bytes, %v", len(got), err)
	}
	if ranged.Load() != 1 || took < timeout || took > 20*timeout {
		t.Fatalf("read took %v with %d ranged re-reads; want one re-read after about the %v timeout", took, ranged.Load(), timeout)
	}
}
