package gcs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
	"github.com/fsouza/fake-gcs-server/fakestorage"
)

func TestAcceptance(t *testing.T) {
	srv := testenv.StartGCS(t)
	var n atomic.Int64
	sinktest.AcceptanceTest(t, func(t *testing.T) sink.Bucket {
		// A fresh bucket per subtest keeps them independent.
		name := fmt.Sprintf("accept-%d", n.Add(1))
		srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: name})
		b, err := gcs.New(context.Background(), gcs.Config{Bucket: name, Endpoint: srv.Endpoint()})
		if err != nil {
			t.Fatalf("new: %v", err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}, sinktest.Options{})
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg gcs.Config
		ok  bool
	}{
		{gcs.Config{Bucket: "b"}, true},
		{gcs.Config{Bucket: "b", Prefix: "x/y"}, true},
		{gcs.Config{}, false},
		{gcs.Config{Bucket: "b", Prefix: "/x"}, false},
		{gcs.Config{Bucket: "b", Prefix: "x/"}, false},
		{gcs.Config{Bucket: "b", Prefix: "x/../y"}, false},
		{gcs.Config{Bucket: "b", KMSKey: "projects/my-proj/locations/us/keyRings/ring_1/cryptoKeys/key-1"}, true},
		{gcs.Config{Bucket: "b", KMSKey: "projects/example.com:p/locations/global/keyRings/r/cryptoKeys/k"}, true},
		{gcs.Config{Bucket: "b", KMSKey: "projects/123456789/locations/europe-west4/keyRings/r/cryptoKeys/k"}, true},
	} {
		t.Run(fmt.Sprintf("%+v", tc.cfg), func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestKMSKeyValidate: a malformed --gcs-kms-key is one line that names the
// flag, the value and what is wrong with it.
func TestKMSKeyValidate(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"my-key", "want projects/P/locations/L/keyRings/R/cryptoKeys/K"},
		{"projects/p/locations/us/keyRings/r", "want projects/P/locations/L/keyRings/R/cryptoKeys/K"},
		{"projects/p/locations/us/keyRings/r/cryptoKeys/k/", "want projects/P"},
		{"/projects/p/locations/us/keyRings/r/cryptoKeys/k", "want projects/P"},
		{"project/p/locations/us/keyRings/r/cryptoKeys/k", "want projects/P"},
		{"projects/p/locations/us/keyrings/r/cryptoKeys/k", "want projects/P"},
		{"projects/p/locations/us/keyRings/r/cryptoKeys/k/cryptoKeyVersions/3", "names a key version: give the key itself"},
		{"projects//locations/us/keyRings/r/cryptoKeys/k", `project "" is not a project id`},
		{"projects/P/locations/us/keyRings/r/cryptoKeys/k", `project "P" is not a project id`},
		{"projects/p/locations/US/keyRings/r/cryptoKeys/k", `location "US" is not a location`},
		{"projects/p/locations/us/keyRings/r r/cryptoKeys/k", `key ring "r r" is not 1-63 letters`},
		{"projects/p/locations/us/keyRings/r/cryptoKeys/" + strings.Repeat("k", 64), `key "kkk`},
		{"projects/p/locations/us/keyRings/r/cryptoKeys/k\n", `key "k\n" is not`},
	} {
		t.Run(tc.key, func(t *testing.T) {
			err := (&gcs.Config{Bucket: "b", KMSKey: tc.key}).Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "--gcs-kms-key ") || !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Errorf("Validate() = %q, want one line on --gcs-kms-key containing %q", msg, tc.want)
			}
		})
	}
	// Problems of other flags stay on lines of their own.
	err := (&gcs.Config{KMSKey: "k"}).Validate()
	if want := "--gcs-bucket: must not be empty\n--gcs-kms-key \"k\": want projects/P/locations/L/keyRings/R/cryptoKeys/K"; err == nil || err.Error() != want {
		t.Errorf("Validate() = %q, want %q", err, want)
	}
}

// An object larger than Config.ChunkSize goes up as a resumable upload in
// chunks of that size (what `consumer run` sizes from --max-memory); it
// arrives whole, and the does-not-exist condition still holds for it.
func TestChunkedUpload(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartGCS(t)
	b, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: srv.Endpoint(), ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	body := make([]byte, 1<<20+17)
	for i := range body {
		body[i] = byte(i * 7 % 251)
	}
	obj := func() sink.Object {
		return sink.Object{Name: "big", Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}
	}
	if err := b.Upload(ctx, obj()); err != nil {
		t.Fatalf("upload: %v", err)
	}
	rc, err := b.Get(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read back %d bytes (%v), want the %d uploaded", len(got), err, len(body))
	}
	if err := b.Upload(ctx, obj()); !errors.Is(err, sink.ErrExists) {
		t.Fatalf("second upload: %v, want ErrExists", err)
	}
}
