package gcs_test

import (
	"context"
	"fmt"
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
