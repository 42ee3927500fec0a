package e2e

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// produceLoad publishes cfg's load to the apply topic the way `producer
// load` does (keyed by region, binary ApplyBatch values) through a client
// with opts, e.g. a compression codec; part, if not nil, picks each
// region's partition.
func produceLoad(t *testing.T, brokers string, cfg loadgen.Config, part func(region uint64) int32, opts ...kgo.Opt) {
	t.Helper()
	base := []kgo.Opt{kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(testenv.ApplyTopic)}
	if part != nil {
		base = append(base, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var failed error
	g := loadgen.New(cfg)
	for b, ok := g.Next(); ok; b, ok = g.Next() {
		r := &kgo.Record{Key: strconv.AppendUint(nil, b.RegionID, 10), Value: event.EncodeBatch(nil, b)}
		if part != nil {
			r.Partition = part(b.RegionID)
		}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil && failed == nil {
				failed = err
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatalf("produce the load: %v", err)
	}
	if failed != nil {
		t.Fatalf("produce the load: %v", failed)
	}
}

// setTopicConfig sets key=value on topic.
func setTopicConfig(t *testing.T, brokers, topic, key, value string) {
	t.Helper()
	adm := newAdmin(t, brokers)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: key, Value: kadm.StringPtr(value)}}, topic)
	if err == nil {
		err = res[0].Err
	}
	if err != nil {
		t.Fatalf("set %s=%s on %s: %v", key, value, topic, err)
	}
}

// TestCompressedApplyTopic backs up a load from an apply topic whose
// batches are zstd- or snappy-compressed: the producer compresses them and
// the topic's compression.type is the same codec (Apache Kafka recompresses
// to it whatever a producer sends; kfake stores what it got). Every event
// is stored exactly once, the offsets reach the end, and the fetched
// batches carry the codec.
func TestCompressedApplyTopic(t *testing.T) {
	for i, tc := range []struct {
		codec string
		kgo   kgo.CompressionCodec
		attr  uint8 // compression bits of a record batch's attributes
	}{
		{"zstd", kgo.ZstdCompression(), 4},
		{"snappy", kgo.SnappyCompression(), 2},
	} {
		t.Run(tc.codec, func(t *testing.T) {
			const partitions = 4
			c := startCluster(t, partitions)
			setTopicConfig(t, c.Broker.Addr, testenv.ApplyTopic, "compression.type", tc.codec)
			load := faultLoad(20_000, int64(2001+i), time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC))
			want := faultExpect(load)
			runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
			produceLoad(t, c.Broker.Addr, load, nil, kgo.ProducerBatchCompression(tc.kgo))

			cons := c.startConsumer(t, "consumer-"+tc.codec)
			got, dup := faultCheckBackup(t, c, want, 2*time.Minute)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", meta.NewStore(c.Redis.Client(t), "flowlog", nil), partitions)
			recs := consumeAll(t, c.Broker.Addr, testenv.ApplyTopic, expectLoad(load).records)
			for _, r := range recs {
				if got := r.Attrs.CompressionType(); got != tc.attr {
					t.Fatalf("record at %d/%d fetched from a batch of compression %d, want %d (%s)", r.Partition, r.Offset, got, tc.attr, tc.codec)
				}
			}
			t.Logf("%s apply topic: %d events of the flow backed up in %d chunks (%d duplicates)", tc.codec, want.total, got.chunks, dup)
			if err := cons.Stop(); err != nil {
				t.Errorf("consumer exit after SIGTERM: %v", err)
			}
		})
	}
}

// deleteRecords removes every record of partition p of the apply topic
// (DeleteRecords to its end offset), as retention does, and returns the
// new start offset.
func deleteRecords(t *testing.T, brokers string, p int32) int64 {
	t.Helper()
	adm := newAdmin(t, brokers)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	end, ok := endOffsets(ctx, t, adm).Lookup(testenv.ApplyTopic, p)
	if !ok {
		t.Fatalf("no end offset for partition %d", p)
	}
	var del kadm.Offsets
	del.AddOffset(testenv.ApplyTopic, p, end.Offset, -1)
	resp, err := adm.DeleteRecords(ctx, del)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete records of partition %d: %v", p, err)
	}
	start, err := adm.ListStartOffsets(ctx, testenv.ApplyTopic)
	if err == nil {
		err = start.Error()
	}
	if err != nil {
		t.Fatalf("start offsets: %v", err)
	}
	s, _ := start.Lookup(testenv.ApplyTopic, p)
	if s.Offset != end.Offset {
		t.Fatalf("partition %d: start offset %d after DeleteRecords to %d", p, s.Offset, end.Offset)
	}
	return s.Offset
}

// TestEmptiedPartition: retention (DeleteRecords) empties one apply
// partition twice, once before any consumer read it and once while the
// consumer is stopped after it had committed an offset there, so that its
// offset in Redis lies below the partition's new start. Neither stalls the
// checkpoint, and reading resumes at the new start: the loads on the other
// partitions, the records read before the second deletion and those
// written after it are backed up exactly once, the offsets reach the ends,
// and the deleted records are gone from the backup (retention took them
// before anyone read them: docs/TESTING.md, "What behaves differently on
// Apache Kafka").
func TestEmptiedPartition(t *testing.T) {
	const (
		partitions = 4
		emptied    = 3 // the partition retention empties
	)
	c := startCluster(t, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", faultFlow, "--tables", "1,2")
	// Region r is keyed to partition r-1 mod 4, always: a region that
	// moved partitions would hold its old partition's checkpoint back.
	byRegion := func(region uint64) int32 { return int32((region - 1) % partitions) }
	load := func(events, regions int, seed int64, hour int) loadgen.Config {
		return loadgen.Config{Events: events, Tables: []int64{1, 2, 3}, Regions: regions, Seed: seed,
			StartTime: time.Date(2026, 6, 2, hour, 0, 0, 0, time.UTC)}
	}
	// Records on the emptied partition with events of table 1 that must
	// never reach the backup.
	lost := load(20, 1, 2101, 9)
	produceLoad(t, c.Broker.Addr, lost, func(uint64) int32 { return emptied })
	deleteRecords(t, c.Broker.Addr, emptied)

	first := load(10_000, 3, 2102, 10) // regions 1-3: partitions 0-2
	produceLoad(t, c.Broker.Addr, first, byRegion)
	cons := c.startConsumer(t, "consumer-1")
	faultCheckBackup(t, c, faultExpect(first), 2*time.Minute)

	// Region 4 speaks on the emptied partition: the consumer reads it and
	// commits there.
	kept := load(4_000, 4, 2103, 11)
	produceLoad(t, c.Broker.Addr, kept, byRegion)
	faultCheckBackup(t, c, faultExpect(first, kept), 2*time.Minute)
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	committed, _, err := store.Offset(ctx, testenv.ApplyTopic, emptied)
	if err != nil || committed == 0 {
		t.Fatalf("Redis offset of partition %d: %d (%v), want above 0", emptied, committed, err)
	}
	if err := cons.Stop(); err != nil {
		t.Fatalf("consumer exit after SIGTERM: %v", err)
	}

	// While it is stopped, records arrive there and retention takes them.
	gone := load(500, 1, 2104, 12)
	produceLoad(t, c.Broker.Addr, gone, func(uint64) int32 { return emptied })
	start := deleteRecords(t, c.Broker.Addr, emptied)
	if start <= committed {
		t.Fatalf("start offset %d of partition %d not past the committed %d", start, emptied, committed)
	}
	last := load(10_000, 3, 2105, 13) // region 4 is silent; its partition has nothing to read
	produceLoad(t, c.Broker.Addr, last, byRegion)
	cons = c.startConsumer(t, "consumer-2")
	faultCheckBackup(t, c, faultExpect(first, kept, last), 2*time.Minute)
	// Region 4 speaks again: the consumer reads the emptied partition from
	// its new start on.
	back := load(4_000, 4, 2106, 14)
	produceLoad(t, c.Broker.Addr, back, byRegion)
	got, dup := faultCheckBackup(t, c, faultExpect(first, kept, last, back), 2*time.Minute)
	adm := newAdmin(t, c.Broker.Addr)
	defer adm.Close()
	ends := endOffsets(ctx, t, adm)
	for p := range int32(partitions) {
		end, _ := ends.Lookup(testenv.ApplyTopic, p)
		waitFor(t, time.Minute, func() (bool, string) {
			r, ok, err := store.Offset(ctx, testenv.ApplyTopic, p)
			return err == nil && ok && r == end.Offset,
				fmt.Sprintf("partition %d: Redis offset %d (set %v, %v), end offset %d", p, r, ok, err, end.Offset)
		})
	}
	t.Logf("emptied partition: %d events of the flow backed up in %d chunks (%d duplicates); the %d deleted records' events absent",
		faultExpect(first, kept, last, back).total, got.chunks, dup, expectLoad(gone).records)
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
