package pipeline

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// The data object's reader returns the chunks' extents in order whatever
// their layout in the segments: back to back, with gaps,
// out of order, in two segments, empty, and of no extents; for every
// buffer size.
func TestChunkReaderExtentLayouts(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	segA, segB := newSegment(filepath.Join(dir, "a"), nil), newSegment(filepath.Join(dir, "b"), nil)
	var bytesA, bytesB []byte
	for range 4000 {
		bytesA = append(bytesA, byte(rng.Uint32()))
		bytesB = append(bytesB, byte(rng.Uint32()))
	}
	for _, s := range []struct {
		seg *segment
		b   []byte
	}{{segA, bytesA}, {segB, bytesB}} {
		if _, err := s.seg.write(s.b); err != nil {
			t.Fatal(err)
		}
		if err := s.seg.seal(); err != nil {
			t.Fatal(err)
		}
	}
	// ext is an extent of A, or of B (the file's pack segment) when packed.
	ext := func(off, n int64, packed bool) extent { return extent{off: off, len: n, packed: packed} }
	chunk := func(e ...extent) *tempFile { return &tempFile{seg: segA, pack: segB, ext: e} }
	chunks := []*tempFile{
		chunk(ext(0, 100, false), ext(100, 50, false)),     // back to back
		chunk(ext(150, 30, false)),                         // and on into the next chunk
		chunk(),                                            // no extents
		chunk(ext(180, 0, false), ext(180, 20, false)),     // an empty extent
		chunk(ext(500, 70, false), ext(10, 5, false)),      // a gap, then backwards
		chunk(ext(15, 300, true), ext(315, 1000, true)),    // the other segment
		chunk(ext(570, 1, false)),                          // back to the first
		chunk(ext(571, 2000, false), ext(3990, 10, false)), // to the segment's end
	}
	var want []byte
	for _, c := range chunks {
		for _, e := range c.ext {
			src := bytesA
			if e.packed {
				src = bytesB
			}
			want = append(want, src[e.off:e.off+e.len]...)
		}
	}
	for _, size := range []int{1, 3, 64, 151, 1000, 1 << 16} {
		r := newChunkReader(chunks)
		var got []byte
		buf := make([]byte, size)
		for {
			n, err := r.Read(buf)
			got = append(got, buf[:n]...)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("buffer %d: %v", size, err)
			}
			if n == 0 {
				t.Fatalf("buffer %d: Read returned nothing and no error", size)
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("buffer %d: read %d bytes, want %d (first difference at %d)", size, len(got), len(want), firstDiff(got, want))
		}
	}

	// An extent past the segment's end is an unexpected EOF, not a short
	// object.
	r := newChunkReader([]*tempFile{chunk(ext(3900, 200, false))})
	defer r.Close()
	if _, err := io.ReadAll(r); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("extent past the end: %v, want io.ErrUnexpectedEOF", err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
