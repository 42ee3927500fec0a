package sink_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

func TestWithMetricsAcceptance(t *testing.T) {
	sinktest.AcceptanceTest(t, func(t *testing.T) sink.Bucket {
		return sink.WithMetrics(sink.NewMemBucket(), prometheus.NewRegistry())
	}, sinktest.Options{})
}

func TestWithMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	b := sink.WithMetrics(sink.NewMemBucket(), reg)
	body := []byte("hello")
	obj := func() sink.Object {
		return sink.Object{Name: "x", Body: bytes.NewReader(body), Size: 5, CRC32C: sink.CRC32C(body)}
	}
	if err := b.Upload(ctx, obj()); err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(ctx, obj()); !errors.Is(err, sink.ErrExists) {
		t.Fatal(err)
	}
	rc, err := b.GetRange(ctx, "x", 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, rc)
	rc.Close()
	if _, err := b.Size(ctx, "missing"); !errors.Is(err, sink.ErrNotExist) {
		t.Fatal(err)
	}
	n, err := testutil.GatherAndCount(reg, "flowlog_object_operation_seconds")
	if err != nil || n != 6 {
		t.Fatalf("%d histogram series (%v), want one per op", n, err)
	}
	const want = `
# HELP flowlog_object_operation_failures_total Object store operations that returned an error.
# TYPE flowlog_object_operation_failures_total counter
flowlog_object_operation_failures_total{op="delete"} 0
flowlog_object_operation_failures_total{op="get"} 0
flowlog_object_operation_failures_total{op="get_range"} 0
flowlog_object_operation_failures_total{op="iter"} 0
flowlog_object_operation_failures_total{op="size"} 1
flowlog_object_operation_failures_total{op="upload"} 1
`
	if err := testutil.GatherAndCompare(reg, bytes.NewBufferString(want), "flowlog_object_operation_failures_total"); err != nil {
		t.Fatal(err)
	}
}
