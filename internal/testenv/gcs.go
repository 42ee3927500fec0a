package testenv

import (
	"net/url"
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
// created, and stops it when the test ends. A port taken before the server
// binds it makes it try another (onFreePort).
func StartGCS(t testing.TB) *GCS {
	t.Helper()
	var srv *fakestorage.Server
	err := onFreePort(func(port int) (err error) {
		srv, err = fakestorage.NewServerWithOptions(fakestorage.Options{
			Scheme: "http",
			Host:   "127.0.0.1",
			Port:   uint16(port),
		})
		return err
	})
	if err != nil {
		t.Fatalf("start fake-gcs-server: %v", err)
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
