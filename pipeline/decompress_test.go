package pipeline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
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
