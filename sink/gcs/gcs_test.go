package gcs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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
	} {
		t.Run(fmt.Sprintf("%+v", tc.cfg), func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
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
