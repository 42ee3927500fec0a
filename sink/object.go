package sink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// ObjectWriter builds a data object: chunks back to back, each the framed
// entries of one temp file, stored as is ("none") or as one zstd frame
// ("zstd"). It tracks the object's size and CRC32C for the upload. It is not
// safe for concurrent use.
//
// A zstd chunk borrows an encoder from a small shared pool for the time it
// is written, so the encoders in memory are as many as chunks being written
// at once (the flows being built), not one per object.
type ObjectWriter struct {
	w           countingWriter
	compression string
	buf         []byte
}

// NewObjectWriter returns an ObjectWriter writing to w with the given chunk
// compression, CompressionNone or CompressionZstd.
func NewObjectWriter(w io.Writer, compression string) (*ObjectWriter, error) {
	o := &ObjectWriter{w: countingWriter{w: w}, compression: compression}
	switch compression {
	case CompressionNone:
		o.buf = make([]byte, 256<<10)
	case CompressionZstd:
	default:
		return nil, fmt.Errorf("unknown compression %q (want %q or %q)", compression, CompressionNone, CompressionZstd)
	}
	return o, nil
}

// AddChunk appends one chunk holding all of framed and returns where it
// landed: its offset and stored length in the object and its uncompressed
// length. After an error the object is unusable.
func (o *ObjectWriter) AddChunk(framed io.Reader) (offset, length, rawLength int64, err error) {
	offset = o.w.n
	if o.compression == CompressionNone {
		rawLength, err = io.CopyBuffer(&o.w, framed, o.buf)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("add chunk: %w", err)
		}
		return offset, rawLength, rawLength, nil
	}
	enc, err := getEncoder()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("add chunk: %w", err)
	}
	defer putEncoder(enc)
	enc.Reset(&o.w)
	rawLength, err = enc.ReadFrom(framed)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("add chunk: compress: %w", err)
	}
	if err := enc.Close(); err != nil {
		return 0, 0, 0, fmt.Errorf("add chunk: compress: %w", err)
	}
	return offset, o.w.n - offset, rawLength, nil
}

// zstdEncWindow is the window of the frames ObjectWriter writes. A chunk is
// one temp file, mostly far smaller; a window of 1 MiB loses next to no
// ratio against 8 MiB at the fastest level and keeps an encoder near 2.5 MiB
// (history of twice the window, match table, block buffers) instead of
// 17 MiB. (WithLowerEncoderMem would save another MiB for about 10% of
// speed.)
const zstdEncWindow = 1 << 20

// idleEncoders keeps up to 8 encoders between chunks: enough for the flows
// a flush cycle builds at once, and kept across garbage collections (a
// sync.Pool empties in two), so a busy consumer does not allocate encoders
// over and over.
var idleEncoders = make(chan *zstd.Encoder, 8)

func getEncoder() (*zstd.Encoder, error) {
	select {
	case enc := <-idleEncoders:
		return enc, nil
	default:
	}
	return newEncoder(1)
}

func newEncoder(concurrency int) (*zstd.Encoder, error) {
	// No frame checksum (xxhash64): every chunk's meta carries the sha256
	// of its uncompressed bytes, which restore and verify check, and the
	// upload carries the object's CRC32C.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(concurrency),
		zstd.WithWindowSize(zstdEncWindow), zstd.WithEncoderCRC(false))
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	return enc, nil
}

// putEncoder returns enc to the idle encoders, or drops it if enough are
// idle. It drops the encoder's reference to the last writer first.
func putEncoder(enc *zstd.Encoder) {
	enc.Reset(nil)
	select {
	case idleEncoders <- enc:
	default:
	}
}

// frameEncoders is how many AppendZstdFrame calls compress at once; more
// wait their turn.
const frameEncoders = 4

// frameEncoder compresses the zstd frames of AppendZstdFrame. EncodeAll is
// safe for concurrent use, with one encoder state (up to about 2.5 MiB)
// per call in progress, at most frameEncoders.
var frameEncoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return newEncoder(frameEncoders)
})

// AppendZstdFrame appends src to dst as one zstd frame, with the settings
// of ObjectWriter's chunks (fastest level, 1 MiB window, no frame
// checksum), and returns the extended slice. A chunk may be a run of such
// frames back to back: a zstd stream of several frames decodes to their
// contents in order, which is what OpenChunk and every zstd reader do. An
// empty src gives a frame of no content.
func AppendZstdFrame(dst, src []byte) ([]byte, error) {
	enc, err := frameEncoder()
	if err != nil {
		return dst, err
	}
	return enc.EncodeAll(src, dst), nil
}

// Size is the number of bytes written so far.
func (o *ObjectWriter) Size() int64 { return o.w.n }

// CRC32C is the CRC32C of the bytes written so far.
func (o *ObjectWriter) CRC32C() uint32 { return o.w.crc }

type countingWriter struct {
	w   io.Writer
	n   int64
	crc uint32
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.crc = UpdateCRC32C(c.crc, p[:n])
	return n, err
}

// ChecksumError reports a chunk whose bytes do not match its meta: wrong
// stored length, undecodable zstd frame, wrong raw length, wrong sha256, or
// entries that do not frame.
type ChecksumError struct {
	Object string // data object name
	Chunk  int    // index in the meta's files, or -1 if unknown
	Offset int64  // chunk offset in the object
	Want   string
	Got    string
	Err    error // decoding error, if any
}

func (e *ChecksumError) Error() string {
	chunk := fmt.Sprintf("chunk at offset %d", e.Offset)
	if e.Chunk >= 0 {
		chunk = fmt.Sprintf("chunk %d (offset %d)", e.Chunk, e.Offset)
	}
	if e.Err != nil {
		return fmt.Sprintf("corrupt %s of %s: %v", chunk, e.Object, e.Err)
	}
	return fmt.Sprintf("corrupt %s of %s: want %s, got %s", chunk, e.Object, e.Want, e.Got)
}

// Unwrap returns the decoding error, if any.
func (e *ChecksumError) Unwrap() error { return e.Err }

// zstdWindow is the largest window a chunk reader accepts (ObjectWriter
// writes zstdEncWindow): a frame declaring a larger one (a tampered object
// can declare gigabytes in a few bytes) fails before the decoder allocates
// it.
const zstdWindow = 8 << 20

// zstdMaxMemory caps what a decoder may allocate for one frame; for the
// streaming reads here it is a second bound on the window.
const zstdMaxMemory = 64 << 20

var decoders = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(zstdWindow), zstd.WithDecoderMaxMemory(zstdMaxMemory))
	if err != nil {
		panic(fmt.Sprintf("zstd decoder: %v", err)) // only fails on bad options
	}
	return d
}}

// ReadChunk reads chunk f of the data object dataPath with one range read,
// decompresses it, and checks its length and sha256. A mismatch is a
// *ChecksumError naming the object and chunk.
func ReadChunk(ctx context.Context, b Bucket, dataPath string, f FileMeta) ([]byte, error) {
	return readChunk(ctx, b, dataPath, -1, f)
}

func readChunk(ctx context.Context, b Bucket, dataPath string, index int, f FileMeta) ([]byte, error) {
	r, err := OpenChunk(ctx, b, dataPath, index, f)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// raw_length comes from the meta: it sizes no allocation beyond a
	// modest head start; the buffer grows with the bytes really read.
	out := bytes.NewBuffer(make([]byte, 0, min(f.RawLength+1, 16<<20)))
	if _, err := out.ReadFrom(r); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// OpenChunk streams chunk index (its position in the meta's files, or -1)
// of the data object dataPath, decompressed. The reader returns a
// *ChecksumError instead of io.EOF if the chunk's length or sha256 does not
// match f; only a reader that reached io.EOF has delivered verified bytes.
// At most f.RawLength+1 decompressed bytes are ever produced, and a zstd
// frame may not need a window over 8 MiB.
func OpenChunk(ctx context.Context, b Bucket, dataPath string, index int, f FileMeta) (io.ReadCloser, error) {
	if err := f.checkSizes(); err != nil {
		return nil, &ChecksumError{Object: dataPath, Chunk: index, Offset: f.Offset, Err: err}
	}
	rc, err := b.GetRange(ctx, dataPath, f.Offset, f.Length)
	if err != nil {
		return nil, fmt.Errorf("read chunk %d of %s: %w", index, dataPath, err)
	}
	c := &chunkReader{rc: rc, path: dataPath, index: index, f: f, h: sha256.New()}
	c.stored = &countReader{r: rc}
	c.r = c.stored
	if f.Compression == CompressionZstd {
		d := decoders.Get().(*zstd.Decoder)
		if err := d.Reset(c.stored); err != nil {
			decoders.Put(d)
			rc.Close()
			return nil, c.corrupt(err)
		}
		c.dec = d
		c.r = d
	}
	c.r = io.LimitReader(c.r, f.RawLength+1)
	return c, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

type chunkReader struct {
	rc     io.ReadCloser
	stored *countReader
	dec    *zstd.Decoder
	r      io.Reader
	path   string
	index  int
	f      FileMeta
	h      hash.Hash
	raw    int64
	err    error
}

func (c *chunkReader) corrupt(err error) error {
	return &ChecksumError{Object: c.path, Chunk: c.index, Offset: c.f.Offset, Err: err}
}

func (c *chunkReader) mismatch(what, want, got string) error {
	return &ChecksumError{Object: c.path, Chunk: c.index, Offset: c.f.Offset, Want: what + " " + want, Got: got}
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	c.raw += int64(n)
	c.h.Write(p[:n])
	switch {
	case err == nil:
		if c.raw > c.f.RawLength {
			c.err = c.mismatch("raw length", fmt.Sprint(c.f.RawLength), "more")
			return n, c.err
		}
		return n, nil
	case errors.Is(err, io.EOF):
		c.err = c.finish()
		return n, c.err
	default:
		if c.dec != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && c.stored.n > 0 {
			if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
				err = fmt.Errorf("frame declares a window over the %d MiB limit: %w", zstdWindow>>20, err)
			}
			c.err = c.corrupt(fmt.Errorf("zstd: %w", err))
		} else {
			c.err = fmt.Errorf("read chunk %d of %s: %w", c.index, c.path, err)
		}
		return n, c.err
	}
}

func (c *chunkReader) finish() error {
	if c.dec != nil {
		// Drain the frame's end so a truncated or padded chunk is noticed.
		if _, err := io.Copy(io.Discard, c.stored); err != nil {
			return fmt.Errorf("read chunk %d of %s: %w", c.index, c.path, err)
		}
	}
	if c.stored.n != c.f.Length {
		return c.mismatch("length", fmt.Sprint(c.f.Length), fmt.Sprint(c.stored.n))
	}
	if c.raw != c.f.RawLength {
		return c.mismatch("raw length", fmt.Sprint(c.f.RawLength), fmt.Sprint(c.raw))
	}
	if got := hex.EncodeToString(c.h.Sum(nil)); got != c.f.SHA256 {
		return c.mismatch("sha256", c.f.SHA256, got)
	}
	return io.EOF
}

func (c *chunkReader) Close() error {
	if c.dec != nil {
		_ = c.dec.Reset(nil)
		decoders.Put(c.dec)
		c.dec = nil
	}
	return c.rc.Close()
}
