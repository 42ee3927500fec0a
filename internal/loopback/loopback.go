// Package loopback finds free TCP ports on 127.0.0.1, for the services
// `consumer dev` embeds and for the tests' private ones.
package loopback

import "net"

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago: the
// caller binds it soon, and retries with a new one if another process took
// it in between.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
