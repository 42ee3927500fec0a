package pipeline

import (
	"fmt"
	"path/filepath"

	"github.com/flowlog/flowlog/meta"
)

// generation is the set of temp files events are appended to now. A freeze
// hands the whole generation to a flush cycle and starts a new one, so a
// frozen file never receives another entry.
//
// Its files write to one segment file (segment.go). Their write buffers
// take at most maxOpen full-size buffers' bytes (maxOpen x tempBufSize) at
// a time: a buffer more makes the least recently appended files write what
// they hold and give their buffers back first (touch). Buffers start small
// (minBufSize), so many files of a few KiB each keep theirs: a file that
// gives its buffer back writes a raw run, which costs an extent and a
// read and compression again at the flush (pack.go). A generation of
// 15,000 one-entry files thus needs one descriptor and at most maxOpen x
// tempBufSize of buffers, not 15,000 of each. The consume loop owns the
// current generation; seal hands it over with every buffer written and
// the segment closed, so a frozen cycle holds no descriptor while it
// waits for the flusher.
type generation struct {
	id      uint64
	root    string
	maxOpen int
	compr   string // chunk compression its files are written with
	files   map[fileKey]*tempFile
	seg     *segment
	bytes   int64     // framed bytes of its files
	mem     int64     // estimated memory of its files besides buffers (tempFile.mem)
	raw     int64     // bytes of raw runs: the flusher writes their frames again (pack.go)
	open    int       // files holding a buffer
	bufs    int64     // bytes of the buffers they hold (their capacity)
	lru     tempFile  // sentinel of the ring of files holding a buffer, most recently appended first
	last    *tempFile // the file of the previous append, for runs of one key
	// recent holds files by a hash of their key (fileKey.slot), for
	// lookups without the map: with thousands of files a map lookup reads
	// memory no cache holds, where a hit here reads only the file, which
	// the append reads anyway. A slot keeps the file last looked up there.
	recent []*tempFile
	// splits is, for a layout v2 key whose file filled up with region runs,
	// the split of the file it goes on in (regionFile).
	splits map[fileKey]uint32
	runs   int // region runs of its files (cycleFull)

	pending  []*tempFile // files with full buffers queued (spill.go)
	npending int         // buffers queued
}

// newGeneration starts generation id in root; its segment writes over a
// spare file when spares has one (spares may be nil).
func newGeneration(root string, id uint64, maxOpen int, compression string, spares *spareFiles) *generation {
	g := &generation{id: id, root: root, maxOpen: max(maxOpen, 1), compr: compression, files: map[fileKey]*tempFile{},
		seg: newSegment(filepath.Join(root, fmt.Sprintf("g%d.seg", id)), spares)}
	g.lru.prev, g.lru.next = &g.lru, &g.lru
	return g
}

// cost is what the generation counts against --flush-size: its bytes plus
// the memory its files hold.
func (g *generation) cost() int64 { return g.bytes + g.mem }

// diskCost is what it counts against --max-temp-bytes: its cost and its raw
// runs once more, whose frames take disk too until the cycle commits.
func (g *generation) diskCost() int64 { return g.cost() + g.raw }

// file returns the temp file of key, creating it on first use. (The key
// holds the flow id, which keeps a flow dropped and created again under the
// same name apart from the old one: docs/FORMAT.md, "Bucket layout".)
func (g *generation) file(key fileKey, flow *meta.Flow) (*tempFile, error) {
	if l := g.last; l != nil && l.key == key {
		return l, nil
	}
	if g.recent == nil {
		g.recent = make([]*tempFile, recentSlots)
	}
	slot := &g.recent[key.slot()&(recentSlots-1)]
	if f := *slot; f != nil && f.key == key {
		g.last = f
		return f, nil
	}
	if f, ok := g.files[key]; ok {
		g.last, *slot = f, f
		return f, nil
	}
	f := newTempFile(g.seg, key, flow, g.compr)
	f.g = g
	g.files[key] = f
	g.mem += f.mem()
	g.last, *slot = f, f
	return f, nil
}

// recentSlots is the size of generation.recent: a power of two, a few
// times the files of a wide cycle's busy tables (64 KiB of pointers).
const recentSlots = 8192

// regionFile returns the layout v2 temp file an entry of region with key
// (split 0) goes into: the key's current file, or, when that one holds
// maxChunkRuns region runs and region would start another, a new file of
// the key, one split higher. The full file stays in the generation as it
// is and becomes a chunk of the cycle like any other, before the new one
// (sortFiles), so that each region's entries keep their order.
func (g *generation) regionFile(key fileKey, region uint64) (*tempFile, error) {
	f := g.last
	if f == nil || f.key.base() != key {
		if n, ok := g.splits[key]; ok {
			key.split = n
		}
		var err error
		if f, err = g.file(key, nil); err != nil {
			return nil, err
		}
	}
	if f.takesRegion(region) {
		return f, nil
	}
	base := f.key.base()
	next := base
	next.split = f.key.split + 1
	if g.splits == nil {
		g.splits = map[fileKey]uint32{}
	}
	g.splits[base] = next.split
	return g.file(next, nil)
}

// touch makes t the most recently used file, giving it a buffer (and
// making the least recently used ones write and give back their own while
// the buffers would take more than maxBufBytes) if it has none.
func (g *generation) touch(t *tempFile) error {
	if t.active {
		if g.lru.next != t {
			g.unlink(t)
			g.pushFront(t)
		}
		return nil
	}
	if g.bufs+int64(t.bufSize) > g.maxBufBytes() {
		// The buffers are at their cap: the file takes a small buffer
		// again, before any other file must give its own back.
		t.bufSize = minBufSize
	}
	if err := g.makeRoom(int64(t.bufSize)); err != nil {
		return err
	}
	t.open()
	g.pushFront(t)
	g.open++
	g.bufs += int64(cap(t.buf))
	return nil
}

// makeRoom makes the least recently used files give their buffers back
// until need more bytes of buffers fit in maxBufBytes (or none is left).
func (g *generation) makeRoom(need int64) error {
	for g.open > 0 && g.bufs+need > g.maxBufBytes() {
		old := g.lru.prev
		g.unlink(old)
		g.open--
		g.bufs -= int64(cap(old.buf))
		if err := old.shut(); err != nil {
			return err
		}
	}
	return nil
}

// maxBufBytes is what the write buffers of the generation's files may take
// at once: maxOpen full-size buffers.
func (g *generation) maxBufBytes() int64 { return int64(g.maxOpen) * tempBufSize }

func (g *generation) pushFront(t *tempFile) {
	t.prev, t.next = &g.lru, g.lru.next
	g.lru.next.prev = t
	g.lru.next = t
}

func (g *generation) unlink(t *tempFile) {
	t.prev.next, t.next.prev = t.next, t.prev
	t.prev, t.next = nil, nil
}

// forget drops t from the generation's accounting (t is being removed).
// The caller deletes it from files.
func (g *generation) forget(t *tempFile) {
	if t.active {
		g.unlink(t)
		g.open--
		g.bufs -= int64(cap(t.buf))
	}
	g.mem -= t.mem()
	g.raw -= t.raw
	g.runs -= t.runs.len()
	if g.last == t {
		g.last = nil
	}
	if g.recent != nil {
		if slot := &g.recent[t.key.slot()&(recentSlots-1)]; *slot == t {
			*slot = nil
		}
	}
	t.g = nil
}

// drop removes every file of the generation unwritten: what it holds is
// not to be committed. The generation takes no appends after it.
func (g *generation) drop() {
	for _, t := range g.files {
		t.remove()
	}
	g.files, g.pending, g.npending = map[fileKey]*tempFile{}, nil, 0
}

// seal writes what every file of the generation buffers, fixes their
// checksums, writes their region runs after them (runList.spill) and
// closes the segment, and returns the files with what they still cost
// (tempFile.mem, their spilled runs included). A write that fails here
// stays with its file and fails the cycle when the flusher closes it
// (tempFile.close). The generation takes no appends after it.
func (g *generation) seal() (files []*tempFile, mem int64) {
	_ = g.drain() // errors stay with their files
	files = make([]*tempFile, 0, len(g.files))
	for t := g.lru.next; t != &g.lru; {
		next := t.next
		_ = t.shut()
		t.prev, t.next = nil, nil
		t = next
	}
	g.lru.prev, g.lru.next = &g.lru, &g.lru
	g.open, g.bufs = 0, 0
	for _, t := range g.files {
		_ = t.seal()
		if err := t.runs.spill(g.seg); err != nil && t.err == nil {
			t.err = err
		}
		t.g = nil
		files = append(files, t)
		mem += t.mem()
	}
	if err := g.seg.seal(); err != nil {
		for _, t := range files {
			if t.err == nil {
				t.err = err
			}
		}
	}
	g.last, g.recent = nil, nil
	return files, mem
}
