package testenv

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/flowlog/flowlog/internal/loopback"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago
// (loopback.FreePort).
func FreePort() (int, error) { return loopback.FreePort() }

// portTries is how many free ports OnPorts tries.
const portTries = 5

// OnPorts calls start with a port from pick until start returns nil, at
// most portTries times: another process may bind a port found free before
// start binds it (tests run in parallel packages). An error start marks
// with StopTrying ends the tries at once (a start that failed for another
// reason than its port). It returns start's last error.
func OnPorts(pick func() (int, error), start func(port int) error) error {
	var err error
	for range portTries {
		port, perr := pick()
		if perr != nil {
			return fmt.Errorf("free port: %w", perr)
		}
		if err = start(port); err == nil {
			return nil
		}
		var stop stopTrying
		if errors.As(err, &stop) {
			return stop.err
		}
	}
	return err
}

// onFreePort is OnPorts with ports from FreePort.
func onFreePort(start func(port int) error) error { return OnPorts(FreePort, start) }

// StopTrying marks err as one another port would not mend: OnPorts
// returns it without trying again.
func StopTrying(err error) error { return stopTrying{err} }

type stopTrying struct{ err error }

func (s stopTrying) Error() string { return s.err.Error() }
func (s stopTrying) Unwrap() error { return s.err }

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
