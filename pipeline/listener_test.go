package pipeline

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// acceptAll accepts from l until it fails, counting connections held and
// the most held at once; accepted connections are sent on conns.
func acceptAll(l net.Listener, held, peak *atomic.Int64, conns chan<- net.Conn) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		n := held.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		conns <- c
	}
}

func waitHeld(t *testing.T, held *atomic.Int64, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for held.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections accepted, want %d", held.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLimitListenerSlots: with 3 slots and 10 clients connected, the
// server holds 3 connections; closing one lets exactly one more in.
func TestLimitListenerSlots(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 3, 1<<20, 0, func() (int, error) { return 0, nil })
	defer l.Close()
	var held, peak atomic.Int64
	conns := make(chan net.Conn, 16)
	go acceptAll(l, &held, &peak, conns)
	for range 10 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitHeld(t, &held, 3)
	first := <-conns
	// Counted out before the slot is given back: the listener may accept
	// the next connection as soon as Close returns.
	held.Add(-1)
	first.Close()
	waitHeld(t, &held, 3)
	if p := peak.Load(); p != 3 {
		t.Fatalf("at most %d connections held at once, want 3", p)
	}
	// Closing twice gives one slot back, not two.
	first.Close()
	time.Sleep(50 * time.Millisecond)
	if n := held.Load(); n != 3 {
		t.Fatalf("%d held after a double close, want 3", n)
	}
}

// TestLimitListenerReserve: while the process has no more free descriptors
// than the reserve, nothing is accepted; once it has, the waiting client
// is.
func TestLimitListenerReserve(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var open atomic.Int64
	open.Store(100) // limit 120, reserve 20: nothing free beyond it
	l := newLimitListener(inner, 8, 120, 20, func() (int, error) { return int(open.Load()), nil })
	defer l.Close()
	var held, peak atomic.Int64
	conns := make(chan net.Conn, 4)
	go acceptAll(l, &held, &peak, conns)
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(3 * reserveWait)
	if n := held.Load(); n != 0 {
		t.Fatalf("%d accepted with no descriptor beyond the reserve free, want 0", n)
	}
	open.Store(99)
	waitHeld(t, &held, 1)
	(<-conns).Close()
}

// TestLimitListenerCloseWakesAccept: Close ends an Accept that waits for
// a slot.
func TestLimitListenerCloseWakesAccept(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 1, 1<<20, 0, func() (int, error) { return 0, nil })
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := l.Accept(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := l.Accept(); done <- err }()
	time.Sleep(20 * time.Millisecond)
	l.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Accept after Close succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept waiting for a slot did not return after Close")
	}
}
