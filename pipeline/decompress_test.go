package pipeline

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// zstdBomb is a zstd frame of n zero bytes, written as a stream (so n
// bytes never exist in memory); with fcs the frame header declares its
// size, as kcat's and the Java client's frames do.
func zstdBomb(t testing.TB, n int64, fcs bool) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if fcs {
		enc.ResetContentSize(&out, n)
	} else {
		enc.Reset(&out)
	}
	zero := make([]byte, 1<<20)
	for left := n; left > 0; {
		k := min(left, int64(len(zero)))
		if _, err := enc.Write(zero[:k]); err != nil {
			t.Fatal(err)
		}
		left -= k
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// compressed is src compressed with codec by the Kafka client's own
// compressor (snappy: raw blocks) or, for xerial, in the Java client's
// framing.
func compressed(t *testing.T, codec string, src []byte) ([]byte, kgo.CompressionCodecType) {
	t.Helper()
	if codec == "xerial" {
		out := append([]byte{}, xerialMagic...)
		out = binary.BigEndian.AppendUint32(out, 1)
		out = binary.BigEndian.AppendUint32(out, 1)
		for len(src) > 0 {
			n := min(len(src), 32<<10)
			blk := s2.EncodeSnappy(nil, src[:n])
			out = binary.BigEndian.AppendUint32(out, uint32(len(blk)))
			out = append(out, blk...)
			src = src[n:]
		}
		return out, kgo.CodecSnappy
	}
	c := map[string]kgo.CompressionCodec{"gzip": kgo.GzipCompression(), "lz4": kgo.Lz4Compression(),
		"snappy": kgo.SnappyCompression(), "zstd": kgo.ZstdCompression()}[codec]
	comp, err := kgo.DefaultCompressor(c)
	if err != nil {
		t.Fatal(err)
	}
	out, typ := comp.Compress(new(bytes.Buffer), src)
	return append([]byte{}, out...), typ
}

// TestBatchDecompressorLimit: in every codec, a batch within
// --max-batch-bytes decompresses exactly, and one past it is refused with
// kgo.ErrMaxDecompress (which the client reports with the batch's
// offsets).
func TestBatchDecompressorLimit(t *testing.T) {
	src := bytes.Repeat([]byte("flowlog event "), 3<<20/14) // ~3 MiB
	for _, codec := range []string{"gzip", "lz4", "snappy", "xerial", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			comp, typ := compressed(t, codec, src)
			big, err := newBatchDecompressor(4<<20, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			defer big.close()
			got, err := big.Decompress(comp, typ)
			if err != nil || !bytes.Equal(got, src) {
				t.Fatalf("within the limit: %d bytes, %v; want the %d compressed", len(got), err, len(src))
			}
			small, err := newBatchDecompressor(1<<20, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			defer small.close()
			if got, err := small.Decompress(comp, typ); !errors.Is(err, kgo.ErrMaxDecompress) {
				t.Fatalf("past the limit: %d bytes, %v; want ErrMaxDecompress", len(got), err)
			}
		})
	}
}

// TestBatchDecompressorBomb: a 314 MB zstd frame of a few KB, with and
// without a declared size, is refused having allocated about the batch
// limit, not its 314 MB.
func TestBatchDecompressorBomb(t *testing.T) {
	const limit = 16 << 20
	for _, fcs := range []bool{false, true} {
		bomb := zstdBomb(t, 314_000_000, fcs)
		d, err := newBatchDecompressor(limit, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err = d.Decompress(bomb, kgo.CodecZstd)
		runtime.ReadMemStats(&after)
		d.close()
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("zstd bomb (declared size %v): %d bytes on the wire, refused after allocating %.1f MiB", fcs, len(bomb), float64(alloc)/(1<<20))
		if !errors.Is(err, kgo.ErrMaxDecompress) {
			t.Errorf("bomb (declared size %v): %v, want ErrMaxDecompress", fcs, err)
		}
		if alloc > 4*limit {
			t.Errorf("bomb (declared size %v): allocated %.1f MiB, want about the %d MiB limit at most", fcs, float64(alloc)/(1<<20), limit>>20)
		}
	}
}

// TestBatchDecompressorBudget: between two resets the batches admitted
// total at most the budget, except that the first batch is always
// admitted; a refused batch is errFetchBudget, not too large, and is
// admitted after the reset.
func TestBatchDecompressorBudget(t *testing.T) {
	src := bytes.Repeat([]byte{7}, 3<<20)
	comp, typ := compressed(t, "zstd", src)
	d, err := newBatchDecompressor(8<<20, 5<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	if _, err := d.Decompress(comp, typ); err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if _, err := d.Decompress(comp, typ); !errors.Is(err, errFetchBudget) || errors.Is(err, kgo.ErrMaxDecompress) {
		t.Fatalf("second batch past the budget: %v, want errFetchBudget", err)
	}
	d.reset()
	if _, err := d.Decompress(comp, typ); err != nil {
		t.Fatalf("batch after the reset: %v", err)
	}
	big, _ := compressed(t, "zstd", bytes.Repeat([]byte{7}, 7<<20))
	d.reset()
	if _, err := d.Decompress(big, typ); err != nil {
		t.Fatalf("a first batch larger than the budget: %v, want it admitted", err)
	}
	if n := d.deferred.Load(); n != 1 {
		t.Fatalf("%d batches deferred, want 1", n)
	}
	if got, err := d.Decompress([]byte("plain"), kgo.CodecNone); err != nil || string(got) != "plain" {
		t.Fatalf("uncompressed batch: %q %v", got, err)
	}
}

// TestBatchDecompressorCorrupt: compressed records that do not decode are
// refused the way a batch too large is (the client stops at the batch and
// reports its offsets, so the batch goes to the DLQ instead of being
// fetched forever), and classified as corrupt, not too large.
func TestBatchDecompressorCorrupt(t *testing.T) {
	d, err := newBatchDecompressor(1<<20, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	text := make([]byte, 20000)
	for i := range text {
		text[i] = byte(i*7 + i/13)
	}
	good, _ := compressed(t, "zstd", text)
	bad := good[:len(good)-len(good)/3] // cut inside its blocks
	for _, tc := range []struct {
		codec kgo.CompressionCodecType
		src   []byte
	}{{kgo.CodecZstd, bad}, {kgo.CodecGzip, []byte("not gzip")}, {kgo.CodecLz4, []byte("not lz4 at all")}, {kgo.CodecSnappy, []byte{0xff, 0xff, 0xff}}} {
		_, err := d.Decompress(tc.src, tc.codec)
		if !errors.Is(err, kgo.ErrMaxDecompress) || errors.Is(err, errBatchTooLarge) {
			t.Errorf("codec %d, corrupt input: %v; want ErrMaxDecompress, not too large", tc.codec, err)
		}
	}
}

// TestDecompressPoolSizes: a pooled buffer holds at least what was asked
// and at most a quarter more (from 4 KiB on), and a buffer given back
// serves only requests it can hold.
func TestDecompressPoolSizes(t *testing.T) {
	var p decompressPool
	for _, n := range []int{1, 4 << 10, 4<<10 + 1, 5000, 100_000, 1 << 20, 1<<20 + 1, 3 << 20} {
		b := p.get(n)
		if len(b) != 0 || cap(b) < n || (n >= 4<<10 && cap(b) > n+n/4) {
			t.Errorf("get(%d): len %d cap %d, want empty with cap in [n, 1.25n]", n, len(b), cap(b))
		}
		p.put(b)
	}
	for _, c := range []int{4 << 10, 6000, 1 << 20, 1<<20 + 100} {
		p.put(make([]byte, 7, c))
		for _, n := range []int{c - 1, c, c + 1} {
			if b := p.get(n); cap(b) < n || len(b) != 0 {
				t.Errorf("after put(cap %d), get(%d): len %d cap %d", c, n, len(b), cap(b))
			}
		}
	}
}

// TestDecompressIntoReusedBuffer: in every codec, a batch decompressed
// into a buffer that held a larger batch before is exactly its own bytes.
// The buffers are kept in sync.Pools, which may drop any of them (at a
// collection, and at random under the race detector), so the batches are
// decompressed again until a buffer was reused, up to 100 times.
func TestDecompressIntoReusedBuffer(t *testing.T) {
	large := bytes.Repeat([]byte("the batch before "), 200_000/17)
	small := bytes.Repeat([]byte("this batch "), 120_000/11)
	for _, codec := range []string{"gzip", "lz4", "snappy", "xerial", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			d, err := newBatchDecompressor(4<<20, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			defer d.close()
			for round := 0; round < 3 || round < 100 && d.bufs.reused.Load() == 0; round++ {
				for _, src := range [][]byte{large, small} {
					comp, typ := compressed(t, codec, src)
					got, err := d.Decompress(comp, typ)
					if err != nil || !bytes.Equal(got, src) {
						t.Fatalf("%d bytes: got %d bytes, %v", len(src), len(got), err)
					}
					d.PutDecompressBytes(got)
				}
			}
			if d.bufs.reused.Load() == 0 {
				t.Errorf("no buffer reused in %d gets", d.bufs.gets.Load())
			}
		})
	}
}

// TestRecycledRecordsGiveBuffersBack: a client with the decompressor as
// its pool gives each compressed batch's buffer back once every record of
// it is recycled, as the consume loop does after handling a record.
func TestRecycledRecordsGiveBuffersBack(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("t"),
		kgo.ProducerBatchCompression(kgo.SnappyCompression()), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const batches, perBatch = 5, 40
	for range batches {
		recs := make([]*kgo.Record, perBatch)
		for i := range recs {
			recs[i] = &kgo.Record{Value: bytes.Repeat([]byte{byte(i)}, 1000)}
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	d, err := newBatchDecompressor(4<<20, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	cons, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("t"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithDecompressor(d), kgo.WithPools(d))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := 0
	for got < batches*perBatch && ctx.Err() == nil {
		fs := cons.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Value) != 1000 || r.Value[999] != byte(r.Offset%perBatch) {
				t.Errorf("record %d: %d bytes ending %d", r.Offset, len(r.Value), r.Value[len(r.Value)-1])
			}
			got++
			r.Recycle()
		})
	}
	if got != batches*perBatch {
		t.Fatalf("consumed %d records of %d", got, batches*perBatch)
	}
	if gets, puts := d.bufs.gets.Load(), d.bufs.puts.Load(); gets < batches || puts != gets {
		t.Errorf("%d buffers taken for %d batches, %d given back: want every one back", gets, batches, puts)
	}
}
