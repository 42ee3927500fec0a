package pipeline

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// A generation's temp files (its chunks) do not each have a file on disk:
// they share one segment file, written append-only, and each remembers the
// extents of the segment its frames went to. A chunk of the data object is
// its extents read in order. With thousands of regions a cycle has
// thousands of chunks of a few kilobytes each, and creating a file costs
// about 60 µs on ext4, far more than writing its bytes: at 1,024 regions
// the consumer spent 62% of its CPU in open(2) (file creation, and
// reopening files the open-file cap had closed) and 5% in unlink(2). One
// file per generation also needs one descriptor, whatever --max-open-files
// says; that flag now caps the chunks holding a write buffer.
//
// Segment files are <temp-dir>/g<generation>.seg. A segment is removed when
// the last of its chunks is (the cycle committed, or its partitions were
// lost, or the session failed); it never changes after its generation is
// sealed, so a retried cycle uploads the same bytes.

// extent is a run of bytes of a segment: stored bytes of a chunk (frames,
// or the entries of an uncompressed one), or a raw run of a compressed
// chunk that pack has not compressed yet.
//
// An extent holds no pointer (a cycle of thousands of files under eviction
// has hundreds of thousands of them, which the garbage collector would
// otherwise scan): it is in its file's segment, or in its pack segment
// when packed.
type extent struct {
	off, len int64
	crc      uint32 // CRC32C of its bytes
	raw      bool
	packed   bool // in the file's pack segment (tempFile.pack), not its seg
}

// segOf is the segment holding t's extent e.
func (t *tempFile) segOf(e extent) *segment {
	if e.packed {
		return t.pack
	}
	return t.seg
}

// segWriteBuf is how many bytes a segment gathers before one write(2):
// thousands of small chunks would otherwise cost a system call per frame.
const segWriteBuf = 256 << 10

// segment is the file a generation's chunks write their frames to.
type segment struct {
	path string

	spares *spareFiles // where its file goes when released, and comes from (spare.go)

	mu   sync.Mutex
	f    *os.File // write handle; nil before the first write and after seal
	wbuf []byte   // bytes written but not yet passed to the file
	size int64    // bytes written
	disk int64    // bytes of the file on disk, if more than size: a spare written over
	err  error    // the first failed write: the segment lost bytes, sticky
	refs int      // chunks not yet removed
}

// newSegment is the segment at path; spares may be nil (no file reused).
func newSegment(path string, spares *spareFiles) *segment {
	return &segment{path: path, spares: spares}
}

// acquire counts one more chunk writing to the segment.
func (s *segment) acquire() {
	s.mu.Lock()
	s.refs++
	s.mu.Unlock()
}

// write appends p and returns the offset it was written at. Writes of
// several goroutines (a drain's or pack's workers) are serialized; their
// frames are compressed before. Bytes reach the file in runs of up to
// segWriteBuf (flushLocked), and may be read only once the segment is
// sealed. After a failed write every later one fails too: the file may hold
// part of a run, and the offsets after it are unknown.
func (s *segment) write(p []byte) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	if s.f == nil {
		if err := s.openLocked(); err != nil {
			return 0, err
		}
	}
	off := s.size
	s.size += int64(len(p))
	if len(s.wbuf)+len(p) > segWriteBuf {
		if err := s.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) >= segWriteBuf {
		if _, err := s.f.Write(p); err != nil {
			s.err = fmt.Errorf("write temp segment %s: %w", s.path, err)
			return 0, s.err
		}
		return off, nil
	}
	if s.wbuf == nil {
		s.wbuf = make([]byte, 0, segWriteBuf)
	}
	s.wbuf = append(s.wbuf, p...)
	return off, nil
}

// openLocked opens the segment's file for its first write: a spare written
// over from its start if there is one, else a new file. Must hold s.mu.
func (s *segment) openLocked() error {
	if f, size := s.spares.take(s.path); f != nil {
		s.f, s.disk = f, size
		return nil
	}
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		s.err = fmt.Errorf("create temp segment: %w", err)
		return s.err
	}
	s.f = f
	return nil
}

// flushLocked passes the gathered bytes to the file. Must hold s.mu.
func (s *segment) flushLocked() error {
	if len(s.wbuf) == 0 {
		return nil
	}
	_, err := s.f.Write(s.wbuf)
	s.wbuf = s.wbuf[:0]
	if err != nil {
		s.err = fmt.Errorf("write temp segment %s: %w", s.path, err)
	}
	return s.err
}

// seal writes what is gathered and closes the write handle: the segment
// takes no more writes.
func (s *segment) seal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return s.err
	}
	ferr := s.flushLocked()
	s.wbuf = nil
	if ferr == nil && s.disk > s.size {
		// A spare's bytes past what this segment wrote.
		if err := s.f.Truncate(s.size); err != nil {
			ferr = fmt.Errorf("truncate temp segment %s: %w", s.path, err)
			s.err = ferr
		} else {
			s.disk = 0
		}
	}
	err := s.f.Close()
	s.f = nil
	if err != nil && s.err == nil {
		s.err = fmt.Errorf("close temp segment %s: %w", s.path, err)
	}
	if ferr != nil {
		return ferr
	}
	return s.err
}

// check reports ErrTempWrite if a write failed or the file on disk is not
// as long as what was written to it.
func (s *segment) check() error {
	s.mu.Lock()
	size, werr := s.size, s.err
	s.mu.Unlock()
	if werr != nil {
		return fmt.Errorf("%w: %w", ErrTempWrite, werr)
	}
	if size == 0 {
		return nil
	}
	st, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("%w: temp segment: %w", ErrTempWrite, err)
	}
	if st.Size() != size {
		return fmt.Errorf("%w: temp segment %s: %d bytes on disk, %d written", ErrTempWrite, s.path, st.Size(), size)
	}
	return nil
}

// release counts one chunk less; the last one removes the file, or keeps
// it as a spare for a later segment to write over (spare.go). A chunk
// added afterwards (the generation is still current) starts a new file.
func (s *segment) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refs--; s.refs > 0 {
		return
	}
	if s.f != nil {
		_ = s.f.Close()
		s.f = nil
	}
	s.wbuf = nil
	if s.size > 0 || s.disk > 0 || s.err != nil {
		if s.err != nil || !s.spares.keep(s.path, max(s.size, s.disk)) {
			_ = os.Remove(s.path)
		}
	}
	s.size, s.disk, s.err, s.refs = 0, 0, nil, 0
}

// chunkReader reads chunks' stored bytes one after the other, each from
// its extents, opening a segment for reading when it gets to it: a data
// object streamed from disk. The chunks must be packed (no raw runs).
type chunkReader struct {
	chunks []*tempFile
	ext    int   // extent of chunks[0] being read
	off    int64 // bytes of that extent read
	seg    *segment
	f      *os.File // read handle of seg
}

func newChunkReader(chunks []*tempFile) *chunkReader { return &chunkReader{chunks: chunks} }

// Read fills p from as many chunks as it takes: the upload writes what one
// Read returns as one write to the connection, and with thousands of tables
// and regions most chunks are a few hundred bytes.
func (r *chunkReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := r.readExtent(p[n:])
		n += k
		if err != nil {
			if errors.Is(err, io.EOF) && n > 0 {
				err = nil
			}
			return n, err
		}
	}
	return n, nil
}

// readExtent reads from the current extent, at most its rest.
func (r *chunkReader) readExtent(p []byte) (int, error) {
	for len(r.chunks) > 0 {
		t := r.chunks[0]
		if r.ext == len(t.ext) {
			r.chunks, r.ext, r.off = r.chunks[1:], 0, 0
			continue
		}
		e := t.ext[r.ext]
		if seg := t.segOf(e); r.seg != seg {
			if err := r.Close(); err != nil {
				return 0, err
			}
			f, err := os.Open(seg.path)
			if err != nil {
				return 0, fmt.Errorf("open temp segment: %w", err)
			}
			r.seg, r.f = seg, f
		}
		n := int(min(int64(len(p)), e.len-r.off))
		n, err := r.f.ReadAt(p[:n], e.off+r.off)
		r.off += int64(n)
		if r.off == e.len {
			r.ext, r.off = r.ext+1, 0
			err = nil
		} else if errors.Is(err, io.EOF) {
			err = fmt.Errorf("temp segment %s ends before %d: %w", r.seg.path, e.off+e.len, io.ErrUnexpectedEOF)
		}
		return n, err
	}
	return 0, io.EOF
}

// Close closes the segment being read, if any.
func (r *chunkReader) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.seg, r.f = nil, nil
	return err
}
