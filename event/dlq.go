package event

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Record headers of the apply and DLQ topics (docs/FORMAT.md, "DLQ records").
const (
	HeaderSourceTopic     = "flowlog-source-topic"
	HeaderSourcePartition = "flowlog-source-partition"
	HeaderSourceOffset    = "flowlog-source-offset"
	HeaderError           = "flowlog-error"
	HeaderContentType     = "content-type"
)

// A DLQ record of a whole record batch that the consumer could not
// decompress holds the batch as the broker stores it (Kafka's v2 record
// batch format, header and compressed records) under content-type
// ContentTypeRecordBatch, with the offset after its last record and its
// record count.
const (
	ContentTypeRecordBatch = "application/vnd.kafka.record-batch"
	HeaderBatchNextOffset  = "flowlog-batch-next-offset"
	HeaderBatchRecords     = "flowlog-batch-records"
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
		case HeaderSourceTopic, HeaderSourcePartition, HeaderSourceOffset, HeaderError,
			HeaderTruncated, HeaderOriginalLength, HeaderOriginalSHA256:
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

// Headers of a truncated DLQ record: one whose original the DLQ topic cannot
// take whole (larger than its max.message.bytes, say). It keeps a prefix of
// the value and identifies the original by length and sha256.
const (
	HeaderTruncated      = "flowlog-truncated"
	HeaderOriginalLength = "flowlog-original-length"
	HeaderOriginalSHA256 = "flowlog-original-sha256"
)

// Bounds of a truncated DLQ record.
const (
	TruncatedKeyMax    = 1 << 10 // key prefix kept
	TruncatedValueMax  = 4 << 10 // value prefix kept
	TruncatedReasonMax = 1 << 10 // reason header text kept
	truncatedHeaderMax = 256     // a source header longer than this is dropped
)

// TruncatedDLQRecord returns the DLQ record for src when the full one
// (DLQRecord) cannot be delivered: the source and reason headers as
// DLQRecord writes them, a key and value cut to TruncatedKeyMax and
// TruncatedValueMax bytes, src's short headers only, and the headers
// flowlog-truncated: true, flowlog-original-length (decimal) and
// flowlog-original-sha256 (hex, of the original value).
func TruncatedDLQRecord(dlqTopic string, src *kgo.Record, reason string) *kgo.Record {
	short := *src
	short.Headers = nil
	for _, h := range src.Headers {
		if len(h.Key)+len(h.Value) <= truncatedHeaderMax {
			short.Headers = append(short.Headers, h)
		}
	}
	short.Key = src.Key[:min(len(src.Key), TruncatedKeyMax)]
	short.Value = src.Value[:min(len(src.Value), TruncatedValueMax)]
	if len(reason) > TruncatedReasonMax {
		reason = reason[:TruncatedReasonMax]
	}
	sum := sha256.Sum256(src.Value)
	r := DLQRecord(dlqTopic, &short, reason)
	r.Headers = append(r.Headers,
		kgo.RecordHeader{Key: HeaderTruncated, Value: []byte("true")},
		kgo.RecordHeader{Key: HeaderOriginalLength, Value: strconv.AppendInt(nil, int64(len(src.Value)), 10)},
		kgo.RecordHeader{Key: HeaderOriginalSHA256, Value: []byte(hex.EncodeToString(sum[:]))},
	)
	return r
}
