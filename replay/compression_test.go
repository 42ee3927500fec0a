package replay_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/replay"
)

// Each --compression codec is what the target's record batches carry,
// and the records read back as written; an unknown name is refused
// before any connection.
func TestTargetCompression(t *testing.T) {
	want := map[string]uint8{"": 2, "none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
	for name, codec := range want {
		t.Run("codec="+name, func(t *testing.T) {
			c := kafka(t, 1, "out")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tg, err := replay.NewKafkaTarget(ctx, replay.KafkaTargetConfig{Topic: "out", MaxBuffered: 1 << 20, Compression: name},
				kgo.SeedBrokers(c.ListenAddrs()...))
			if err != nil {
				t.Fatal(err)
			}
			defer tg.Close()
			value := bytes.Repeat([]byte("compressible "), 200)
			for range 3 {
				if err := tg.Produce(ctx, &kgo.Record{Partition: 0, Value: value}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tg.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			var got []*kgo.Record
			for len(got) < 3 && ctx.Err() == nil {
				cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, r) })
			}
			if len(got) != 3 {
				t.Fatalf("read %d records back, want 3 (%v)", len(got), ctx.Err())
			}
			for _, r := range got {
				if !bytes.Equal(r.Value, value) {
					t.Fatalf("record at %d reads back %d bytes, not the %d written", r.Offset, len(r.Value), len(value))
				}
				if ct := r.Attrs.CompressionType(); ct != codec {
					t.Fatalf("record at %d is in a batch of compression type %d, want %d", r.Offset, ct, codec)
				}
			}
		})
	}
	_, err := replay.NewKafkaTarget(context.Background(), replay.KafkaTargetConfig{Topic: "out", MaxBuffered: 1 << 20,
		MaxMessageBytes: 1 << 20, Compression: "brotli"}, kgo.SeedBrokers("127.0.0.1:1"))
	if !errors.Is(err, replay.ErrCompression) {
		t.Fatalf("compression brotli: %v, want ErrCompression", err)
	}
}
