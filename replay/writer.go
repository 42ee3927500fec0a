package replay

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
)

// RunID is the id of a replay with these arguments (the flow, the mode,
// the resolved from and to ts, the tables and key range, and the format)
// and recordEvents, the event bytes a record holds (RecordEvents of the
// target's max.message.bytes): the same arguments give the same id and,
// the backup being the same, the same records in the same order. A run's
// records carry it, so that a re-run finds what an interrupted one wrote.
// The target is not part of it: a run reads only its own topic's tail,
// and two targets of one replay hold the same records, headers included.
func RunID(flowID uint32, mode Mode, from, to uint64, tables []int64, startKey, endKey []byte, format Format, recordEvents int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "flowlog-replay v1\nflow=%d\nmode=%s\nfrom=%d\nto=%d\nformat=%s\ntables=", flowID, mode, from, to, format)
	for i, t := range tables {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(t, 10))
	}
	if len(startKey) > 0 || len(endKey) > 0 {
		fmt.Fprintf(&b, "\nkeys=%x-%x", startKey, endKey)
	}
	if recordEvents != maxBatchEvents {
		fmt.Fprintf(&b, "\nrecord_events=%d", recordEvents)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}

// runHeader is the HeaderRun value of a run.
func runHeader(flowID uint32, run string) string { return fmt.Sprintf("flow=%d run=%s", flowID, run) }

// maxBatchEvents bounds the event bytes of one record: a region's events
// of a chunk go in records of about this much (one larger event goes
// alone), well under Kafka's default 1 MiB message limit.
const maxBatchEvents = 256 << 10

// RecordEvents is the event bytes a replay's records hold at most (one
// larger event goes alone) for a target whose max.message.bytes is
// maxBatch: 256 KiB from 1,000,000 bytes up (Kafka's default is
// 1,048,588), a quarter of it below, which leaves room for the record's
// encoding (JSON's base64 included) and headers.
func RecordEvents(maxBatch int32) int {
	if maxBatch >= 1_000_000 {
		return maxBatchEvents
	}
	return int(maxBatch / 4)
}

// RecordTooLargeError is a record that the target topic cannot take: a
// batch holding it alone would pass the topic's max.message.bytes.
type RecordTooLargeError struct {
	Topic    string
	Region   uint64
	Events   int   // the events in the record (1: an event too large alone)
	Bytes    int   // the bytes of a batch holding the record alone
	MaxBatch int32 // the topic's max.message.bytes
	Written  int64 // records this run had queued before it
}

func (e *RecordTooLargeError) Error() string {
	what := "an event"
	if e.Events > 1 {
		what = fmt.Sprintf("a record of %d events", e.Events)
	}
	return fmt.Sprintf("%s of region %d needs a record batch of %d bytes, more than the %d bytes the topic %s takes (its max.message.bytes): "+
		"raise the topic's max.message.bytes to at least %d (and the consumers' fetch sizes with it), or pass --max-message-bytes if the topic takes more than its brokers describe; "+
		"the %d records before it are written, and the same command run again resumes after them",
		what, e.Region, e.Bytes, e.MaxBatch, e.Topic, e.Bytes, e.Written)
}

// writer numbers the run's records, skips those an earlier run wrote, and
// sends the rest to the target at the rate allowed.
type writer struct {
	t        Target
	topic    string
	parts    int32
	maxBatch int32 // the target's max.message.bytes
	cut      int   // event bytes per record (RecordEvents)
	written  map[int32]int64
	header   []byte
	json     bool
	lim      *limiter
	seq      int64
	res      *Result
	regions  map[uint64]bool
}

// send writes b as the run's next record.
func (w *writer) send(ctx context.Context, b *event.Batch) error {
	seq := w.seq
	w.seq++
	w.regions[b.RegionID] = true
	key := strconv.AppendUint(nil, b.RegionID, 10)
	p := partition(key, w.parts)
	if last, ok := w.written[p]; ok && seq <= last {
		w.res.Skipped++
		return nil
	}
	var value []byte
	if w.json {
		v, err := event.EncodeBatchJSON(b)
		if err != nil {
			return err
		}
		value = v
	} else {
		value = event.EncodeBatch(make([]byte, 0, encodedBound(b)), b)
	}
	hs := []kgo.RecordHeader{
		{Key: HeaderRun, Value: w.header},
		{Key: HeaderSeq, Value: strconv.AppendInt(nil, seq, 10)},
	}
	if w.json {
		hs = append(hs, kgo.RecordHeader{Key: "content-type", Value: []byte("application/json")})
	}
	r := &kgo.Record{Key: key, Value: value, Partition: p, Headers: hs}
	if n := batchBytes(r); n > int(w.maxBatch) {
		return &RecordTooLargeError{Topic: w.topic, Region: b.RegionID, Events: len(b.Events), Bytes: n, MaxBatch: w.maxBatch, Written: w.res.Records}
	}
	n := recordSize(r)
	if err := w.lim.wait(ctx, n); err != nil {
		return err
	}
	if err := w.t.Produce(ctx, r); err != nil {
		return err
	}
	w.res.Records++
	w.res.Bytes += int64(n)
	return nil
}

// encodedBound is at least the bytes of b's protobuf encoding: the region
// and resolved ts fields, and per event its key and value with their
// tags, lengths and enums.
func encodedBound(b *event.Batch) int {
	n := 2 * (1 + binary.MaxVarintLen64)
	for i := range b.Events {
		n += len(b.Events[i].Key) + len(b.Events[i].Value) + 4*(1+binary.MaxVarintLen64)
	}
	return n
}

// recordBatchOverhead is the bytes of a Kafka record batch (v2) beyond
// its records: base offset, length, epoch, magic, CRC, attributes, last
// offset delta, two timestamps, producer id and epoch, base sequence and
// record count.
const recordBatchOverhead = 61

// batchBytes is the size of a record batch holding r alone, uncompressed,
// as the broker checks it against max.message.bytes (and franz-go before
// sending): the batch's overhead and the record's length, attributes,
// timestamp and offset deltas, key, value and headers, each length a
// varint (counted at its largest for the deltas).
func batchBytes(r *kgo.Record) int {
	n := 1 + binary.MaxVarintLen64 + binary.MaxVarintLen32 + // attributes, timestamp delta, offset delta
		varintLen(len(r.Key)) + len(r.Key) + varintLen(len(r.Value)) + len(r.Value) + varintLen(len(r.Headers))
	for _, h := range r.Headers {
		n += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	return recordBatchOverhead + varintLen(n) + n
}

// varintLen is the bytes of n as a zigzag varint, Kafka's record field
// encoding.
func varintLen(n int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutVarint(b[:], int64(n))
}

// recordSize is the bytes of r the rate counts: key, value and headers.
func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// partition is Kafka's default partitioner for a keyed record (murmur2 of
// the key, positive, modulo the partition count), so that a region's
// records go where any Kafka client would send them.
func partition(key []byte, n int32) int32 {
	return int32((murmur2(key) & 0x7fffffff) % uint32(n))
}

func murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		b = b[4:]
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// sortedRegions returns the keys of m in order.
func sortedRegions(m map[uint64]uint64) []uint64 {
	out := make([]uint64, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}
