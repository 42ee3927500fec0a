// Package dlq writes records that cannot be applied to the dead-letter topic
// (docs/FORMAT.md, "DLQ records"): the original key and value, with headers
// naming where the record came from and why it was rejected.
package dlq

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
)

// Writer produces dead-letter records synchronously. It is safe for
// concurrent use; it owns no goroutine and does not close the client.
type Writer struct {
	cl        *kgo.Client
	topic     string
	records   *prometheus.CounterVec
	truncated prometheus.Counter
}

// MaxRecordBytes is the largest produce batch the DLQ client builds: Kafka's
// default message.max.bytes (1048588). The client's own default (1000012) is
// below it, so a record the apply topic accepted could never reach a DLQ
// topic of the same settings. A DLQ topic with a smaller limit answers
// MESSAGE_TOO_LARGE, and Send falls back to a truncated record.
const MaxRecordBytes = 1048588

// ClientOpts are the producer options a DLQ client needs, to be appended to
// its connection options.
func ClientOpts(topic string) []kgo.Opt {
	return []kgo.Opt{
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(MaxRecordBytes),
	}
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
		truncated: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "flowlog",
			Name:      "dlq_truncated_total",
			Help:      "Dead-letter records written truncated because the whole record could not be delivered (too large for the DLQ topic).",
		}),
	}
	if reg != nil {
		reg.MustRegister(w.records, w.truncated)
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
// its ack. reason is a short, bounded label (it becomes a metric label
// value); detail is free text for the header only.
//
// A record that the DLQ topic refuses as such (too large, or otherwise
// invalid: errors no retry can cure) is sent again truncated
// (event.TruncatedDLQRecord), so one hostile record can never stop a
// partition. Other retries are the client's; an error means the record may
// not be in the DLQ and the caller must not skip src, but may retry.
func (w *Writer) Send(ctx context.Context, src *kgo.Record, reason, detail string) error {
	msg := reason
	if detail != "" {
		msg += ": " + detail
	}
	err := w.cl.ProduceSync(ctx, event.DLQRecord(w.topic, src, msg)).FirstErr()
	if Unfit(err) {
		err = w.cl.ProduceSync(ctx, event.TruncatedDLQRecord(w.topic, src, msg)).FirstErr()
		if err == nil {
			w.truncated.Inc()
		}
	}
	if err != nil {
		return fmt.Errorf("dlq: produce to %s (source %s/%d@%d, %d bytes): %w", w.topic, src.Topic, src.Partition, src.Offset, len(src.Value), err)
	}
	w.records.WithLabelValues(reason).Inc()
	return nil
}

// Unfit reports whether a produce error is about the record itself, so that
// sending the same record again can never succeed.
func Unfit(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage)
}
