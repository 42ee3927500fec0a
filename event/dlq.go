package event

import (
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Record headers of the apply and DLQ topics (DESIGN section 2).
const (
	HeaderSourceTopic     = "flowlog-source-topic"
	HeaderSourcePartition = "flowlog-source-partition"
	HeaderSourceOffset    = "flowlog-source-offset"
	HeaderError           = "flowlog-error"
	HeaderContentType     = "content-type"
)

// ContentType returns the value of r's first content-type header, matching
// the header key case-insensitively, or "" if there is none.
func ContentType(r *kgo.Record) string {
	for _, h := range r.Headers {
		if strings.EqualFold(h.Key, HeaderContentType) {
			return string(h.Value)
		}
	}
	return ""
}

// DLQRecord returns the DLQ record for src: the same key and value, src's
// headers, and the source topic, partition, offset (decimal text) and
// reason headers. flowlog headers src already carries (a record that went
// through a DLQ before) are replaced rather than repeated.
func DLQRecord(dlqTopic string, src *kgo.Record, reason string) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(src.Headers)+4)
	for _, h := range src.Headers {
		switch h.Key {
		case HeaderSourceTopic, HeaderSourcePartition, HeaderSourceOffset, HeaderError:
			continue
		}
		hs = append(hs, h)
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderSourceTopic, Value: []byte(src.Topic)},
		kgo.RecordHeader{Key: HeaderSourcePartition, Value: strconv.AppendInt(nil, int64(src.Partition), 10)},
		kgo.RecordHeader{Key: HeaderSourceOffset, Value: strconv.AppendInt(nil, src.Offset, 10)},
		kgo.RecordHeader{Key: HeaderError, Value: []byte(reason)},
	)
	return &kgo.Record{Topic: dlqTopic, Key: src.Key, Value: src.Value, Headers: hs}
}
