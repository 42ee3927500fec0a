package testenv

import (
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/flowlog/flowlog/internal/loopback"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago
// (loopback.FreePort).
func FreePort() (int, error) { return loopback.FreePort() }

// portTries is how many free ports onFreePort tries.
const portTries = 5

// onFreePort calls start with a free port until it returns nil, at most
// portTries times: another process may bind the port between FreePort
// and start (tests run in parallel packages). It returns start's last
// error.
func onFreePort(start func(port int) error) error {
	var err error
	for range portTries {
		port, perr := FreePort()
		if perr != nil {
			return fmt.Errorf("free port: %w", perr)
		}
		if err = start(port); err == nil {
			return nil
		}
	}
	return err
}

// ClosedAddr is a loopback address nothing listens on: a dial is refused
// (unless another process binds the port in between, which a test that
// needs the refusal cannot rule out and rarely meets).
func ClosedAddr(t testing.TB) string {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// SilentAddr is a loopback address that accepts connections and never
// answers, until the test ends: a Redis, broker or bucket that hangs.
func SilentAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
			close(done)
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}
