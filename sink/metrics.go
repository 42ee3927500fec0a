package sink

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Operation label values of the object-store metrics.
var bucketOps = []string{"upload", "get", "get_range", "size", "iter", "delete"}

type metricsBucket struct {
	b        Bucket
	seconds  *prometheus.HistogramVec
	failures *prometheus.CounterVec
}

// WithMetrics returns b instrumented with
// flowlog_object_operation_seconds{op} (latency of each call; for reads until
// the reader is closed) and flowlog_object_operation_failures_total{op}.
// ErrExists on upload and ErrNotExist on reads count as failures too: they are
// rare in normal operation and worth seeing.
func WithMetrics(b Bucket, reg prometheus.Registerer) Bucket {
	m := &metricsBucket{
		b: b,
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "flowlog",
			Name:      "object_operation_seconds",
			Help:      "Latency of object store operations.",
			Buckets:   prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"op"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "flowlog",
			Name:      "object_operation_failures_total",
			Help:      "Object store operations that returned an error.",
		}, []string{"op"}),
	}
	for _, op := range bucketOps {
		m.seconds.WithLabelValues(op)
		m.failures.WithLabelValues(op)
	}
	if reg != nil {
		reg.MustRegister(m.seconds, m.failures)
	}
	return m
}

func (m *metricsBucket) done(op string, start time.Time, err error) {
	m.seconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, context.Canceled) {
		m.failures.WithLabelValues(op).Inc()
	}
}

func (m *metricsBucket) Upload(ctx context.Context, obj Object) error {
	start := time.Now()
	err := m.b.Upload(ctx, obj)
	m.done("upload", start, err)
	return err
}

func (m *metricsBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := m.b.Get(ctx, name)
	if err != nil {
		m.done("get", start, err)
		return nil, err
	}
	return &timedReader{ReadCloser: rc, m: m, op: "get", start: start}, nil
}

func (m *metricsBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := m.b.GetRange(ctx, name, off, length)
	if err != nil {
		m.done("get_range", start, err)
		return nil, err
	}
	return &timedReader{ReadCloser: rc, m: m, op: "get_range", start: start}, nil
}

func (m *metricsBucket) Size(ctx context.Context, name string) (int64, error) {
	start := time.Now()
	n, err := m.b.Size(ctx, name)
	m.done("size", start, err)
	return n, err
}

func (m *metricsBucket) Iter(ctx context.Context, prefix string, fn func(name string) error) error {
	start := time.Now()
	err := m.b.Iter(ctx, prefix, fn)
	m.done("iter", start, err)
	return err
}

func (m *metricsBucket) Delete(ctx context.Context, name string) error {
	start := time.Now()
	err := m.b.Delete(ctx, name)
	m.done("delete", start, err)
	return err
}

func (m *metricsBucket) Close() error { return m.b.Close() }

// timedReader observes a read's latency when it is closed, and counts a
// failure if reading hit an error other than EOF.
type timedReader struct {
	io.ReadCloser
	m      *metricsBucket
	op     string
	start  time.Time
	err    error
	closed bool
}

func (r *timedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}

func (r *timedReader) Close() error {
	err := r.ReadCloser.Close()
	if !r.closed {
		r.closed = true
		r.m.done(r.op, r.start, r.err)
	}
	return err
}
