package sink

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SnapshotMetrics are the metrics of the snapshots a process takes,
// labelled by flow ("<catalog>/<name>", bounded by the flows there are):
//
//	flowlog_snapshot_objects_total{flow}         objects uploaded, snapshot.meta included
//	flowlog_snapshot_bytes_total{flow}           bytes uploaded
//	flowlog_snapshot_log_read_bytes_total{flow}  uncompressed log bytes read
//	flowlog_snapshot_duration_seconds{flow}      time per snapshot, failed ones included
//	flowlog_snapshot_failures_total{flow}        snapshots that failed
//	flowlog_snapshot_last_ts{flow}               ts of the last snapshot written
type SnapshotMetrics struct {
	objects, bytes, logBytes, failures *prometheus.CounterVec
	seconds                            *prometheus.HistogramVec
	lastTS                             *prometheus.GaugeVec
}

// NewSnapshotMetrics returns the snapshot metrics, registered with reg
// unless it is nil.
func NewSnapshotMetrics(reg prometheus.Registerer) *SnapshotMetrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "flowlog", Subsystem: "snapshot", Name: name, Help: help}, []string{"flow"})
	}
	m := &SnapshotMetrics{
		objects:  counter("objects_total", "Snapshot objects uploaded, snapshot.meta included."),
		bytes:    counter("bytes_total", "Snapshot bytes uploaded."),
		logBytes: counter("log_read_bytes_total", "Uncompressed log bytes snapshots read."),
		failures: counter("failures_total", "Snapshots that failed."),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "flowlog", Subsystem: "snapshot", Name: "duration_seconds",
			Help: "Time taken per snapshot, failed ones included.", Buckets: prometheus.ExponentialBuckets(1, 2, 14)}, []string{"flow"}),
		lastTS: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "flowlog", Subsystem: "snapshot", Name: "last_ts",
			Help: "TSO of the last snapshot written."}, []string{"flow"}),
	}
	if reg != nil {
		reg.MustRegister(m.objects, m.bytes, m.logBytes, m.failures, m.seconds, m.lastTS)
	}
	return m
}

// Observe records one snapshot of flow (catalog/name) at ts: its stats,
// how long it took, and whether it failed.
func (m *SnapshotMetrics) Observe(flow string, ts uint64, st SnapshotStats, d time.Duration, err error) {
	m.objects.WithLabelValues(flow).Add(float64(st.Objects))
	m.bytes.WithLabelValues(flow).Add(float64(st.Bytes))
	m.logBytes.WithLabelValues(flow).Add(float64(st.LogBytes))
	m.seconds.WithLabelValues(flow).Observe(d.Seconds())
	if err != nil {
		m.failures.WithLabelValues(flow).Inc()
		return
	}
	m.lastTS.WithLabelValues(flow).Set(float64(ts))
}
