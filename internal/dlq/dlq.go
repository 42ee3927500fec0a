// Package dlq writes records that cannot be applied to the dead-letter topic
// (DESIGN section 2): the original key and value, with headers naming where
// the record came from and why it was rejected.
package dlq

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
)

// Writer produces dead-letter records synchronously. It is safe for
// concurrent use; it owns no goroutine and does not close the client.
type Writer struct {
	cl      *kgo.Client
	topic   string
	records *prometheus.CounterVec
}

// New returns a Writer producing to topic through cl, and registers the
// flowlog_dlq_records_total{reason} counter on reg (nil: not registered).
func New(cl *kgo.Client, topic string, reg prometheus.Registerer) *Writer {
	w := &Writer{
		cl:    cl,
		topic: topic,
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "flowlog",
			Name:      "dlq_records_total",
			Help:      "Records written to the dead-letter topic, by reason.",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(w.records)
	}
	return w
}

// InitReasons creates the counter series of reasons at 0, so that dashboards
// see them before the first bad record.
func (w *Writer) InitReasons(reasons ...string) {
	for _, r := range reasons {
		w.records.WithLabelValues(r)
	}
}

// Topic is the dead-letter topic written to.
func (w *Writer) Topic() string { return w.topic }

// Send produces the dead-letter record of src (event.DLQRecord: src's key,
// value and headers, plus the source topic, partition, offset and the error
// reason + ": " + detail, or reason alone if detail is empty) and waits for
// its ack. reason
// is a short, bounded label (it becomes a metric label value); detail is free
// text for the header only. Retries are the client's; an error means the
// record may not be in the DLQ and the caller must not skip src.
func (w *Writer) Send(ctx context.Context, src *kgo.Record, reason, detail string) error {
	msg := reason
	if detail != "" {
		msg += ": " + detail
	}
	rec := event.DLQRecord(w.topic, src, msg)
	if err := w.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("dlq: produce to %s (source %s/%d@%d): %w", w.topic, src.Topic, src.Partition, src.Offset, err)
	}
	w.records.WithLabelValues(reason).Inc()
	return nil
}
