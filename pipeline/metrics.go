package pipeline

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the pipeline's Prometheus series. Label values are
// bounded: results and reasons are constants of this package and the event
// decoder, flows are "catalog/name" of registered flows, partitions those of
// the apply topic.
type metrics struct {
	events          *prometheus.CounterVec
	batchSeconds    prometheus.Histogram
	tempWrite       *prometheus.HistogramVec
	tempWriteErrors prometheus.Counter
	tempBytes       *prometheus.GaugeVec
	maxTempBytes    prometheus.Gauge
	flushDuration   *prometheus.HistogramVec
	objectBytes     prometheus.Histogram
	flushFailures   *prometheus.CounterVec
	flowFatal       *prometheus.GaugeVec
	checkpointTS    *prometheus.GaugeVec
	checkpointLag   *prometheus.GaugeVec
	checkpointAhead *prometheus.GaugeVec
	tsAhead         prometheus.Gauge
	consumerLag     *prometheus.GaugeVec
	cyclesTotal     *prometheus.CounterVec
	inflightCycles  prometheus.Gauge
	lateEvents      prometheus.Counter
	fetchMaxBytes   prometheus.Gauge
	ownerLost       prometheus.Gauge
	catalogsWritten prometheus.Counter
	fetchDeferred   prometheus.Counter

	// Series of the per-record path, resolved once.
	written, skipLock, skipNoFlow, skipNoTable prometheus.Counter
	appendSeconds                              prometheus.Observer
}

// Event results of events_total.
const (
	resultWritten = "written"
	resultSkipped = "skipped"
	resultDLQ     = "dlq"
)

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = "flowlog"
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "events_total",
			Help: "Apply events handled, by result (written, skipped, dlq) and reason (empty for written).",
		}, []string{"result", "reason"}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "batch_handle_seconds",
			Help:    "Time to decode, route and write one polled batch of apply records.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		tempWrite: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "tempfile_write_seconds",
			Help:    "Temp file work by stage: append (one record's entries), freeze (rotating a generation), close (final write and sync).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}, []string{"stage"}),
		tempBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "temp_bytes",
			Help: "Bytes in temp files not yet flushed (current and frozen), by flow.",
		}, []string{"flow"}),
		maxTempBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "max_temp_bytes",
			Help: "--max-temp-bytes: fetching pauses while temp_bytes (summed over flows) exceeds it.",
		}),
		flushDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "flush_duration_seconds",
			Help:    "Flush cycle time by stage: build (chunks into the data object, per flow), upload (build and upload of all flows), commit (Redis), kafka_commit, checkpoint, total.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
		}, []string{"stage"}),
		objectBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "flush_object_bytes",
			Help:    "Size of data objects uploaded.",
			Buckets: prometheus.ExponentialBuckets(1024, 4, 12),
		}),
		flushFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "flush_failures_total",
			Help: "Failed uploads of a flow's objects in a flush cycle.",
		}, []string{"flow"}),
		flowFatal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "flow_fatal",
			Help: "1 while a flow is fatal (too many consecutive failed cycles; fetching stopped), else 0.",
		}, []string{"flow"}),
		checkpointTS: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "checkpoint_ts",
			Help: "Global checkpoint of a flow as a TSO (every covered event with commit ts <= it is backed up).",
		}, []string{"flow"}),
		checkpointLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "checkpoint_lag_seconds",
			Help: "Wall time now minus the physical time of a flow's global checkpoint.",
		}, []string{"flow"}),
		checkpointAhead: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "checkpoint_ahead_seconds",
			Help: "How far a flow's global checkpoint lies ahead of the wall clock (0 when behind): the producers' TSO clock runs ahead of this consumer's, by at most --max-clock-skew.",
		}, []string{"flow"}),
		tsAhead: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "ts_ahead_seconds",
			Help: "How far the newest ts of the records accepted in the last flush cycle lay ahead of this consumer's clock when they arrived (0 when behind); records further ahead than --max-clock-skew go to the DLQ (reason ts_future).",
		}),
		consumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "consumer_lag_records",
			Help: "Records between this consumer's position and the partition's high watermark.",
		}, []string{"topic", "partition"}),
		cyclesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "flush_cycles_total",
			Help: "Flush cycles by trigger (size, files, caught_up, interval, revoke, ddl, shutdown, request) and result (ok, failed, fenced, temp_write).",
		}, []string{"trigger", "result"}),
		tempWriteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "temp_write_errors_total",
			Help: "Sessions ended by a failed temp-file write (disk full, I/O error): uncommitted data was dropped and consumed again.",
		}),
		inflightCycles: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "flush_cycles_inflight",
			Help: "Frozen flush cycles not yet committed.",
		}),
		lateEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "late_events_total",
			Help: "Write-CF puts whose commit ts is at or below their partition's last checkpoint: the upstream sent data after a resolved ts that claimed it complete. Backed up all the same; a checkpoint or window may have claimed them too early.",
		}),
		fetchMaxBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "fetch_max_bytes",
			Help: "The fetch size limit in use (FetchMaxBytes, compressed bytes): the fetch share of --max-memory over the compression ratio seen in fetched batches.",
		}),
		ownerLost: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "redis_state_lost",
			Help: "1 once the consumer stopped because Redis lost the prefix's state (its owner key vanished, e.g. FLUSHALL): nothing is committed until `consumer recover` and a restart.",
		}),
		catalogsWritten: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "catalogs_written_total",
			Help: "Flow catalog objects uploaded (layout v2): one per change of a flow's definition, coverage windows, truncation point or snapshots.",
		}),
		fetchDeferred: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "fetch_batches_deferred_total",
			Help: "Fetched record batches left in Kafka for the next poll because the poll's batches had decompressed to the fetch share of --max-memory.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.batchSeconds, m.tempWrite, m.tempBytes, m.maxTempBytes, m.flushDuration,
			m.objectBytes, m.flushFailures, m.flowFatal, m.checkpointTS, m.checkpointLag, m.checkpointAhead, m.tsAhead,
			m.consumerLag, m.cyclesTotal, m.inflightCycles, m.tempWriteErrors, m.lateEvents, m.fetchMaxBytes,
			m.fetchDeferred, m.catalogsWritten, m.ownerLost)
	}
	m.written = m.events.WithLabelValues(resultWritten, "")
	m.skipLock = m.events.WithLabelValues(resultSkipped, reasonLockCF)
	m.skipNoFlow = m.events.WithLabelValues(resultSkipped, reasonNoFlow)
	m.skipNoTable = m.events.WithLabelValues(resultSkipped, reasonNoTbl)
	m.appendSeconds = m.tempWrite.WithLabelValues("append")
	for _, s := range []string{"append", "freeze", "close"} {
		m.tempWrite.WithLabelValues(s)
	}
	for _, s := range []string{"build", "upload", "commit", "kafka_commit", "checkpoint", "total"} {
		m.flushDuration.WithLabelValues(s)
	}
	return m
}

// flowLabel is the flow label value: "catalog/name".
func flowLabel(catalog, name string) string { return catalog + "/" + name }

// deleteFlow removes the per-flow series of a flow label that no flow
// carries any more (dropped, not created again under the same name).
func (m *metrics) deleteFlow(label string) {
	m.tempBytes.DeleteLabelValues(label)
	m.flushFailures.DeleteLabelValues(label)
	m.flowFatal.DeleteLabelValues(label)
	m.checkpointTS.DeleteLabelValues(label)
	m.checkpointLag.DeleteLabelValues(label)
	m.checkpointAhead.DeleteLabelValues(label)
}
