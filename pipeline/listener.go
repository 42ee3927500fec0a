package pipeline

import (
	"net"
	"os"
	"sync"
	"time"
)

// The HTTP server's share of file descriptors. Without a bound, every
// connection a client opens holds one of the process's descriptors for as
// long as the client keeps it (400 half-open connections under `ulimit -n
// 256` took them all, and temp segments, Kafka sockets and commits failed
// until the clients left). HTTPListener keeps the server to a few:
//
//   - at most maxHTTPConns connections at once, and never more than an
//     eighth of the open file limit: the temp files take at most half
//     (applyFileLimits) and the rest is for Kafka, Redis, GCS and segments;
//   - it accepts only while at least a quarter of the limit is free
//     (httpFDReserve): descriptors the pipeline needs are never taken for
//     HTTP, whatever else holds the others;
//   - connections beyond stay in the kernel's listen queue, which costs the
//     process nothing, until a slot frees: a client that sends its headers
//     slowly loses its slot after the server's ReadHeaderTimeout.
const (
	maxHTTPConns  = 64
	minHTTPConns  = 4
	httpFDShare   = 8 // an eighth of the limit at most
	httpFDReserve = 4 // a quarter of the limit stays free
)

// HTTPListener wraps ln with the bounds above, computed from the soft
// RLIMIT_NOFILE in effect now.
func HTTPListener(ln net.Listener) net.Listener {
	soft, err := raiseFileLimit()
	if err != nil || soft == 0 {
		soft = 1024
	}
	conns := int(min(max(soft/httpFDShare, minHTTPConns), maxHTTPConns))
	return newLimitListener(ln, conns, int(soft), int(soft/httpFDReserve), countOpenFDs)
}

// limitListener is a net.Listener that holds at most len(slots)
// connections open and accepts only while the process keeps reserve of its
// limit descriptors free (fds counts them; an error skips the check).
type limitListener struct {
	net.Listener
	slots   chan struct{}
	limit   int
	reserve int
	fds     func() (int, error)
	done    chan struct{}
	once    sync.Once
}

func newLimitListener(ln net.Listener, conns, limit, reserve int, fds func() (int, error)) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, conns), limit: limit, reserve: reserve, fds: fds, done: make(chan struct{})}
}

// reserveWait is how long Accept waits before looking again when the
// process has fewer free descriptors than the reserve.
const reserveWait = 100 * time.Millisecond

// Accept waits for a free slot and for the descriptor reserve, then
// accepts.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	for {
		n, err := l.fds()
		if err != nil || l.limit-n > l.reserve {
			break
		}
		select {
		case <-time.After(reserveWait):
		case <-l.done:
			<-l.slots
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
}

// Close closes the listener and wakes a waiting Accept.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back once, on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// countOpenFDs counts the process's open descriptors (Linux: the entries
// of /proc/self/fd, less the one the count itself opens).
func countOpenFDs() (int, error) {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	return len(names) - 1, nil
}
