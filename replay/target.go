package replay

import (
	"bytes"
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

// KafkaTarget writes to a topic with franz-go's idempotent producer:
// records of a partition are written in order and once, across retries,
// and a failure fails every later record of the partition with it. Its
// record batches are franz-go's default at most, about 1 MB, which Kafka's
// default max.message.bytes takes: a record with an event larger than
// that fails the replay (the records hold about 256 KiB of events each).
type KafkaTarget struct {
	cl    *kgo.Client
	opts  []kgo.Opt
	topic string
	mu    sync.Mutex
	err   error
}

// deliveryTimeout is how long a record may wait to be written before the
// replay fails: a target broker that is gone ends the run with an error
// (and a re-run resumes) instead of leaving it waiting for good.
var deliveryTimeout = 2 * time.Minute

// NewKafkaTarget connects to the brokers opts name, producing to topic
// with at most maxBuffered bytes of records queued. A record not written
// within 2 minutes fails the run, unless opts set their own
// kgo.RecordDeliveryTimeout.
func NewKafkaTarget(topic string, maxBuffered int64, opts ...kgo.Opt) (*KafkaTarget, error) {
	all := append([]kgo.Opt{kgo.RecordDeliveryTimeout(deliveryTimeout)}, opts...)
	all = append(all, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MaxBufferedBytes(int(maxBuffered)), kgo.RequiredAcks(kgo.AllISRAcks()))
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return &KafkaTarget{cl: cl, opts: opts, topic: topic}, nil
}

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
