package pipeline

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"math"
	"slices"
	"sync"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// tempBufSize is the write buffer of an open temp file. Only open files hold
// one (at most --max-open-files of them), so buffer memory is bounded by the
// open-file cap, not by the number of files of a generation.
const tempBufSize = 32 << 10

// minBufSize is the buffer a file takes first. It doubles up to tempBufSize
// as the file fills it, and a file that filled one takes the larger size the
// next time it opens: with thousands of regions most files hold a few KiB
// between the times the cap takes their buffer, and full-size buffers for
// them would hold --max-open-files x 32 KiB for little (and keep the
// garbage collector busy near the memory limit).
const minBufSize = 4 << 10

// fileOverhead is the estimated memory of one temp file besides its buffer
// and its key copies: the struct, the sha256 state, the path, the map entry
// and the metadata the flusher needs. It is counted with the file's bytes in
// --flush-size and --max-temp-bytes, so that many tiny files flush and apply
// backpressure like few large ones.
const fileOverhead = 1 << 10

// bufPools hold the write buffers of closed temp files for the next file
// that opens, one pool per size: minBufSize, doubled up to tempBufSize.
var bufPools = [4]sync.Pool{
	{New: func() any { b := make([]byte, 0, minBufSize); return &b }},
	{New: func() any { b := make([]byte, 0, minBufSize<<1); return &b }},
	{New: func() any { b := make([]byte, 0, minBufSize<<2); return &b }},
	{New: func() any { b := make([]byte, 0, minBufSize<<3); return &b }}, // tempBufSize
}

// bufClass is the pool of buffers of size, -1 for another size.
func bufClass(size int) int {
	for i := range bufPools {
		if size == minBufSize<<i {
			return i
		}
	}
	return -1
}

// getBuf returns an empty buffer of size (minBufSize << k, at most
// tempBufSize).
func getBuf(size int) []byte { return (*bufPools[bufClass(size)].Get().(*[]byte))[:0] }

func putBuf(b []byte) {
	if i := bufClass(cap(b)); i >= 0 {
		b = b[:0]
		bufPools[i].Put(&b)
	}
}

// fileKey identifies one temp file of a generation, the chunk of one key
// in a data object (docs/FORMAT.md, "Data objects and chunks"): (kafka
// partition, flow, table, region, cf, op, is_meta) in layout v1, where each
// flow of an event gets its own copy; in layout v2 the flow is the set of
// flows that routed the event (set; flow is 0), so that an event is written
// once however many flows cover its table. A set changes when a DDL changes
// the flows of the table, and new files start (docs/FORMAT.md, "Layout v2").
//
// A layout v2 key has no region and no partition (both 0): its file holds
// the events of every region of the key, from every apply partition the
// replica owns, and records which region sent each run of them
// (tempFile.runs) and which partitions they came from (tempFile.parts), so
// that files, meta entries and --max-cycle-files follow tables, not tables
// x partitions x regions. A file that holds maxChunkRuns runs
// takes no other region: the key goes on in a new file of the generation,
// split one higher (generation.regionFile), which sorts after it.
type fileKey struct {
	partition int32
	flow      meta.FlowID
	set       *meta.FlowSet
	table     int64
	region    uint64
	cf        event.CF
	op        event.Op
	isMeta    bool
	split     uint32
}

// slot is a hash of the key for generation.recent. The flow set is left
// out: a table's files in one generation almost always share theirs.
func (k *fileKey) slot() uint64 {
	h := uint64(k.table)*0x9e3779b97f4a7c15 ^ k.region*0xbf58476d1ce4e5b9 ^
		uint64(k.flow)<<40 ^ uint64(uint32(k.partition))<<20 ^ uint64(k.split)<<8 ^ uint64(k.cf)<<4 ^ uint64(k.op)<<2
	if k.isMeta {
		h ^= 1
	}
	h ^= h >> 31
	h *= 0x94d049bb133111eb
	return h ^ h>>29
}

// base is the key without its split: the key its entries are routed by.
func (k fileKey) base() fileKey {
	k.split = 0
	return k
}

// maxChunkRuns is the most region runs a layout v2 file takes
// (sink.MaxChunkRuns); a variable so that a test can lower it.
var maxChunkRuns = sink.MaxChunkRuns

// tempFile is one append-only temp file: a chunk of a data object in the
// making. It frames entries into a buffer and hashes and writes the buffer
// when it fills, so the sha256 and stats of its chunk's meta are known
// when the file is frozen without reading it again. Its bytes go to its
// generation's segment file (segment.go), at the extents it records.
//
// With --compression zstd each buffer is written as one zstd frame, so the
// bytes on disk are already its chunk of the data object (a run of frames,
// see sink.AppendZstdFrame): the flusher uploads the chunks back to back
// as they are, with the CRC32C combined from theirs, and no byte is
// compressed, written or read a second time to build the object.
//
// While its generation is current the file may give its buffer back at any
// time to keep the buffers under the generation's cap (generation.touch):
// what it holds is written, and the hash and stats stay in memory; the next
// append takes a buffer again. A frozen file is sealed: written and summed
// (seal), and nothing writes to it again.
//
// A tempFile is owned by one goroutine at a time: the consume loop while its
// generation is current, the flusher once frozen.
type tempFile struct {
	// The fields an append reads and writes come first and together: with
	// thousands of files taking turns, an append finds its file in memory
	// no cache holds, and reads only the few cache lines they fill.
	key fileKey
	g   *generation // the current generation holding it; nil once sealed
	// runs are the regions of a layout v2 file's entries, in entry order:
	// each run the region of that many consecutive entries (countRegion).
	runs runList

	active         bool      // holds a write buffer (counted in g.open)
	bufSize        int       // the buffer size it takes on open (minBufSize .. tempBufSize)
	buf            []byte    // nil while not active
	prev, next     *tempFile // links in g's list of open files, most recent first
	size           int64     // framed bytes, buffered included
	entries        int64
	minTS, maxTS   uint64
	minBeginTS     uint64 // min start ts of write-CF puts
	minKey, maxKey []byte
	// partBits has bit p set when partition p (below 64) is in parts: a
	// check that reads no memory beyond the file's own.
	partBits uint64
	// parts are the apply partitions of a layout v2 file's entries, each
	// once, in the order their first entry came (countPartition).
	parts []int32

	flow *meta.Flow // layout v1: the flow; nil in layout v2 (key.set)
	seg  *segment
	pack *segment // the cycle's pack segment once its raw runs are packed
	ext  []extent // where its stored bytes are, in order: in seg, or pack

	removed bool // remove has released its segment
	hash    hash.Hash
	err     error // a write that failed while closing (evicted or sealed)
	zstd    bool  // buffers are written as zstd frames

	stored int64  // bytes on disk that are the chunk's, raw runs not yet packed included
	crc    uint32 // CRC32C of the chunk's stored bytes, set by pack
	raw    int64  // bytes of its raw runs not yet packed (pack.go)

	pending [][]byte // full buffers queued for the generation's next drain (spill.go)
	queued  bool     // in the generation's list of files with queued buffers

	resolvedTS uint64 // set at freeze: the lowest last resolved ts of its regions
	sum        string // hex sha256, set by seal
}

func newTempFile(seg *segment, key fileKey, flow *meta.Flow, compression string) *tempFile {
	seg.acquire()
	return &tempFile{
		key: key, flow: flow, seg: seg, zstd: compression == sink.CompressionZstd, bufSize: minBufSize,
		hash:       sha256.New(),
		minTS:      math.MaxUint64,
		minBeginTS: math.MaxUint64,
	}
}

// mem is the estimated memory the file holds besides its buffer: its
// bookkeeping and key copies. (Its extents, 24 bytes per run of frames in
// the segment, are not counted: one per full buffer is 0.05% of the bytes,
// and only a file that keeps giving its buffer back under the cap has many
// more.)
func (t *tempFile) mem() int64 {
	return fileOverhead + int64(cap(t.minKey)+cap(t.maxKey)) + t.runs.mem() + int64(cap(t.parts))*4
}

// countPartition records that the entry just appended came from apply
// partition p (layout v2).
func (t *tempFile) countPartition(p int32) {
	if p >= 0 && p < 64 {
		if t.partBits&(1<<p) != 0 {
			return
		}
		t.partBits |= 1 << p
	} else if slices.Contains(t.parts, p) {
		return
	}
	before := t.mem()
	t.parts = append(t.parts, p)
	if t.g != nil {
		t.g.mem += t.mem() - before
	}
}

// holdsPartition reports whether an entry of the file came from apply
// partition p: its key's partition in layout v1, one of parts in layout v2.
func (t *tempFile) holdsPartition(p int32) bool {
	if t.key.set == nil {
		return t.key.partition == p
	}
	return slices.Contains(t.parts, p)
}

// takesRegion reports whether an entry of region may go into the file: a
// layout v2 file takes a new run while it has fewer than maxChunkRuns.
func (t *tempFile) takesRegion(region uint64) bool {
	return t.runs.len() < maxChunkRuns || t.runs.last.Region == region
}

// countRegion records that the entry just appended came from region: one
// more entry of the last run, or a new run.
func (t *tempFile) countRegion(region uint64) {
	before := t.runs.mem()
	started := t.runs.add(region)
	if t.g != nil {
		t.g.mem += t.runs.mem() - before
		if started {
			t.g.runs++
		}
	}
}

// name names the file in errors: its generation and key, as a path would.
func (t *tempFile) name() string {
	meta := ""
	if t.key.isMeta {
		meta = "-meta"
	}
	if s := t.key.set; s != nil {
		// Every partition and region of the key.
		split := ""
		if t.key.split > 0 {
			split = fmt.Sprintf("-n%d", t.key.split)
		}
		return fmt.Sprintf("s%d+%d-t%d%s-%s-%s%s", s.IDs[0], len(s.IDs)-1, t.key.table, split,
			sink.CFName(t.key.cf), sink.OpName(t.key.op), meta)
	}
	return fmt.Sprintf("f%d-p%d-t%d-r%d-%s-%s%s", t.key.flow, t.key.partition, t.key.table, t.key.region,
		sink.CFName(t.key.cf), sink.OpName(t.key.op), meta)
}

// eachFlow calls fn with every flow of the file: its flow in layout v1,
// the flows of its set in layout v2.
func (t *tempFile) eachFlow(fn func(*meta.Flow)) {
	if t.flow != nil {
		fn(t.flow)
		return
	}
	for _, f := range t.key.set.Flows {
		fn(f)
	}
}

// open takes a write buffer.
func (t *tempFile) open() {
	t.active, t.buf = true, getBuf(t.bufSize)
}

// shut writes what is buffered and gives the buffer back; the hash and
// stats stay. A compressed file writes its partial buffer as a raw run, for
// the flusher to pack with the file's other raw runs into few large frames
// (pack.go). A failed write is also kept in t.err: the file has lost bytes
// and its cycle must not commit.
func (t *tempFile) shut() error {
	if !t.active {
		return nil
	}
	err := t.writeQueued()
	if serr := t.spill(); err == nil {
		err = serr
	}
	putBuf(t.buf)
	t.active, t.buf = false, nil
	if err != nil && t.err == nil {
		t.err = err
	}
	return err
}

// append frames one entry. ts is the key's ts; beginTS the start ts of a
// write-CF put (0 when not applicable). The file must be open
// (generation.touch does that).
func (t *tempFile) append(key, value []byte, ts, beginTS uint64) error {
	if t.g != nil {
		if err := t.g.touch(t); err != nil {
			return err
		}
	}
	if !t.active {
		return fmt.Errorf("append to %s: %w", t.name(), errSealed)
	}
	memBefore := t.mem()
	n := event.EntrySize(key, value)
	if len(t.buf)+n > cap(t.buf) && cap(t.buf) < tempBufSize && n <= tempBufSize {
		if size := t.growTo(len(t.buf) + n); t.mayGrow(size) {
			t.grow(size)
		}
	}
	switch {
	case len(t.buf)+n <= cap(t.buf):
	case cap(t.buf) < tempBufSize:
		// A small buffer that may not grow (the generation's buffers are
		// at their cap) is written out as it is: a raw run of a
		// compressed file, which the flush packs with the file's other
		// raw runs into full-size frames (pack.go). Letting it grow would
		// make other files give their buffers back after an entry or two,
		// a raw run and an extent per entry.
		if err := t.writeQueued(); err != nil {
			return err
		}
		if err := t.spill(); err != nil {
			return err
		}
	default:
		if err := t.queueBuf(); err != nil {
			return err
		}
	}
	switch {
	case n > tempBufSize:
		// A large entry goes straight through, hashed on the way, after
		// what the file has queued.
		if err := t.writeQueued(); err != nil {
			return err
		}
		if err := t.write(event.AppendEntry(make([]byte, 0, n), key, value)); err != nil {
			return err
		}
	case n > cap(t.buf):
		// Larger than a small buffer that may not grow: written as that
		// buffer is (spill), through a pooled buffer, so that the consume
		// loop neither compresses a frame nor allocates per entry.
		if err := t.writeQueued(); err != nil {
			return err
		}
		b := event.AppendEntry(getBuf(t.growTo(n)), key, value)
		err := t.writeAsIs(b)
		putBuf(b)
		if err != nil {
			return err
		}
	default:
		t.buf = event.AppendEntry(t.buf, key, value)
	}
	t.size += int64(n)
	t.entries++
	t.minTS = min(t.minTS, ts)
	t.maxTS = max(t.maxTS, ts)
	if beginTS != 0 {
		t.minBeginTS = min(t.minBeginTS, beginTS)
	}
	if t.entries == 1 || bytes.Compare(key, t.minKey) < 0 {
		t.minKey = append(t.minKey[:0], key...)
	}
	if t.entries == 1 || bytes.Compare(key, t.maxKey) > 0 {
		t.maxKey = append(t.maxKey[:0], key...)
	}
	if t.g != nil {
		t.g.mem += t.mem() - memBefore
	}
	return nil
}

// growTo is the buffer size the file grows to for need bytes: its size
// doubled until need fits, at most tempBufSize.
func (t *tempFile) growTo(need int) int {
	size := cap(t.buf)
	for size < need && size < tempBufSize {
		size *= 2
	}
	return size
}

// mayGrow reports whether the file's buffer may grow to size: the
// generation's buffers stay within its cap (generation.maxBufBytes).
func (t *tempFile) mayGrow(size int) bool {
	g := t.g
	return g == nil || !t.active || g.bufs+int64(size-cap(t.buf)) <= g.maxBufBytes()
}

// grow moves the buffer to one of size bytes (growTo), which the file also
// takes on its next opens.
func (t *tempFile) grow(size int) {
	nb := append(getBuf(size), t.buf...)
	if g := t.g; g != nil && t.active {
		g.bufs += int64(cap(nb) - cap(t.buf))
	}
	putBuf(t.buf)
	t.buf, t.bufSize = nb, size
}

// errSealed is an append to a file of a frozen generation: a bug.
var errSealed = errors.New("temp file is sealed")

// spill writes the partial buffer: as a raw run when the file is
// compressed (pack.go), as its stored bytes otherwise.
func (t *tempFile) spill() error {
	if len(t.buf) == 0 {
		return nil
	}
	if err := t.writeAsIs(t.buf); err != nil {
		return err
	}
	t.buf = t.buf[:0]
	return nil
}

// writeAsIs writes framed bytes not yet compressed: as a raw run when the
// file is compressed (pack.go), as its stored bytes otherwise.
func (t *tempFile) writeAsIs(raw []byte) error {
	if t.zstd {
		return t.writeRaw(raw)
	}
	return t.write(raw)
}

// frameBufs holds the buffers zstd frames are compressed into on their way
// to disk: one per write in progress, or per distinct buffer of a drain.
var frameBufs = sync.Pool{New: func() any { b := make([]byte, 0, tempBufSize+tempBufSize/8); return &b }}

func putFrameBuf(fb *[]byte) {
	if fb != nil && cap(*fb) <= 2*tempBufSize {
		frameBufs.Put(fb)
	}
}

// write writes the framed bytes raw, as one zstd frame if the file is
// compressed (writeOut).
func (t *tempFile) write(raw []byte) error {
	if !t.zstd {
		return t.writeOut(raw, raw)
	}
	fb := frameBufs.Get().(*[]byte)
	defer putFrameBuf(fb)
	var err error
	if *fb, err = sink.AppendZstdFrame((*fb)[:0], raw); err != nil {
		return fmt.Errorf("write %s: %w", t.name(), err)
	}
	return t.writeOut(raw, *fb)
}

// writeOut hashes the framed bytes raw and writes out, what is stored for
// them (raw itself, or its zstd frame), to the segment, keeping its extent
// and the stored length.
func (t *tempFile) writeOut(raw, out []byte) error {
	t.hash.Write(raw)
	return t.store(out, false)
}

// writeRaw hashes the framed bytes raw and writes them to the segment as a
// raw run of a compressed file: pack turns its raw runs into frames.
func (t *tempFile) writeRaw(raw []byte) error {
	t.hash.Write(raw)
	if err := t.store(raw, true); err != nil {
		return err
	}
	t.raw += int64(len(raw))
	if t.g != nil {
		t.g.raw += int64(len(raw))
	}
	return nil
}

// store writes p to the file's segment and adds its extent, merged with
// the last one when they are adjacent and of one kind.
func (t *tempFile) store(p []byte, raw bool) error {
	if len(p) == 0 {
		return nil
	}
	off, err := t.seg.write(p)
	if err != nil {
		return fmt.Errorf("write %s: %w", t.name(), err)
	}
	n := int64(len(p))
	if k := len(t.ext) - 1; k >= 0 && !t.ext[k].packed && t.ext[k].raw == raw && t.ext[k].off+t.ext[k].len == off {
		t.ext[k].crc = sink.UpdateCRC32C(t.ext[k].crc, p)
		t.ext[k].len += n
	} else {
		t.ext = append(t.ext, extent{off: off, len: n, crc: sink.CRC32C(p), raw: raw})
	}
	t.stored += n
	return nil
}

// seal writes what is buffered and fixes the checksum. The file accepts
// nothing after it. An error is also kept for close.
func (t *tempFile) seal() error {
	if t.sum != "" {
		return t.err
	}
	err := t.shut()
	if err == nil && t.zstd && t.stored == 0 && t.raw == 0 {
		// An empty compressed chunk is still one (empty) frame: a zstd
		// reader expects at least one.
		if err = t.write(nil); err != nil && t.err == nil {
			t.err = err
		}
	}
	t.sum = hex.EncodeToString(t.hash.Sum(nil))
	t.hash = nil
	return err
}

// close seals the file (if its generation has not) and reports a write that
// failed while it was closed or sealed, once: a retried cycle then finds the
// short file when it builds the chunk (the size does not match). Its raw
// runs are packed afterwards (flusher.pack).
func (t *tempFile) close() error {
	err := t.seal()
	t.err = nil
	return err
}

// remove drops the file: its buffers, its generation's accounting if it is
// still current, and its share of the segment (the last one deletes it).
func (t *tempFile) remove() {
	t.dropQueued()
	if t.g != nil {
		t.g.forget(t)
	}
	if t.active {
		putBuf(t.buf)
		t.active, t.buf = false, nil
	}
	if !t.removed {
		t.removed = true
		t.seg.release()
		if t.pack != nil {
			t.pack.release()
		}
	}
}

// beginTS reports min_begin_ts_in_default_cf: the min start ts of a
// write-CF chunk's puts, and min_ts for other chunks.
func (t *tempFile) beginTS() uint64 {
	if t.key.cf == event.CF_CF_WRITE && t.minBeginTS != math.MaxUint64 {
		return t.minBeginTS
	}
	return t.minTS
}
