// Command fakegcs runs fake-gcs-server as a process, for end-to-end tests
// that need a GCS emulator they can kill, restart or put behind a proxy
// independently of the test binary.
//
//	fakegcs --port 0 --bucket flowlog [--root DIR]
//
// It speaks the GCS JSON and XML APIs over plain HTTP on 127.0.0.1. With
// --root objects are kept on the filesystem under DIR (and survive a restart
// on the same directory), else in memory. When it accepts connections it
// prints exactly one line to stdout, "fake-gcs-server listening on
// HOST:PORT", and it exits 0 on SIGTERM or SIGINT.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

func main() {
	fs := flag.NewFlagSet("fakegcs", flag.ExitOnError)
	port := fs.Int("port", 0, "port to listen on, on 127.0.0.1 (0: a free port)")
	root := fs.String("root", "", "directory to keep objects in (empty: memory)")
	bucket := fs.String("bucket", "flowlog", "bucket to create at start")
	accessLog := fs.Bool("access-log", false, "log every request to stderr")
	_ = fs.Parse(os.Args[1:])
	if *port < 0 || *port > 65535 {
		fmt.Fprintf(os.Stderr, "fakegcs: --port %d: out of range\n", *port)
		os.Exit(2)
	}

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)

	opts := fakestorage.Options{
		Scheme:      "http",
		Host:        "127.0.0.1",
		Port:        uint16(*port),
		StorageRoot: *root,
		Writer:      io.Discard,
	}
	if *accessLog {
		opts.Writer = os.Stderr
	}
	srv, err := fakestorage.NewServerWithOptions(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakegcs: start: %v\n", err)
		os.Exit(1)
	}
	if *bucket != "" {
		// CreateBucketWithOpts panics on failure; a bucket that already
		// exists in --root is not a failure.
		if _, err := srv.Backend().GetBucket(*bucket); err != nil {
			srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: *bucket})
		}
	}
	u, err := url.Parse(srv.URL())
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakegcs: server URL %q: %v\n", srv.URL(), err)
		os.Exit(1)
	}
	host, p, _ := net.SplitHostPort(u.Host)
	fmt.Printf("fake-gcs-server listening on %s\n", net.JoinHostPort(host, p))

	sig := <-sigs
	fmt.Fprintf(os.Stderr, "fakegcs: %v: shutting down\n", sig)
	srv.Stop()
}
