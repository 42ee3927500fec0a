package pipeline

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// A generation keeps its files' write buffers within maxOpen full-size
// buffers' bytes however many files it has (4 KiB buffers: 8 files hold
// one under a cap of 1): a file that gave its buffer back takes one again for the next
// append, and what it holds in the end (bytes, entries, sha256) is what was
// appended, in order, stored as is or as zstd frames in the generation's
// segment, with its stored length and CRC32C.
func TestGenerationClosesAndReopensFilesUnderItsCap(t *testing.T) {
	for _, compression := range []string{sink.CompressionNone, sink.CompressionZstd} {
		t.Run(compression, func(t *testing.T) { testGenerationCap(t, compression) })
	}
}

func testGenerationCap(t *testing.T, compression string) {
	const maxOpen, nFiles, rounds = 1, 10, 6
	g := newGeneration(t.TempDir(), 1, maxOpen, compression, nil)
	evicted := false
	flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
	want := map[fileKey][]byte{}
	for round := range rounds {
		for i := range nFiles {
			key := fileKey{partition: 0, flow: 1, table: 1, region: uint64(i), cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}
			tf, err := g.file(key, flow)
			if err != nil {
				t.Fatal(err)
			}
			k := event.AppendDataKey(nil, event.RowKey(1, int64(round*nFiles+i)), uint64(round+1))
			v := []byte(fmt.Sprintf("value %d/%d", round, i))
			if round == 2 && i%3 == 0 {
				v = bytes.Repeat([]byte{byte(i)}, tempBufSize+1) // written past the buffer
			}
			before := tf.size
			if err := tf.append(k, v, uint64(round+1), 0); err != nil {
				t.Fatalf("append round %d file %d: %v", round, i, err)
			}
			g.bytes += tf.size - before
			want[key] = event.AppendEntry(want[key], k, v)
			open, bufs := countOpen(g), bufBytes(g)
			if bufs > maxOpen*tempBufSize || open != g.open || bufs != g.bufs {
				t.Fatalf("round %d file %d: %d files open holding %d bytes of buffers (counted %d and %d), cap %d bytes",
					round, i, open, bufs, g.open, g.bufs, maxOpen*tempBufSize)
			}
			evicted = evicted || open < len(g.files)
		}
	}
	if !evicted {
		t.Fatal("no file gave its buffer back: the test does not exercise the cap")
	}
	var mem int64
	for _, tf := range g.files {
		mem += tf.mem()
	}
	if g.mem != mem || mem < nFiles*fileOverhead {
		t.Fatalf("generation counts %d bytes of file memory, its files hold %d", g.mem, mem)
	}

	// Removing a file (a lost partition) leaves the accounting right.
	lostKey := fileKey{partition: 0, flow: 1, table: 1, region: nFiles - 1, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}
	lost := g.files[lostKey]
	g.bytes -= lost.size
	lost.remove()
	delete(g.files, lostKey)
	delete(want, lostKey)
	if g.mem != mem-lost.mem() || g.open != countOpen(g) {
		t.Fatalf("after remove: mem %d (want %d), open %d (counted %d)", g.mem, mem-lost.mem(), g.open, countOpen(g))
	}
	if got := g.seg.refs; got != nFiles-1 {
		t.Fatalf("segment counts %d files after a remove, want %d", got, nFiles-1)
	}

	files, sealedMem := g.seal()
	if err := packFiles(files); err != nil {
		t.Fatal(err)
	}
	if len(files) != nFiles-1 || sealedMem != g.mem {
		t.Fatalf("seal gave %d files holding %d bytes, want %d files holding %d", len(files), sealedMem, nFiles-1, g.mem)
	}
	var total int64
	for _, tf := range files {
		if tf.active || tf.buf != nil || tf.g != nil {
			t.Fatalf("%s still open or attached after seal", tf.name())
		}
		got := readChunkFile(t, tf)
		sum := sha256.Sum256(got)
		if !bytes.Equal(got, want[tf.key]) || tf.sum != hex.EncodeToString(sum[:]) || tf.size != int64(len(got)) || tf.entries != rounds {
			t.Fatalf("%s: %d bytes on disk (want %d, size says %d), %d entries, sum matches %v",
				tf.name(), len(got), len(want[tf.key]), tf.size, tf.entries, tf.sum == hex.EncodeToString(sum[:]))
		}
		if err := tf.close(); err != nil {
			t.Fatalf("close after seal: %v", err)
		}
		if err := tf.append([]byte("k"), nil, 1, 0); err == nil {
			t.Fatalf("append to a sealed file succeeded")
		}
		total += tf.size
	}
	if total != g.bytes {
		t.Fatalf("sealed files hold %d bytes, generation counted %d", total, g.bytes)
	}
	// The segment goes with the last of its files.
	if _, err := os.Stat(g.seg.path); err != nil {
		t.Fatalf("segment before its files are removed: %v", err)
	}
	for _, tf := range files {
		tf.remove()
	}
	if _, err := os.Stat(g.seg.path); !os.IsNotExist(err) {
		t.Fatalf("segment still there after its files were removed: %v", err)
	}
}

// readChunkFile reads a sealed and packed temp file from its segments as the flusher
// does, checks its stored length and CRC32C, and returns its framed bytes,
// decompressed if it is zstd.
func readChunkFile(t *testing.T, tf *tempFile) []byte {
	t.Helper()
	r := newChunkReader([]*tempFile{tf})
	stored, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if int64(len(stored)) != tf.stored || sink.CRC32C(stored) != tf.crc {
		t.Fatalf("%s: %d bytes, CRC32C %08x on disk; file says %d, %08x", tf.name(), len(stored), sink.CRC32C(stored), tf.stored, tf.crc)
	}
	if !tf.zstd {
		return stored
	}
	d, err := zstd.NewReader(bytes.NewReader(stored))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	raw, err := io.ReadAll(d)
	if err != nil {
		t.Fatalf("%s: decompress: %v", tf.name(), err)
	}
	return raw
}

// bufBytes is the capacity of the write buffers g's files hold.
func bufBytes(g *generation) int64 {
	var n int64
	for _, tf := range g.files {
		if tf.active {
			n += int64(cap(tf.buf))
		}
	}
	return n
}

func countOpen(g *generation) int {
	n := 0
	for _, tf := range g.files {
		if tf.active {
			n++
		}
	}
	return n
}

// A file that was created but got no entry (or never opened) is sealed as
// an empty chunk (no bytes, or one empty zstd frame), so the flusher always
// finds one.
func TestSealCreatesUnopenedFile(t *testing.T) {
	for _, compression := range []string{sink.CompressionNone, sink.CompressionZstd} {
		t.Run(compression, func(t *testing.T) { testSealUnopened(t, compression) })
	}
}

func testSealUnopened(t *testing.T, compression string) {
	g := newGeneration(t.TempDir(), 1, 1, compression, nil)
	tf, err := g.file(fileKey{flow: 1, table: 1}, &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "c", FlowName: "f"}})
	if err != nil {
		t.Fatal(err)
	}
	files, _ := g.seal()
	if err := packFiles(files); err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0] != tf {
		t.Fatalf("seal gave %d files", len(files))
	}
	if raw := readChunkFile(t, tf); len(raw) != 0 || compression == sink.CompressionNone && tf.stored != 0 {
		t.Fatalf("sealed unopened file: %d bytes stored, %d framed", tf.stored, len(raw))
	}
	empty := sha256.Sum256(nil)
	if tf.sum != hex.EncodeToString(empty[:]) {
		t.Fatalf("sum %s, want that of no bytes", tf.sum)
	}
}

func TestCapOpenFiles(t *testing.T) {
	for _, tc := range []struct {
		flag int
		soft uint64
		want int
	}{
		{1024, 1 << 20, 1024},
		{1024, 512, 256},
		{1024, 256, 128},
		{100, 256, 100},
		{1024, 1, 1},
		{1024, math.MaxUint64, 1024},
	} {
		t.Run(fmt.Sprintf("%d of %d", tc.flag, tc.soft), func(t *testing.T) {
			if got := capOpenFiles(tc.flag, tc.soft); got != tc.want {
				t.Fatalf("capOpenFiles(%d, %d) = %d, want %d", tc.flag, tc.soft, got, tc.want)
			}
		})
	}
}

// Buffers queued across many files and written by parallel drains, with
// large entries and evictions in between, land in each file in append
// order, for both compressions; a second flow's files that get the same
// entries (a table in two flows: equal buffers, compressed once) too.
func TestGenerationDrainKeepsOrder(t *testing.T) {
	for _, compression := range []string{sink.CompressionNone, sink.CompressionZstd} {
		t.Run(compression, func(t *testing.T) {
			// Files 0-11 of flow 1 and 0, 3, 6, 9 of flow 2 fit the cap;
			// 12 and 13 get an entry now and then, evicting others.
			const maxOpen, nFiles, common, rounds = 16, 14, 12, 300
			g := newGeneration(t.TempDir(), 1, maxOpen, compression, nil)
			flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
			flow2 := &meta.Flow{ID: 2, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f2"}}
			want := map[fileKey][]byte{}
			drains := 0
			for round := range rounds {
				for i := range nFiles {
					if i >= common && round%50 != 0 {
						continue
					}
					key := fileKey{flow: 1, table: 1, region: uint64(i), cf: event.CF_CF_DEFAULT, op: event.Op_OP_PUT}
					tf, err := g.file(key, flow)
					if err != nil {
						t.Fatal(err)
					}
					size := (round*7919 + i*104729) % 6000
					if (round+i)%97 == 0 {
						size = tempBufSize + 5000 // a large entry, written directly
					}
					v := bytes.Repeat([]byte{byte(round), byte(i), 'v'}, size/3+1)
					k := event.AppendDataKey(nil, event.RowKey(1, int64(round)), uint64(round+1))
					before := g.npending
					if err := tf.append(k, v, uint64(round+1), 0); err != nil {
						t.Fatalf("append round %d file %d: %v", round, i, err)
					}
					if g.npending < before {
						drains++
					}
					want[key] = event.AppendEntry(want[key], k, v)
					if i%3 == 0 {
						key2 := key
						key2.flow = 2
						tf2, err := g.file(key2, flow2)
						if err != nil {
							t.Fatal(err)
						}
						if err := tf2.append(k, v, uint64(round+1), 0); err != nil {
							t.Fatalf("append round %d file %d of flow 2: %v", round, i, err)
						}
						want[key2] = event.AppendEntry(want[key2], k, v)
					}
				}
			}
			files, _ := g.seal()
			if err := packFiles(files); err != nil {
				t.Fatal(err)
			}
			if drains == 0 {
				t.Fatalf("no drain ran: the test does not exercise them")
			}
			for _, tf := range files {
				got := readChunkFile(t, tf)
				sum := sha256.Sum256(got)
				if !bytes.Equal(got, want[tf.key]) || tf.sum != hex.EncodeToString(sum[:]) || tf.size != int64(len(got)) {
					t.Fatalf("%s: %d bytes read back, %d appended (size says %d), sum matches %v",
						tf.name(), len(got), len(want[tf.key]), tf.size, tf.sum == hex.EncodeToString(sum[:]))
				}
			}
		})
	}
}

// A compressed file whose buffer keeps going out before it is full (the
// open-buffer cap gives it to another file between appends) gets no frame
// per partial buffer: its partial buffers are raw runs, packed by the
// flusher into frames of up to 32 KiB, so twenty 1 KiB appends, each
// between two evictions, become one frame (one extent, with no room for
// more), and the chunk reads back as appended.
func TestPartialBuffersPackedIntoFewFrames(t *testing.T) {
	g := newGeneration(t.TempDir(), 1, 1, sink.CompressionZstd, nil)
	flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
	var want []byte
	var tf *tempFile
	for i := range 20 {
		for j, region := range []uint64{1, 2} { // region 2 takes region 1's buffer
			key := fileKey{partition: 0, flow: 1, table: 1, region: region, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}
			f, err := g.file(key, flow)
			if err != nil {
				t.Fatal(err)
			}
			k := event.AppendDataKey(nil, event.RowKey(1, int64(i*2+j)), uint64(i+1))
			v := bytes.Repeat([]byte{'a' + byte(i%26)}, 1000)
			if err := f.append(k, v, uint64(i+1), 0); err != nil {
				t.Fatal(err)
			}
			if region == 1 {
				tf, want = f, event.AppendEntry(want, k, v)
			}
		}
	}
	files, _ := g.seal()
	if tf.raw == 0 {
		t.Fatal("no raw run: the test evicted no partial buffer")
	}
	if err := packFiles(files); err != nil {
		t.Fatal(err)
	}
	if len(tf.ext) != 1 || !tf.ext[0].packed || tf.pack == nil || tf.raw != 0 {
		t.Fatalf("chunk of %d bytes in %d extents (raw left %d), want one frame in the pack segment", tf.size, len(tf.ext), tf.raw)
	}
	if cap(tf.ext) != 1 {
		t.Errorf("the packed chunk's extents hold room for %d, want 1: a packed cycle keeps them until its commit", cap(tf.ext))
	}
	if got := readChunkFile(t, tf); !bytes.Equal(got, want) {
		t.Fatalf("packed chunk reads back %d bytes, want the %d appended", len(got), len(want))
	}
	for _, f := range files {
		f.remove()
	}
	if _, err := os.Stat(tf.pack.path); !os.IsNotExist(err) {
		t.Fatalf("pack segment left after its files were removed: %v", err)
	}
}

// A file takes a small buffer first and a larger one as it fills it, up to
// tempBufSize, while the generation's buffers fit in their cap: many small
// files hold little buffer memory, a busy one writes full-size frames. At
// the cap a file's buffer stops growing and goes out as a raw run when
// full, and no other file gives its buffer back for it; a file that opens
// again while the buffers are at the cap takes a small buffer.
func TestBuffersGrowWithTheirFile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxOpen  int
		wantBusy int
	}{
		{"room to grow", 2, tempBufSize},  // 4 KiB + 32 KiB fit in 64 KiB
		{"at the cap", 1, 4 * minBufSize}, // 4 KiB + 32 KiB do not fit in 32 KiB; 4 + 16 do
	} {
		t.Run(tc.name, func(t *testing.T) { testBuffersGrow(t, tc.maxOpen, tc.wantBusy) })
	}
}

func testBuffersGrow(t *testing.T, maxOpen, wantBusy int) {
	g := newGeneration(t.TempDir(), 1, maxOpen, sink.CompressionZstd, nil)
	flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
	file := func(region uint64) *tempFile {
		f, err := g.file(fileKey{partition: 0, flow: 1, table: 1, region: region, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}, flow)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	put := func(f *tempFile, i int, size int) {
		t.Helper()
		if err := f.append(event.AppendDataKey(nil, event.RowKey(1, int64(i)), 1), bytes.Repeat([]byte{'v'}, size), 1, 0); err != nil {
			t.Fatal(err)
		}
		if g.bufs != bufBytes(g) || g.bufs > int64(maxOpen)*tempBufSize {
			t.Fatalf("buffers hold %d bytes (counted %d), cap %d", bufBytes(g), g.bufs, maxOpen*tempBufSize)
		}
	}
	small, busy := file(1), file(2)
	put(small, 0, 100)
	if cap(small.buf) != minBufSize {
		t.Fatalf("a new file's buffer holds %d bytes, want %d", cap(small.buf), minBufSize)
	}
	for i := range 40 {
		put(busy, i, 1000)
	}
	if cap(busy.buf) != wantBusy || busy.bufSize != wantBusy {
		t.Fatalf("a busy file's buffer holds %d bytes (opens with %d), want %d", cap(busy.buf), busy.bufSize, wantBusy)
	}
	if !small.active || cap(small.buf) != minBufSize {
		t.Fatalf("the small file gave its buffer back (active %v, %d bytes) for the busy one", small.active, cap(small.buf))
	}
	if wantBusy < tempBufSize && busy.raw == 0 {
		t.Fatal("the busy file at the cap wrote no raw run")
	}

	// A third file that opens at the cap takes a small buffer, and the
	// least recently used file gives its own back for it only if that
	// does not fit.
	other := file(3)
	put(other, 200, 10)
	if cap(other.buf) != minBufSize {
		t.Fatalf("a file opening at the cap holds %d bytes, want %d", cap(other.buf), minBufSize)
	}
	// An entry larger than its small buffer, which may not grow, goes out
	// as a raw run too (packed at the flush), not as a frame of its own.
	if wantBusy < tempBufSize {
		put(other, 201, 20000)
		if cap(other.buf) != minBufSize || other.raw < 20000 {
			t.Fatalf("after a 20000-byte entry at the cap: buffer %d bytes, %d bytes of raw runs; want %d and the entry raw", cap(other.buf), other.raw, minBufSize)
		}
	}
	files, _ := g.seal()
	if err := packFiles(files); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if raw := readChunkFile(t, f); int64(len(raw)) != f.size {
			t.Fatalf("%s reads back %d bytes, holds %d", f.name(), len(raw), f.size)
		}
	}
}

// A chunk of at most tinyChunk bytes, all of them raw runs, is stored
// uncompressed as it was written: no frame, nothing packed.
func TestTinyChunkStoredUncompressed(t *testing.T) {
	g := newGeneration(t.TempDir(), 1, 1, sink.CompressionZstd, nil)
	flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
	f, err := g.file(fileKey{partition: 0, flow: 1, table: 1, region: 1, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}, flow)
	if err != nil {
		t.Fatal(err)
	}
	k := event.AppendDataKey(nil, event.RowKey(1, 1), 1)
	if err := f.append(k, []byte("one small event"), 1, 0); err != nil {
		t.Fatal(err)
	}
	files, _ := g.seal()
	if err := packFiles(files); err != nil {
		t.Fatal(err)
	}
	if f.zstd || f.pack != nil || f.stored != f.size {
		t.Fatalf("tiny chunk: zstd %v, packed %v, %d bytes stored of %d", f.zstd, f.pack != nil, f.stored, f.size)
	}
	if got := readChunkFile(t, f); !bytes.Equal(got, event.AppendEntry(nil, k, []byte("one small event"))) {
		t.Fatalf("tiny chunk reads back %x", got)
	}
}

// A data object's reader fills each Read from as many chunks as fit, so
// that tiny chunks are not written to the connection one by one.
func TestChunkReaderFillsAcrossChunks(t *testing.T) {
	const nFiles = 50
	g := newGeneration(t.TempDir(), 1, 4, sink.CompressionNone, nil)
	flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
	var want []byte
	for i := range nFiles {
		tf, err := g.file(fileKey{table: 1, region: uint64(i), cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}, flow)
		if err != nil {
			t.Fatal(err)
		}
		if err := tf.append(event.AppendDataKey(nil, event.RowKey(1, int64(i)), 1), []byte("v"), 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	files, _ := g.seal()
	if err := packFiles(files); err != nil {
		t.Fatal(err)
	}
	for _, tf := range files {
		want = append(want, readChunkFile(t, tf)...)
	}
	r := newChunkReader(files)
	defer r.Close()
	buf := make([]byte, len(want)+10)
	n, err := r.Read(buf)
	if err != nil || n != len(want) || !bytes.Equal(buf[:n], want) {
		t.Fatalf("one Read of %d files (%d bytes) returned %d bytes, %v; want them all", nFiles, len(want), n, err)
	}
	if n, err := r.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("Read at the end: %d, %v; want 0, EOF", n, err)
	}
}
