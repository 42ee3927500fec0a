package event

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Entry framing of temp files and backup chunks (docs/FORMAT.md, "Entry
// framing"):
// [u32 LE key len][key][u32 LE value len][value].
const lenSize = 4

// DefaultMaxEntrySize is EntryReader's default limit on key + value bytes of
// one entry, so that a corrupt length cannot make it allocate gigabytes.
const DefaultMaxEntrySize = 256 << 20

// readChunk bounds how much EntryReader reads (and grows its buffer by) at a
// time, so a corrupt length allocates at most about twice the bytes the
// stream really holds.
const readChunk = 1 << 20

var errFrameTruncated = fmt.Errorf("entry is truncated: %w", io.ErrUnexpectedEOF)

// AppendEntry appends the framed entry (key, value) to dst.
func AppendEntry(dst, key, value []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(key)))
	dst = append(dst, key...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

// EntrySize returns the framed size of the entry (key, value).
func EntrySize(key, value []byte) int {
	return 2*lenSize + len(key) + len(value)
}

// NextEntry splits the first framed entry off b. key and value alias b.
// Truncation is a *DecodeError with Reason "frame" wrapping
// io.ErrUnexpectedEOF.
func NextEntry(b []byte) (key, value, rest []byte, err error) {
	key, b, ok := nextField(b)
	if !ok {
		return nil, nil, nil, decodeErr(ReasonFrame, errFrameTruncated)
	}
	value, b, ok = nextField(b)
	if !ok {
		return nil, nil, nil, decodeErr(ReasonFrame, errFrameTruncated)
	}
	return key, value, b, nil
}

func nextField(b []byte) (field, rest []byte, ok bool) {
	if len(b) < lenSize {
		return nil, nil, false
	}
	n := uint64(binary.LittleEndian.Uint32(b))
	b = b[lenSize:]
	if uint64(len(b)) < n {
		return nil, nil, false
	}
	return b[:n:n], b[n:], true
}

// EntryReader reads framed entries from a stream. It is not safe for
// concurrent use.
type EntryReader struct {
	r   *bufio.Reader
	buf []byte
	max int
	hdr [lenSize]byte
}

// NewEntryReader returns an EntryReader over r, buffering r unless it is a
// *bufio.Reader already, with the DefaultMaxEntrySize limit.
func NewEntryReader(r io.Reader) *EntryReader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	return &EntryReader{r: br, max: DefaultMaxEntrySize}
}

// SetMaxEntrySize sets the limit on key + value bytes of one entry; an
// entry beyond it is a *DecodeError with Reason "frame".
func (r *EntryReader) SetMaxEntrySize(n int) { r.max = n }

// Next returns the next entry. The slices are valid until the next call.
// It returns io.EOF at a clean end of the stream, a *DecodeError with
// Reason "frame" wrapping io.ErrUnexpectedEOF on truncation and one with
// Reason "frame" for an entry beyond the size limit; other read errors are
// returned wrapped.
func (r *EntryReader) Next() (key, value []byte, err error) {
	r.buf = r.buf[:0]
	klen, err := r.readLen(true, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := r.readN(klen); err != nil {
		return nil, nil, err
	}
	vlen, err := r.readLen(false, klen)
	if err != nil {
		return nil, nil, err
	}
	if err := r.readN(vlen); err != nil {
		return nil, nil, err
	}
	return r.buf[:klen:klen], r.buf[klen:], nil
}

// readLen reads a length prefix; first marks the entry's first prefix, where
// a clean EOF ends the stream. used is the entry's bytes read so far.
func (r *EntryReader) readLen(first bool, used int) (int, error) {
	n, err := io.ReadFull(r.r, r.hdr[:])
	if err != nil {
		if first && n == 0 && errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		return 0, r.readErr(err)
	}
	l := uint64(binary.LittleEndian.Uint32(r.hdr[:]))
	if l > uint64(r.max-used) {
		return 0, decodeErr(ReasonFrame, fmt.Errorf("entry exceeds %d bytes", r.max))
	}
	return int(l), nil
}

// readN appends n bytes from the stream to r.buf, growing it a chunk at a
// time.
func (r *EntryReader) readN(n int) error {
	for n > 0 {
		c := min(n, readChunk)
		start := len(r.buf)
		r.buf = growLen(r.buf, c)
		if _, err := io.ReadFull(r.r, r.buf[start:]); err != nil {
			return r.readErr(err)
		}
		n -= c
	}
	return nil
}

func growLen(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), max(2*cap(b), len(b)+n))
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

func (r *EntryReader) readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return decodeErr(ReasonFrame, errFrameTruncated)
	}
	return fmt.Errorf("read entry: %w", err)
}
