package pipeline

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/flowlog/flowlog/sink"
)

// Packing raw runs (docs/SIZING.md, "Many small temp files: open files,
// cycle size, memory"). A compressed temp file writes a zstd frame for each
// full 32 KiB buffer, on the drain's workers. A buffer it writes before it is full (the open-buffer cap takes
// it for another file, or the generation is sealed) would be a small frame
// of its own: with thousands of regions, most buffers go out small, and a
// zstd frame of a few KiB costs about twice the CPU per byte of a full one
// (the entropy tables are built per frame) and a write(2). Such a buffer is
// written raw instead, as a raw run of the file, and once the cycle is
// frozen the flusher packs each file's consecutive raw runs into frames of
// up to 32 KiB, written to the cycle's pack segment (g<gen>.pack): a file's
// chunk is then its frames in order, some in the generation's segment and
// some in the pack segment, and it holds as few frames as its bytes allow.
// The raw runs count twice against --max-temp-bytes (generation.diskCost),
// for their bytes and their frames.
//
// A chunk of at most tinyChunk bytes, all of them raw, is stored as it is,
// uncompressed (its file meta says compression "none"): with thousands of
// tables and regions most chunks hold an event or two, and a zstd frame of
// a few hundred bytes saves almost nothing (its header and tables eat what
// it gains) for the CPU, the read and the write it costs.
const tinyChunk = 2 << 10

// packFiles compresses the raw runs of a frozen cycle's sealed files into
// frames (see above), on up to drainWorkers goroutines, and leaves every
// file with its stored length and CRC32C. Each generation segment gets one
// pack segment, g<gen>.pack beside it. A failed read or write is
// ErrTempWrite.
func packFiles(files []*tempFile) error {
	var todo []*tempFile
	segs := map[*segment]*segment{} // generation segment -> its pack segment
	for _, tf := range files {
		if tf.raw > 0 && tf.raw == tf.stored && tf.raw <= tinyChunk {
			tf.keepRaw()
		}
		if tf.raw > 0 && segs[tf.seg] == nil {
			segs[tf.seg] = newSegment(strings.TrimSuffix(tf.seg.path, ".seg")+".pack", tf.seg.spares)
		}
		if tf.raw > 0 {
			todo = append(todo, tf)
		} else {
			tf.crc = extentsCRC(tf.ext)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	srcs := map[*segment]*os.File{}
	for seg := range segs {
		src, err := os.Open(seg.path)
		if err != nil {
			return fmt.Errorf("%w: open temp segment: %w", ErrTempWrite, err)
		}
		defer src.Close()
		srcs[seg] = src
	}
	errs := make([]error, len(todo))
	parallel(len(todo), func(i int) {
		tf := todo[i]
		errs[i] = tf.packRaw(srcs[tf.seg], segs[tf.seg])
	})
	for _, p := range segs {
		if err := p.seal(); err != nil {
			return fmt.Errorf("%w: %w", ErrTempWrite, err)
		}
	}
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("%w: %w", ErrTempWrite, err)
		}
	}
	return nil
}

// rawBufs hold the bytes of a raw run on their way into frames: up to two
// frames' worth.
var rawBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2*tempBufSize); return &b }}

// packRaw replaces each run of consecutive raw extents of t with zstd
// frames of tempBufSize bytes of it (the last one of a run shorter),
// written to dst; src reads t's segment. t's stored length and CRC32C
// become those of its packed chunk.
func (t *tempFile) packRaw(src *os.File, dst *segment) error {
	dst.acquire()
	t.pack = dst
	bp := rawBufs.Get().(*[]byte)
	defer rawBufs.Put(bp)
	fb := frameBufs.Get().(*[]byte)
	defer putFrameBuf(fb)
	out := make([]extent, 0, packedExtents(t.ext))
	t.stored = 0
	buf := (*bp)[:0]
	emit := func(n int) error {
		var err error
		if *fb, err = sink.AppendZstdFrame((*fb)[:0], buf[:n]); err != nil {
			return fmt.Errorf("pack %s: %w", t.name(), err)
		}
		off, err := dst.write(*fb)
		if err != nil {
			return fmt.Errorf("pack %s: %w", t.name(), err)
		}
		out = append(out, extent{packed: true, off: off, len: int64(len(*fb)), crc: sink.CRC32C(*fb)})
		t.stored += int64(len(*fb))
		buf = append(buf[:0], buf[n:]...)
		return nil
	}
	for i, e := range t.ext {
		if !e.raw {
			out = append(out, e)
			t.stored += e.len
			continue
		}
		crc := uint32(0)
		for off := e.off; off < e.off+e.len; {
			n := int(min(e.off+e.len-off, tempBufSize))
			at := len(buf)
			buf = slices.Grow(buf, n)[:at+n]
			if _, err := src.ReadAt(buf[at:], off); err != nil {
				return fmt.Errorf("pack %s: read its raw run: %w", t.name(), err)
			}
			crc = sink.UpdateCRC32C(crc, buf[at:])
			off += int64(n)
			for len(buf) >= tempBufSize {
				if err := emit(tempBufSize); err != nil {
					return err
				}
			}
		}
		if crc != e.crc {
			return fmt.Errorf("pack %s: a raw run reads back other bytes than were written", t.name())
		}
		if last := i+1 == len(t.ext) || !t.ext[i+1].raw; last && len(buf) > 0 {
			if err := emit(len(buf)); err != nil {
				return err
			}
		}
	}
	*bp = buf[:0]
	t.ext, t.raw = out, 0
	t.crc = extentsCRC(out)
	return nil
}

// packedExtents is how many extents packRaw leaves of ext: each extent
// not raw, and a frame for each tempBufSize bytes (or part of them) of
// each run of consecutive raw extents. A wide cycle's files hold dozens of
// raw extents each and a frame or two once packed, and the extents of a
// packed cycle stay in memory until its commit.
func packedExtents(ext []extent) int {
	n := 0
	var raw int64
	for i, e := range ext {
		if !e.raw {
			n++
			continue
		}
		raw += e.len
		if i+1 == len(ext) || !ext[i+1].raw {
			n += int((raw + tempBufSize - 1) / tempBufSize)
			raw = 0
		}
	}
	return n
}

// keepRaw makes t's raw runs its stored bytes, uncompressed: t is a tiny
// chunk all of whose bytes are raw runs.
func (t *tempFile) keepRaw() {
	for i := range t.ext {
		t.ext[i].raw = false
	}
	t.zstd, t.raw = false, 0
	t.crc = extentsCRC(t.ext)
}

// extentsCRC is the CRC32C of the extents' bytes in order.
func extentsCRC(ext []extent) uint32 {
	var crc uint32
	for _, e := range ext {
		crc = sink.CombineCRC32C(crc, e.crc, e.len)
	}
	return crc
}
