package pipeline_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// poisonBatch is a bad-key apply record of about size bytes: one event whose
// key has no ts and whose value fills the record.
func poisonBatch(region uint64, size int) []byte {
	b := &event.Batch{RegionID: region, Events: []event.Event{{
		Key: []byte("tshort"), Value: noise(size - 64), CF: event.CF_CF_WRITE, Op: event.Op_OP_PUT,
	}}}
	return event.EncodeBatch(nil, b)
}

// noise is n incompressible bytes, so that producer compression cannot make
// a large record small.
func noise(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// A record the DLQ topic cannot take whole (a poison pill, larger than its
// max.message.bytes) goes there truncated (docs/FORMAT.md, "DLQ records"), on
// the apply and on the DDL path, and everything after it is backed up: no
// partition stops for good.
func TestPoisonRecordsTooLargeForTheDLQ(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), func(c *pipeline.Config) { c.MaxValueSize = 2 << 20 })
	big := r.kafka.Client(t, kgo.ProducerLinger(0), kgo.ProducerBatchMaxBytes(dlq.MaxRecordBytes))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	produce := func(topic string, key string, v []byte) {
		t.Helper()
		if err := big.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v}).FirstErr(); err != nil {
			t.Fatalf("produce %d bytes to %s: %v", len(v), topic, err)
		}
	}
	r.start()
	id := r.createFlow("poison", 1)

	// 1. 1,040,026 bytes: under the broker's limit, over the client's
	// default batch size. The DLQ takes it whole.
	whole := poisonBatch(1, 1_040_026)
	r.produceBatch(putBatch(1, 1, 0, 5, 0))
	produce(testenv.ApplyTopic, "1", whole)
	r.produceBatch(putBatch(1, 1, 100, 5, 100))
	r.eventually(30*time.Second, func() bool {
		st := r.cons.Status()
		return len(st.Partitions) == 1 && st.Partitions[0].Next == 3
	}, "the first poison handled")

	// 2. With the DLQ topic limited to 64 KiB, the same kind of record and
	// a 1 MB invalid DDL record go there truncated.
	adm := kadm.NewClient(r.kafka.Client(t))
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: kadm.StringPtr("65536")}}, testenv.DLQTopic)
	if err == nil {
		err = res[0].Err
	}
	if err != nil {
		t.Fatalf("limit the DLQ topic: %v", err)
	}
	cut := poisonBatch(2, 1_040_026)
	produce(testenv.ApplyTopic, "2", cut)
	badDDL := []byte(`{"op": "create", "flow": "` + hex.EncodeToString(noise(500_000)) + `"}`)
	produce(testenv.DDLTopic, "poison", badDDL)
	r.produceBatch(putBatch(1, 1, 200, 5, 200))
	id2 := r.createFlow("after_poison", 1) // the DDL path moved past it

	r.eventually(30*time.Second, func() bool {
		st := r.cons.Status()
		return len(st.Partitions) == 1 && st.Partitions[0].Next == 5
	}, "every apply record handled")
	r.flush()
	if _, got := r.entries(id); len(got) != 15 {
		t.Fatalf("flow poison backed up %d entries, want the 15 valid ones", len(got))
	}
	if id2 == id {
		t.Fatalf("flow after the poison DDL has id %d, the same as the first", id2)
	}
	checkOffsetsCommitted(t, r)

	dl := r.kafka.Client(t, kgo.ConsumeTopics(testenv.DLQTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(4<<20))
	var got []*kgo.Record
	for len(got) < 3 && ctx.Err() == nil {
		dl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { got = append(got, rec) })
	}
	if len(got) != 3 {
		t.Fatalf("DLQ has %d records, want 3", len(got))
	}
	bySource := map[string]*kgo.Record{}
	for _, rec := range got {
		bySource[headerOf(rec, event.HeaderSourceTopic)+"@"+headerOf(rec, event.HeaderSourceOffset)] = rec
	}
	check := func(name, source string, orig []byte, truncated bool, reason string) {
		t.Helper()
		rec := bySource[source]
		if rec == nil {
			t.Fatalf("%s: no DLQ record from %s (have %v)", name, source, keys(bySource))
		}
		if !strings.HasPrefix(headerOf(rec, event.HeaderError), reason) {
			t.Errorf("%s: reason %q, want %s", name, headerOf(rec, event.HeaderError), reason)
		}
		if !truncated {
			if string(rec.Value) != string(orig) || headerOf(rec, event.HeaderTruncated) != "" {
				t.Errorf("%s: DLQ value %d bytes (truncated %q), want the whole %d", name, len(rec.Value), headerOf(rec, event.HeaderTruncated), len(orig))
			}
			return
		}
		sum := sha256.Sum256(orig)
		if headerOf(rec, event.HeaderTruncated) != "true" ||
			headerOf(rec, event.HeaderOriginalLength) != strconv.Itoa(len(orig)) ||
			headerOf(rec, event.HeaderOriginalSHA256) != hex.EncodeToString(sum[:]) ||
			string(rec.Value) != string(orig[:event.TruncatedValueMax]) {
			t.Errorf("%s: truncated record: value %d bytes, headers truncated=%q length=%q sha256=%q",
				name, len(rec.Value), headerOf(rec, event.HeaderTruncated), headerOf(rec, event.HeaderOriginalLength), headerOf(rec, event.HeaderOriginalSHA256))
		}
	}
	check("apply, whole", testenv.ApplyTopic+"@1", whole, false, event.ReasonBadKey)
	check("apply, truncated", testenv.ApplyTopic+"@3", cut, true, event.ReasonBadKey)
	check("ddl, truncated", testenv.DDLTopic+"@1", badDDL, true, "ddl_invalid")
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
