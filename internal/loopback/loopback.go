// Package loopback finds free TCP ports on 127.0.0.1, for the services
// `consumer dev` embeds and for the tests' private ones.
package loopback

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago: the
// caller binds it soon, and retries with a new one if another process took
// it in between.
//
// It picks the port at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), where outgoing connections never take
// one: a port of that range, freed here and bound by the caller a moment
// later, is sometimes taken meanwhile by a client connecting anywhere on a
// busy machine. It falls back to a port the kernel picks when no port
// below the range is free or the range cannot be read.
func FreePort() (int, error) {
	if lo := ephemeralLow(); lo > minPort+portSpan {
		for range 64 {
			port := minPort + rand.IntN(lo-minPort)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// minPort is the lowest port FreePort picks: above the ports services
// usually listen on. portSpan is the fewest ports it picks from below the
// ephemeral range before it falls back to the kernel's choice.
const (
	minPort  = 20000
	portSpan = 1000
)

// ephemeralLow is the first port of the kernel's ephemeral range, 0 when
// it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0
	}
	return lo
}
