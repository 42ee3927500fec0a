package pipeline

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Decompressed bytes are bounded twice (the Kafka client decompresses each
// fetched batch whole before the consume loop sees a record of it, and a
// 13 KB zstd batch can hold 314 MB):
//
//   - per batch: a batch that decompresses to more than --max-batch-bytes
//     is refused with kgo.ErrMaxDecompress, after at most that many bytes
//     were produced. The client stops the partition at the batch and
//     reports *kgo.ErrDecompressTooLarge with its offsets; the consume loop
//     sends the batch to the DLQ as it is stored (bigbatch.go) and moves
//     the partition past it.
//   - per poll: between two polls the consume loop has handled, the
//     batches decompressed may total at most the fetch share of
//     --max-memory (more than two fetches' worth, so a normal load never
//     meets it); a batch past it, unless it is the first, is refused with
//     errFetchBudget, a plain decompression error after which the client
//     fetches the same batch again, later. That bounds what fetches of
//     many batches just under the batch limit can hold.
//
// Refused batches cost their decompression once, as garbage the size of
// the limit at most; nothing of them is kept.
type batchDecompressor struct {
	batchMax int
	budget   int64
	used     atomic.Int64 // bytes admitted since the last reset
	deferred atomic.Int64 // batches refused for the budget, ever
	onDefer  func()       // called for each of them (a counter), may be nil

	zstd sync.Pool // *zstdStream
	gz   sync.Pool // *gzip.Reader
	lz4  sync.Pool // *lz4.Reader
	bufs decompressPool
}

var _ kgo.Decompressor = (*batchDecompressor)(nil)

// errFetchBudget refuses a batch for now: the poll's decompressed bytes
// are spent. The Kafka client fetches it again after the next poll.
var errFetchBudget = errors.New("decompressed fetch budget of --max-memory spent: fetched again after the next poll")

// zstdStream is a pooled streaming zstd decoder and the reader it reads.
type zstdStream struct {
	dec *zstd.Decoder
	src bytes.Reader
}

func newBatchDecompressor(batchMax int, budget int64) (*batchDecompressor, error) {
	d := &batchDecompressor{batchMax: batchMax, budget: budget}
	// One decoder is made now, so that a bad option fails here and not in
	// the Kafka client's fetch path.
	zs, err := d.newZstd()
	if err != nil {
		return nil, err
	}
	d.zstd.Put(zs)
	return d, nil
}

// newZstd is a streaming decoder that decodes in the calling goroutine,
// refuses windows past batchMax and never decodes a whole input at once
// into a buffer of its own (WithDecodeBuffersBelow(0)): readGrow bounds
// the output.
func (d *batchDecompressor) newZstd() (*zstdStream, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(uint64(d.batchMax)), zstd.WithDecodeBuffersBelow(0))
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	return &zstdStream{dec: dec}, nil
}

// reset starts a new budget: the records decompressed before were handled.
func (d *batchDecompressor) reset() { d.used.Store(0) }

// close releases the idle pooled zstd decoders; the others end with the
// garbage collector.
func (d *batchDecompressor) close() {
	for {
		zs, _ := d.zstd.Get().(*zstdStream)
		if zs == nil {
			return
		}
		zs.dec.Close()
	}
}

// Decompress implements kgo.Decompressor. Every refusal but the budget's
// wraps kgo.ErrMaxDecompress: a batch that cannot be decompressed within
// the limit (too large, or corrupt) would fail the same way on every try,
// so the client must stop at it and report its offsets rather than fetch
// it forever.
func (d *batchDecompressor) Decompress(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	if codec == kgo.CodecNone {
		return src, nil
	}
	if d.used.Load() >= d.budget {
		return nil, d.deferBatch()
	}
	out, err := d.decode(src, codec)
	if err != nil {
		if !errors.Is(err, kgo.ErrMaxDecompress) {
			err = fmt.Errorf("%w: %w", kgo.ErrMaxDecompress, err)
		}
		return nil, err
	}
	n := int64(len(out))
	if total := d.used.Add(n); total > d.budget && total != n {
		d.used.Add(-n)
		return nil, d.deferBatch()
	}
	return out, nil
}

func (d *batchDecompressor) deferBatch() error {
	d.deferred.Add(1)
	if d.onDefer != nil {
		d.onDefer()
	}
	return errFetchBudget
}

// errBatchTooLarge is decode's refusal of a batch past batchMax.
var errBatchTooLarge = errors.New("batch decompresses past --max-batch-bytes")

func (d *batchDecompressor) tooLarge() error {
	return fmt.Errorf("%w (%d): %w", errBatchTooLarge, d.batchMax, kgo.ErrMaxDecompress)
}

// decode decompresses src, never producing more than batchMax bytes.
func (d *batchDecompressor) decode(src []byte, codec kgo.CompressionCodecType) ([]byte, error) {
	switch codec {
	case kgo.CodecZstd:
		return d.zstdDecode(src)
	case kgo.CodecGzip:
		r, _ := d.gz.Get().(*gzip.Reader)
		if r == nil {
			r = new(gzip.Reader)
		}
		defer d.gz.Put(r)
		if err := r.Reset(bytes.NewReader(src)); err != nil {
			return nil, err
		}
		return d.readGrow(r, 4*len(src))
	case kgo.CodecLz4:
		r, _ := d.lz4.Get().(*lz4.Reader)
		if r == nil {
			r = lz4.NewReader(nil)
		}
		defer func() { r.Reset(nil); d.lz4.Put(r) }()
		r.Reset(bytes.NewReader(src))
		return d.readGrow(r, 4*len(src))
	case kgo.CodecSnappy:
		return d.snappy(src)
	}
	return nil, fmt.Errorf("unknown compression codec %d", codec)
}

// zstdDecode decodes src with a pooled streaming decoder into readGrow's
// buffer, sized from the frame's declared size when it has one (refused at
// once if that is too large).
func (d *batchDecompressor) zstdDecode(src []byte) ([]byte, error) {
	hint := 4 * len(src)
	var h zstd.Header
	if h.Decode(src) == nil && h.HasFCS {
		if h.FrameContentSize > uint64(d.batchMax) {
			return nil, d.tooLarge()
		}
		hint = int(h.FrameContentSize) + 1 // room to read the end
	}
	zs, _ := d.zstd.Get().(*zstdStream)
	if zs == nil {
		var err error
		if zs, err = d.newZstd(); err != nil {
			return nil, err
		}
	}
	defer func() {
		_ = zs.dec.Reset(nil) // let go of src
		zs.src.Reset(nil)
		d.zstd.Put(zs)
	}()
	zs.src.Reset(src)
	if err := zs.dec.Reset(&zs.src); err != nil {
		return nil, d.zstdErr(err)
	}
	out, err := d.readGrow(zs.dec, hint)
	return out, d.zstdErr(err)
}

// zstdErr makes a window the decoder refuses a batch too large.
func (d *batchDecompressor) zstdErr(err error) error {
	if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		return d.tooLarge()
	}
	return err
}

// readGrow reads r to its end into a buffer it grows four times at a time
// from hint, never past batchMax+1 bytes: a batch past batchMax is refused
// having cost at most a quarter more than the limit, and a batch that fits
// at most a third more than its size in copies.
func (d *batchDecompressor) readGrow(r io.Reader, hint int) ([]byte, error) {
	// A pooled buffer may be larger than asked for: reads stop at limit
	// all the same; one of the limit itself is made to size, so that a
	// batch refused costs no more than the limit.
	limit := func(b []byte) int { return min(cap(b), d.batchMax+1) }
	get := func(n int) []byte {
		if n = min(n, d.batchMax+1); n == d.batchMax+1 {
			return make([]byte, 0, n)
		}
		return d.bufs.get(n)
	}
	buf := get(max(hint, 4<<10))
	for {
		if len(buf) == limit(buf) {
			if len(buf) > d.batchMax {
				return nil, d.tooLarge()
			}
			grown := get(limit(buf) * 4)[:len(buf)]
			copy(grown, buf)
			d.bufs.put(buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):limit(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if len(buf) > d.batchMax {
				return nil, d.tooLarge()
			}
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// xerialMagic starts the snappy framing of the Java client: the magic,
// then a version and a compatible version (4 bytes each), then blocks of
// a 4-byte big-endian length and a raw snappy block.
var xerialMagic = []byte{130, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

// snappy decodes a raw snappy block or xerial-framed blocks, reading each
// block's decoded length before it allocates anything for it.
func (d *batchDecompressor) snappy(src []byte) ([]byte, error) {
	if !bytes.HasPrefix(src, xerialMagic) {
		n, err := s2.DecodedLen(src)
		if err != nil {
			return nil, err
		}
		if n > d.batchMax {
			return nil, d.tooLarge()
		}
		return s2.Decode(d.bufs.get(n)[:n], src)
	}
	if len(src) < len(xerialMagic)+8 {
		return nil, errors.New("snappy: truncated xerial header")
	}
	src = src[len(xerialMagic)+8:]
	// The blocks' decoded lengths first, so that one buffer of their sum
	// takes them all.
	total := 0
	for rest := src; len(rest) > 0; {
		if len(rest) < 4 {
			return nil, errors.New("snappy: truncated xerial block length")
		}
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return nil, errors.New("snappy: xerial block past the end")
		}
		dl, err := s2.DecodedLen(rest[:n])
		if err != nil {
			return nil, err
		}
		if total += dl; total > d.batchMax {
			return nil, d.tooLarge()
		}
		rest = rest[n:]
	}
	out := d.bufs.get(total)
	for len(src) > 0 {
		n := binary.BigEndian.Uint32(src)
		blk := src[4 : 4+n]
		src = src[4+n:]
		dl, _ := s2.DecodedLen(blk)
		out = out[:len(out)+dl]
		if _, err := s2.Decode(out[len(out)-dl:], blk); err != nil {
			return nil, err
		}
	}
	return out, nil
}
