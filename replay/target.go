package replay

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Record headers of a replay (docs/FORMAT.md, "Replay records").
const (
	// HeaderRun names the run: "flow=<flow id> run=<run id>".
	HeaderRun = "flowlog-replay"
	// HeaderSeq is the record's sequence number in the run's output,
	// decimal, from 0.
	HeaderSeq = "flowlog-replay-seq"
)

// Target is where a replay writes: one topic.
type Target interface {
	// Partitions returns the topic's partition count.
	Partitions(ctx context.Context) (int32, error)
	// MaxBatchBytes is the largest record batch the topic takes (Kafka's
	// max.message.bytes): a record is written only if a batch holding it
	// alone is at most this large.
	MaxBatchBytes() int32
	// Written returns, per partition, the highest HeaderSeq among the
	// topic's records whose HeaderRun is run (absent: none).
	Written(ctx context.Context, run string) (map[int32]int64, error)
	// Produce queues r for its partition (r.Partition). Records of one
	// partition are written in the order queued, each once: a record
	// fails only with every record queued after it for the partition.
	// It returns the first failure of an earlier record, if any.
	Produce(ctx context.Context, r *kgo.Record) error
	// Flush waits until every queued record is written, and returns the
	// first failure.
	Flush(ctx context.Context) error
}

// KafkaTargetConfig is what a KafkaTarget writes to, and how much it
// holds.
type KafkaTargetConfig struct {
	// Topic is the topic written to; it must exist.
	Topic string
	// MaxBuffered bounds the bytes of records queued (ProducerMemory).
	MaxBuffered int64
	// MaxMessageBytes is the largest record batch the topic takes (0:
	// the topic's max.message.bytes as the brokers describe it, which is
	// the broker's message.max.bytes when the topic does not set its
	// own).
	MaxMessageBytes int32
	// Compression is the record batches' codec: none, gzip, snappy, lz4
	// or zstd (empty: snappy, franz-go's default).
	Compression string
}

// Compressions are the codecs a KafkaTarget takes, by name.
var Compressions = map[string]kgo.CompressionCodec{
	"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(), "snappy": kgo.SnappyCompression(),
	"lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
}

// KnownCompression reports whether name is one of Compressions.
func KnownCompression(name string) bool {
	_, ok := Compressions[name]
	return ok
}

// ErrCompression marks a compression name a KafkaTarget does not take.
var ErrCompression = errors.New("unknown compression: want none, gzip, snappy, lz4 or zstd")

// KafkaTarget writes to a topic with franz-go's idempotent producer:
// records of a partition are written in order and once, across retries,
// and a failure fails every later record of the partition with it. Its
// record batches are as large as the topic takes (max.message.bytes, read
// from the brokers unless configured), so that a replay carries every
// event the source topic carried: a record holds about 256 KiB of events,
// or one larger event alone.
type KafkaTarget struct {
	cl       *kgo.Client
	opts     []kgo.Opt
	topic    string
	maxBatch int32
	mu       sync.Mutex
	err      error
}

// deliveryTimeout is how long a record may wait to be written before the
// replay fails: a target broker that is gone ends the run with an error
// (and a re-run resumes) instead of leaving it waiting for good.
var deliveryTimeout = 2 * time.Minute

// minBatchBytes is the smallest max.message.bytes a target takes: the
// producer's own floor.
const minBatchBytes = 512

// NewKafkaTarget connects to the brokers opts name, producing to
// cfg.Topic with at most cfg.MaxBuffered bytes of records queued, in
// batches of at most cfg.MaxMessageBytes (0: it describes the topic's
// max.message.bytes). A record not written within 2 minutes fails the
// run, unless opts set their own kgo.RecordDeliveryTimeout.
func NewKafkaTarget(ctx context.Context, cfg KafkaTargetConfig, opts ...kgo.Opt) (*KafkaTarget, error) {
	maxBatch := cfg.MaxMessageBytes
	if maxBatch == 0 {
		n, err := describeMaxMessageBytes(ctx, cfg.Topic, opts)
		if err != nil {
			return nil, err
		}
		maxBatch = n
	}
	if maxBatch < minBatchBytes {
		return nil, fmt.Errorf("topic %s: max message bytes %d: the producer takes at least %d", cfg.Topic, maxBatch, minBatchBytes)
	}
	codec, ok := Compressions[cmp.Or(cfg.Compression, "snappy")]
	if !ok {
		return nil, fmt.Errorf("compression %q: %w", cfg.Compression, ErrCompression)
	}
	all := append([]kgo.Opt{kgo.RecordDeliveryTimeout(deliveryTimeout)}, opts...)
	all = append(all, kgo.DefaultProduceTopic(cfg.Topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(codec),
		kgo.MaxBufferedBytes(int(cfg.MaxBuffered)), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(maxBatch), kgo.BrokerMaxWriteBytes(max(100<<20, maxBatch+64<<10)))
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &KafkaTarget{cl: cl, opts: opts, topic: cfg.Topic, maxBatch: maxBatch}, nil
}

// describeMaxMessageBytes reads topic's max.message.bytes: the topic's
// own, or the broker default it falls back to.
func describeMaxMessageBytes(ctx context.Context, topic string, opts []kgo.Opt) (int32, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err == nil && len(rcs) == 1 {
		err = rcs[0].Err
	}
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return 0, fmt.Errorf("topic %s does not exist: create it first (its partition count decides where each region's records go)", topic)
	case err != nil:
		return 0, fmt.Errorf("topic %s: describe its max.message.bytes (or pass --max-message-bytes): %w", topic, err)
	case len(rcs) != 1:
		return 0, fmt.Errorf("topic %s: describe its max.message.bytes: %d answers (or pass --max-message-bytes)", topic, len(rcs))
	}
	for _, c := range rcs[0].Configs {
		if c.Key != "max.message.bytes" {
			continue
		}
		n, err := strconv.ParseInt(c.MaybeValue(), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("topic %s: max.message.bytes %q: %w", topic, c.MaybeValue(), err)
		}
		return int32(n), nil
	}
	return 0, fmt.Errorf("topic %s: the brokers do not describe its max.message.bytes: pass --max-message-bytes", topic)
}

// MaxBatchBytes implements Target.
func (t *KafkaTarget) MaxBatchBytes() int32 { return t.maxBatch }

func cloneOpts(o []kgo.Opt) []kgo.Opt { return append([]kgo.Opt{}, o...) }

// Close closes the client; call Flush first.
func (t *KafkaTarget) Close() { t.cl.Close() }

// Partitions implements Target.
func (t *KafkaTarget) Partitions(ctx context.Context) (int32, error) {
	td, err := kadm.NewClient(t.cl).ListTopics(ctx, t.topic)
	if err != nil {
		return 0, fmt.Errorf("topic %s: %w", t.topic, err)
	}
	d, ok := td[t.topic]
	switch {
	case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
		return 0, fmt.Errorf("topic %s does not exist: create it first (its partition count decides where each region's records go)", t.topic)
	case d.Err != nil:
		return 0, fmt.Errorf("topic %s: %w", t.topic, d.Err)
	}
	return int32(len(d.Partitions)), nil
}

// Written implements Target: it reads each partition's tail, a window
// that doubles back from the end until it holds a record of run or
// reaches the start.
func (t *KafkaTarget) Written(ctx context.Context, run string) (map[int32]int64, error) {
	adm := kadm.NewClient(t.cl)
	starts, err := adm.ListStartOffsets(ctx, t.topic)
	if err != nil {
		return nil, fmt.Errorf("topic %s start offsets: %w", t.topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, t.topic)
	if err != nil {
		return nil, fmt.Errorf("topic %s end offsets: %w", t.topic, err)
	}
	out := map[int32]int64{}
	type span struct{ from, start, end int64 }
	todo := map[int32]span{}
	ends.Each(func(o kadm.ListedOffset) {
		s, _ := starts.Lookup(t.topic, o.Partition)
		if o.Offset > s.Offset {
			todo[o.Partition] = span{start: s.Offset, end: o.Offset, from: max(s.Offset, o.Offset-1024)}
		}
	})
	for len(todo) > 0 {
		spans := make(map[int32][2]int64, len(todo))
		for p, s := range todo {
			spans[p] = [2]int64{s.from, s.end}
		}
		found, err := t.scan(ctx, run, spans)
		if err != nil {
			return nil, err
		}
		for p, s := range todo {
			if seq, ok := found[p]; ok {
				out[p] = seq
				delete(todo, p)
				continue
			}
			if s.from == s.start {
				delete(todo, p)
				continue
			}
			n := (s.end - s.from) * 4
			s.end, s.from = s.from, max(s.start, s.from-n)
			todo[p] = s
		}
	}
	return out, nil
}

// tailIdle is how long a tail scan waits for more records of a span.
const tailIdle = 5 * time.Second

// scan reads the offsets [from, end) of each partition and returns the
// highest seq of run in each.
func (t *KafkaTarget) scan(ctx context.Context, run string, spans map[int32][2]int64) (map[int32]int64, error) {
	offs := map[int32]kgo.Offset{}
	for p, s := range spans {
		offs[p] = kgo.NewOffset().At(s[0])
	}
	opts := append(cloneOpts(t.opts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{t.topic: offs}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	found := map[int32]int64{}
	left := len(spans)
	done := map[int32]bool{}
	for left > 0 {
		// A span may end in offsets that hold no record to deliver (a
		// transaction marker, a compacted gap): a poll that brings nothing
		// for tailIdle ends the scan.
		pctx, cancel := context.WithTimeout(ctx, tailIdle)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if fs.NumRecords() == 0 && pctx.Err() != nil {
			break
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = fmt.Errorf("read partition %d of %s: %w", p, t.topic, err)
			}
		})
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			s := spans[r.Partition]
			if done[r.Partition] || r.Offset >= s[1] {
				return
			}
			if seq, ok := runSeq(r, run); ok {
				if cur, had := found[r.Partition]; !had || seq > cur {
					found[r.Partition] = seq
				}
			}
			if r.Offset+1 >= s[1] {
				done[r.Partition] = true
				left--
			}
		})
	}
	return found, nil
}

// runSeq returns r's sequence number if r is a record of run.
func runSeq(r *kgo.Record, run string) (int64, bool) {
	var (
		mine bool
		seq  int64 = -1
	)
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderRun:
			mine = bytes.Equal(h.Value, []byte(run))
		case HeaderSeq:
			if n, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
				seq = n
			}
		}
	}
	return seq, mine && seq >= 0
}

// Produce implements Target.
func (t *KafkaTarget) Produce(ctx context.Context, r *kgo.Record) error {
	if err := t.failed(); err != nil {
		return err
	}
	t.cl.Produce(ctx, r, func(r *kgo.Record, err error) {
		if err != nil {
			t.mu.Lock()
			if t.err == nil {
				t.err = fmt.Errorf("produce to partition %d of %s: %w", r.Partition, t.topic, err)
			}
			t.mu.Unlock()
		}
	})
	return nil
}

func (t *KafkaTarget) failed() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Flush implements Target.
func (t *KafkaTarget) Flush(ctx context.Context) error {
	if err := t.cl.Flush(ctx); err != nil {
		return err
	}
	return t.failed()
}
