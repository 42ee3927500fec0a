package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flowlog/flowlog/event"
)

// A batch the client cannot decompress within --max-batch-bytes (or at
// all) stops its partition: the client reports *kgo.ErrDecompressTooLarge
// with the batch's offsets and fetches nothing more there until told where
// to go on. No record of the batch was decoded, so none can be looked at
// alone; the batch goes to the DLQ as a whole, as the broker stores it:
//
//   - the DLQ record's value is the Kafka v2 record batch exactly as the
//     broker returned it (batch header and compressed records), its key is
//     empty, and its content-type is event.ContentTypeRecordBatch;
//   - flowlog-source-offset is the batch's first offset, and
//     flowlog-batch-next-offset the offset after its last record, so the
//     DLQ record accounts for every offset it skips;
//     flowlog-batch-records is its record count;
//   - the reason is batch_too_large (decompresses past --max-batch-bytes)
//     or batch_corrupt (its compressed records do not decode).
//
// A batch too large for the DLQ topic goes there truncated like any DLQ
// record (original length and sha256 in the headers). Only once the DLQ
// acknowledged it does the partition move past the batch: its offsets are
// then committed with the cycle like those of any record handled, so
// nothing is lost and the partition never stays stuck.
const (
	reasonBatchTooLarge = "batch_too_large"
	reasonBatchCorrupt  = "batch_corrupt"
	// reasonTooLarge is a record, or an event of it, past --max-value-size.
	reasonTooLarge = "too_large"
)

// skipBatch sends the batch e reports to the DLQ and moves ps past it.
// Must hold s.mu; released while Kafka answers.
func (s *session) skipBatch(ctx context.Context, ps *partState, e *kgo.ErrDecompressTooLarge) error {
	c := s.c
	if ps.next > e.Offset {
		// Handled past the batch's start already (a stale report): go on
		// from where the partition stands.
		s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{e.Topic: {e.Partition: {Epoch: -1, Offset: ps.next}}})
		return nil
	}
	if ps.next >= 0 && ps.next < e.Offset {
		// Records before the batch were not handled yet: fetch them again.
		s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{e.Topic: {e.Partition: {Epoch: -1, Offset: ps.next}}})
		return nil
	}
	s.mu.Unlock()
	raw, records, err := s.fetchRawBatch(ctx, e)
	s.mu.Lock()
	if err != nil {
		return err
	}
	reason, detail := s.classifyBatch(raw)
	if raw == nil {
		detail = "the batch is no longer in the topic (retention or a truncated log): its records are lost upstream"
	}
	r := &kgo.Record{Topic: e.Topic, Partition: e.Partition, Offset: e.Offset, Value: raw, Headers: []kgo.RecordHeader{
		{Key: event.HeaderContentType, Value: []byte(event.ContentTypeRecordBatch)},
		{Key: event.HeaderBatchNextOffset, Value: strconv.AppendInt(nil, e.NextOffset, 10)},
		{Key: event.HeaderBatchRecords, Value: strconv.AppendInt(nil, int64(records), 10)},
	}}
	if err := s.toDLQ(ctx, r, records, reason, errors.New(detail)); err != nil {
		return err
	}
	if ps.cycleFrom < 0 {
		ps.cycleFrom = e.Offset
	}
	ps.next = e.NextOffset
	s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{e.Topic: {e.Partition: {Epoch: e.Epoch, Offset: e.NextOffset}}})
	c.progress.Store(time.Now().UnixNano())
	return nil
}

// classifyBatch decodes raw's records within the same limit the client
// used, to say why the client refused it.
func (s *session) classifyBatch(raw []byte) (reason, detail string) {
	if raw == nil {
		return reasonBatchTooLarge, ""
	}
	var b kmsg.RecordBatch
	if err := b.ReadFrom(raw); err != nil {
		return reasonBatchCorrupt, fmt.Sprintf("record batch: %v", err)
	}
	_, err := s.dec.decode(b.Records, kgo.CompressionCodecType(b.Attributes&0x07))
	switch {
	case errors.Is(err, errBatchTooLarge):
		return reasonBatchTooLarge, fmt.Sprintf("%d records in %d bytes decompress past --max-batch-bytes (%d)", b.NumRecords, len(raw), s.dec.batchMax)
	case err != nil:
		return reasonBatchCorrupt, fmt.Sprintf("%d records in %d bytes do not decompress: %v", b.NumRecords, len(raw), err)
	}
	return reasonBatchTooLarge, fmt.Sprintf("%d records in %d bytes refused by the client's decompressor", b.NumRecords, len(raw))
}

// fetchRawBatch reads the batch at e.Offset from the partition's leader as
// stored, without decompressing it, and returns it with its record count;
// a nil batch means it is no longer in the topic. It retries until the
// batch is read or ctx ends: skipping it unread would lose it.
func (s *session) fetchRawBatch(ctx context.Context, e *kgo.ErrDecompressTooLarge) ([]byte, int, error) {
	backoff := 100 * time.Millisecond
	for {
		raw, n, err := rawBatch(ctx, s.cl, s.adm, e.Topic, e.Partition, e.Offset)
		if err == nil {
			return raw, n, nil
		}
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		s.c.log.Warn("reading a batch the client could not decompress failed; retrying before it goes to the DLQ",
			"topic", e.Topic, "partition", e.Partition, "offset", e.Offset, "err", err)
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// rawBatch fetches the first record batch at offset of topic/partition
// from its leader, asking for as few bytes as the protocol allows (a
// broker returns at least one whole batch).
func rawBatch(ctx context.Context, cl *kgo.Client, adm *kadm.Client, topic string, partition int32, offset int64) ([]byte, int, error) {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return nil, 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		return nil, 0, fmt.Errorf("metadata of %s: %v", topic, td.Err)
	}
	pd, ok := td.Partitions[partition]
	if !ok || pd.Err != nil || pd.Leader < 0 {
		return nil, 0, fmt.Errorf("leader of %s/%d: %v", topic, partition, pd.Err)
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = -1, 0, 1, 1
	req.SessionEpoch = -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, td.ID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = partition, offset, 1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl.Broker(int(pd.Leader)))
	if err != nil {
		return nil, 0, fmt.Errorf("fetch %s/%d@%d: %w", topic, partition, offset, err)
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return nil, 0, fmt.Errorf("fetch %s/%d@%d: answer for %d topics", topic, partition, offset, len(resp.Topics))
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		if errors.Is(err, kerr.OffsetOutOfRange) {
			return nil, 0, nil
		}
		return nil, 0, fmt.Errorf("fetch %s/%d@%d: %w", topic, partition, offset, err)
	}
	for b := p.RecordBatches; len(b) >= 12; {
		first := int64(binary.BigEndian.Uint64(b))
		size := 12 + int64(binary.BigEndian.Uint32(b[8:]))
		if size > int64(len(b)) {
			break // a partial batch at the end of the answer
		}
		if first == offset {
			var rb kmsg.RecordBatch
			if err := rb.ReadFrom(b[:size]); err != nil {
				return nil, 0, fmt.Errorf("fetch %s/%d@%d: %w", topic, partition, offset, err)
			}
			return append([]byte(nil), b[:size]...), int(rb.NumRecords), nil
		}
		b = b[size:]
	}
	return nil, 0, fmt.Errorf("fetch %s/%d@%d: no whole batch starting there in %d bytes", topic, partition, offset, len(p.RecordBatches))
}
