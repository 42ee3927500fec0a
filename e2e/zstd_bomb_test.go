package e2e

import (
	"bytes"
	"context"
	be "encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// bombValueBytes is the zero-filled value of each bomb event: the 314 MB
// ApplyBatch of the attack, which zstd makes a few KB.
const bombValueBytes = 314_000_000

// zstdFrame compresses b as one zstd frame.
func zstdFrame(t testing.TB, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

// zeroFrame is a zstd frame of n zero bytes, written as a stream so that
// the n bytes never exist in memory.
func zeroFrame(t testing.TB, n int64) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	for left := n; left > 0; left -= int64(len(zero)) {
		if _, err := enc.Write(zero[:min(left, int64(len(zero)))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// bombBatch is a Kafka v2 record batch of n records, zstd-compressed,
// each record an ApplyBatch of one event whose value is bombValueBytes
// zeros, keyed by region. The compressed records are concatenated zstd
// frames (valid zstd): per record one small frame of its framing and the
// shared frame of its zeros, so no record is ever built in memory.
func bombBatch(t testing.TB, zeros []byte, region uint64, n int) []byte {
	t.Helper()
	key := event.AppendDataKey(nil, event.RowKey(1, int64(region)), event.ComposeTS(time.Now().UnixMilli(), 0))
	// ApplyEvent{key, value}: the value's bytes follow its length.
	ev := append([]byte{0x0a}, be.AppendUvarint(nil, uint64(len(key)))...)
	ev = append(ev, key...)
	ev = append(ev, 0x12)
	ev = be.AppendUvarint(ev, bombValueBytes)
	evLen := uint64(len(ev)) + bombValueBytes
	apply := be.AppendUvarint([]byte{0x08}, region)
	apply = append(apply, 0x1a)
	apply = be.AppendUvarint(apply, evLen)
	apply = append(apply, ev...) // the zeros follow
	valueLen := int64(len(apply)) + bombValueBytes
	rkey := []byte(strconv.FormatUint(region, 10))
	var records []byte
	for i := range n {
		var body []byte
		body = append(body, 0)                 // attributes
		body = be.AppendVarint(body, 0)        // timestamp delta
		body = be.AppendVarint(body, int64(i)) // offset delta
		body = be.AppendVarint(body, int64(len(rkey)))
		body = append(body, rkey...)
		body = be.AppendVarint(body, valueLen)
		body = append(body, apply...)
		rec := be.AppendVarint(nil, int64(len(body))+bombValueBytes+1) // + zeros + headers count
		rec = append(rec, body...)
		records = append(records, zstdFrame(t, rec)...)
		records = append(records, zeros...)
		records = append(records, zstdFrame(t, []byte{0})...) // no headers
	}
	now := time.Now().UnixMilli()
	b := kmsg.RecordBatch{
		FirstOffset: 0, PartitionLeaderEpoch: -1, Magic: 2, Attributes: int16(kgo.CodecZstd),
		LastOffsetDelta: int32(n - 1), FirstTimestamp: now, MaxTimestamp: now,
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: int32(n), Records: records,
	}
	raw := b.AppendTo(nil)
	be.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))
	be.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	return raw
}

// produceRaw appends batch to partition p of topic as it is, through the
// partition's leader, and returns the batch's base offset.
func produceRaw(ctx context.Context, t testing.TB, cl *kgo.Client, topic string, p int32, batch []byte) int64 {
	t.Helper()
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 30_000
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic, rt.TopicID = topic, md.Topics[topic].ID
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition, rp.Records = p, batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("produce a raw batch: %v", err)
	}
	part := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(part.ErrorCode); err != nil {
		t.Fatalf("produce a raw batch: %v", err)
	}
	return part.BaseOffset
}

// TestHostileZstdBomb: zstd bombs on the apply topic, between two loads
// of the flow: 60 batches of one 314 MB record each (a few KB on the wire),
// and one batch of 100 such records, all in partition 0 and produced
// before the consumer starts, so that its fetches hold many of them. The
// consumer, at its default --max-memory (128 MiB) and --max-batch-bytes
// (16 MiB), keeps its RSS under the 192 MiB bound throughout (a watchdog
// kills it past), sends each bomb batch to the DLQ whole (reason
// batch_too_large; value the batch as stored; its offsets in the
// headers), backs up both loads exactly once, and commits every offset,
// the bombs' included. A record of 9 MB, past --max-value-size (8 MiB)
// once decompressed, goes to the DLQ as too_large.
func TestHostileZstdBomb(t *testing.T) {
	if os.Getenv("FLOWLOG_E2E_RACE") == "1" {
		t.Skip("FLOWLOG_E2E_RACE=1: a race-detector consumer's RSS says nothing about its memory bound")
	}
	const (
		partitions = 2
		single     = 60
		inOne      = 100
	)
	c := startCluster(t, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	before := faultLoad(3000, 2405, time.Date(2026, 6, 4, 10, 0, 0, 0, time.UTC))
	after := faultLoad(3000, 2406, time.Date(2026, 6, 4, 11, 0, 0, 0, time.UTC))
	want := faultExpect(before, after)
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(before)...)...)

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Broker.Addr), kgo.ProducerBatchMaxBytes(16<<20),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerLinger(0),
		// The broker validates each bomb by decompressing it: on a busy
		// machine that takes longer than the client's default 10 s past
		// the request's own timeout.
		kgo.RequestTimeoutOverhead(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	zeros := zeroFrame(t, bombValueBytes)
	type span struct{ from, to int64 }
	var bombs []span
	one := bombBatch(t, zeros, 9001, 1)
	for range single {
		off := produceRaw(ctx, t, cl, testenv.ApplyTopic, 0, one)
		bombs = append(bombs, span{off, off + 1})
	}
	hundred := bombBatch(t, zeros, 9002, inOne)
	off := produceRaw(ctx, t, cl, testenv.ApplyTopic, 0, hundred)
	bombs = append(bombs, span{off, off + inOne})
	// A record past --max-value-size once decompressed (9 MB of zeros,
	// kilobytes on the wire).
	big := event.EncodeBatch(nil, &event.Batch{RegionID: 9003, Events: []event.Event{{
		Key: event.AppendDataKey(nil, event.RowKey(1, 1), event.ComposeTS(time.Now().UnixMilli(), 0)), Value: make([]byte, 9<<20),
	}}})
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: testenv.ApplyTopic, Partition: 0, Key: []byte("9003"), Value: big}).FirstErr(); err != nil {
		t.Fatalf("produce a 9 MB record: %v", err)
	}
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(after)...)...)
	t.Logf("%d bomb batches of %d B and one of %d B (%d records of %d MB each) in partition 0",
		single, len(one), len(hundred), inOne, bombValueBytes/1_000_000)

	adm := newAdmin(t, c.Broker.Addr)
	end := map[int32]int64{}
	endOffsets(ctx, t, adm).Each(func(o kadm.ListedOffset) { end[o.Partition] = o.Offset })
	adm.Close()

	cons := c.startConsumer(t, "bomb-1", "--max-memory", "128MiB")
	dog := watchRSS(t, cons, memoryBound)
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	start := time.Now()
	waitForOrStop(t, 3*time.Minute, func() (bool, string, error) {
		if over := dog.killed.Load(); over > 0 {
			return false, "", fmt.Errorf("RSS %.1f MiB passed the %d MiB bound: the watchdog killed the consumer", float64(over)/(1<<20), memoryBound>>20)
		}
		if cons.hasExited() {
			return false, "", errors.New("the consumer exited")
		}
		for p, e := range end {
			if o, _, err := store.Offset(ctx, testenv.ApplyTopic, p); err != nil || o != e {
				return false, fmt.Sprintf("partition %d: Redis offset %d (%v), end %d", p, o, err, e), nil
			}
		}
		return true, "", nil
	})
	took := time.Since(start)
	dog.halt()
	mem, err := peakRSS(cons)
	if err != nil {
		t.Fatal(err)
	}
	faultCheckBackup(t, c, want, time.Minute)
	t.Logf("every offset committed in %v; VmHWM %.1f MiB (largest VmRSS sample %.1f MiB) against a bound of %d MiB",
		took.Round(time.Millisecond), float64(mem.peak)/(1<<20), float64(dog.peak.Load())/(1<<20), memoryBound>>20)
	if mem.peak >= memoryBound {
		t.Errorf("consumer VmHWM %.1f MiB, want under %d MiB", float64(mem.peak)/(1<<20), memoryBound>>20)
	}

	recs := consumeAll(t, c.Broker.Addr, testenv.DLQTopic, len(bombs)+1)
	got := map[span]bool{}
	tooLarge := 0
	for _, r := range recs {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		from, _ := strconv.ParseInt(h[event.HeaderSourceOffset], 10, 64)
		if strings.HasPrefix(h[event.HeaderError], "too_large") {
			tooLarge++
			continue
		}
		to, _ := strconv.ParseInt(h[event.HeaderBatchNextOffset], 10, 64)
		s := span{from, to}
		var b kmsg.RecordBatch
		switch {
		case !strings.HasPrefix(h[event.HeaderError], "batch_too_large"):
			t.Errorf("DLQ record at %d: reason %q, want batch_too_large", from, h[event.HeaderError])
		case h[event.HeaderContentType] != event.ContentTypeRecordBatch:
			t.Errorf("DLQ record at %d: content-type %q", from, h[event.HeaderContentType])
		case b.ReadFrom(r.Value) != nil || int64(b.NumRecords) != to-from || h[event.HeaderBatchRecords] != strconv.Itoa(int(b.NumRecords)):
			t.Errorf("DLQ record at %d: value of %d bytes is not the batch of offsets [%d, %d) (records header %q)", from, len(r.Value), from, to, h[event.HeaderBatchRecords])
		}
		got[s] = true
	}
	for _, s := range bombs {
		if !got[s] {
			t.Errorf("no DLQ record for the bomb batch at offsets [%d, %d)", s.from, s.to)
		}
	}
	if len(got) != len(bombs) || tooLarge != 1 {
		t.Errorf("DLQ holds %d batch records and %d too_large records; want %d and 1", len(got), tooLarge, len(bombs))
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
