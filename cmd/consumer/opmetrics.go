package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
)

// opMetrics are the metrics of one run of an operator command (snapshot,
// truncate, gc, replay). The command ends when its work does, so nothing scrapes it: the run
// pushes them to a Prometheus Pushgateway (--metrics-push-url, job
// flowlog_<command>) and/or writes them for node_exporter's textfile
// collector (--metrics-file). Each is a gauge of the last run.
type opMetrics struct {
	PushURL string
	File    string

	command  string
	reg      *prometheus.Registry
	objects  *prometheus.GaugeVec
	bytes    *prometheus.GaugeVec
	duration prometheus.Gauge
	success  prometheus.Gauge
	// snapshot only: uncompressed log bytes read.
	readBytes *prometheus.GaugeVec
	// replay only: records written.
	records *prometheus.GaugeVec
	// gc only: what each flow stores.
	logBytes, snapBytes, garbage *prometheus.GaugeVec
}

// RegisterFlags registers the metrics flags on f.
func (m *opMetrics) RegisterFlags(f *flag.FlagSet) {
	f.StringVar(&m.PushURL, "metrics-push-url", "", "push this run's metrics to the Prometheus Pushgateway at this URL (job flowlog_<command>)")
	f.StringVar(&m.File, "metrics-file", "", "write this run's metrics to this file, for node_exporter's textfile collector (*.prom)")
}

// register creates the metrics of command in a registry of this run's own.
func (m *opMetrics) register(command string) {
	m.command = command
	m.reg = prometheus.NewRegistry()
	labels := prometheus.Labels{"command": command}
	m.objects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "op_objects", ConstLabels: labels,
		Help: "Objects the last run of an operator command deleted (truncate, gc) or wrote (snapshot), by flow.",
	}, []string{"flow"})
	m.bytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "op_bytes", ConstLabels: labels,
		Help: "Bytes of the objects the last run of an operator command deleted or wrote, or of the records it produced (replay), by flow.",
	}, []string{"flow"})
	m.duration = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "op_duration_seconds", ConstLabels: labels,
		Help: "Wall time of the last run of an operator command.",
	})
	m.success = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "op_last_success_timestamp_seconds", ConstLabels: labels,
		Help: "Unix time the last successful run of an operator command ended.",
	})
	m.readBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "op_log_read_bytes", ConstLabels: labels,
		Help: "Uncompressed log bytes the last run of an operator command read (snapshot), by flow.",
	}, []string{"flow"})
	m.records = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "op_records", ConstLabels: labels,
		Help: "Records the last run of an operator command produced (replay; records an earlier run had written are not counted), by flow.",
	}, []string{"flow"})
	m.logBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "storage_log_bytes",
		Help: "Bytes of a flow's referenced data and meta objects, as the last gc run counted them.",
	}, []string{"flow"})
	m.snapBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "storage_snapshot_bytes",
		Help: "Bytes of a flow's listed snapshots, as the last gc run counted them.",
	}, []string{"flow"})
	m.garbage = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "flowlog", Name: "storage_garbage_bytes",
		Help: "Bytes of a flow's unreferenced objects the last gc run found (deleted, or kept for the grace period).",
	}, []string{"flow"})
	m.reg.MustRegister(m.objects, m.bytes, m.duration, m.success)
	switch command {
	case "snapshot":
		m.reg.MustRegister(m.readBytes)
	case "gc":
		m.reg.MustRegister(m.logBytes, m.snapBytes, m.garbage)
	case "replay":
		m.reg.MustRegister(m.records)
	}
}

// finish records the run's duration and, if err is nil, its success time,
// and pushes or writes the metrics where the flags say.
func (m *opMetrics) finish(start time.Time, err error) error {
	m.duration.Set(time.Since(start).Seconds())
	if err == nil {
		m.success.SetToCurrentTime()
	}
	var errs []error
	if m.PushURL != "" {
		// PUT: the job's series are those of this run only (a truncate of
		// another flow replaces the previous one's).
		if perr := push.New(m.PushURL, "flowlog_"+m.command).Gatherer(m.reg).Push(); perr != nil {
			errs = append(errs, fmt.Errorf("push metrics to %s: %w", m.PushURL, perr))
		}
	}
	if m.File != "" {
		if werr := prometheus.WriteToTextfile(m.File, m.reg); werr != nil {
			errs = append(errs, fmt.Errorf("write metrics to %s: %w", m.File, werr))
		}
	}
	return errors.Join(errs...)
}
