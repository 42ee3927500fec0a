package testenv

import (
	"errors"
	"net/url"
	"syscall"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

// Bucket is the bucket StartGCS creates.
const Bucket = "flowlog-test"

// GCS is an in-process fake-gcs-server listening on a loopback port, speaking
// the GCS JSON and XML APIs over plain HTTP.
type GCS struct {
	*fakestorage.Server
}

// StartGCS starts fake-gcs-server in memory on a free port with Bucket
// created, and stops it when the test ends. A port found free may be taken
// by another process before the server binds it (tests run in parallel
// packages): it then tries another, up to 5 times.
func StartGCS(t testing.TB) *GCS {
	t.Helper()
	var srv *fakestorage.Server
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		srv, err = fakestorage.NewServerWithOptions(fakestorage.Options{
			Scheme: "http",
			Host:   "127.0.0.1",
			Port:   uint16(port),
		})
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 5 {
			t.Fatalf("start fake-gcs-server: %v", err)
		}
	}
	t.Cleanup(srv.Stop)
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: Bucket})
	return &GCS{srv}
}

// Endpoint is the host:port to put in STORAGE_EMULATOR_HOST or the
// --gcs-endpoint flag.
func (g *GCS) Endpoint() string {
	u, _ := url.Parse(g.URL())
	return u.Host
}
