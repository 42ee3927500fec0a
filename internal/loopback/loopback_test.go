package loopback

import (
	"net"
	"strconv"
	"testing"
)

// A port FreePort returns can be bound, and lies below the kernel's
// ephemeral range where the machine has one to read: outgoing connections
// do not take it between FreePort and the bind.
func TestFreePortBelowEphemeralRange(t *testing.T) {
	lo := ephemeralLow()
	seen := map[int]bool{}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if lo > minPort+portSpan && (port < minPort || port >= lo) {
			t.Errorf("port %d outside [%d, %d): the ephemeral range starts at %d", port, minPort, lo, lo)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("bind the port FreePort returned: %v", err)
		}
		l.Close()
		seen[port] = true
	}
	if len(seen) < 10 {
		t.Errorf("20 calls gave %d distinct ports: tests running at once would collide", len(seen))
	}
}
