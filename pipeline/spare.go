package pipeline

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
)

// A released segment's file is kept as a spare, and the next segment to be
// written takes it and writes over it instead of creating a file of its
// own. Writing over a file's cached pages costs a copy; writing a new file
// also costs the kernel a fresh page per 4 KiB, and on a VM a page the
// guest has not touched since it booted must first be backed by the host:
// about 11 µs each, 0.8-1.0 CPU s of the consumer's 5 per 420 MB of temp
// frames on a freshly booted 2-core VM (docs/SIZING.md, "Throughput and
// CPU of the flush"). A cycle's segments are freed when it commits and the
// next ones fill while it uploads, so a spare or two carry the pages from
// one cycle to the next.
//
// Spares are <temp-dir>/spare<n>.seg. At most maxSpares are kept, holding
// at most the consumer's spare budget together (spareBudget); a file past
// it is removed as before. A segment that took a spare truncates it to what
// it wrote when sealed, so a sealed segment's file is exactly its bytes
// (segment.check). Spares are leftovers like segments: removed at start and
// after a fenced rejoin, and forgotten then (reset), and removed when the
// consumer stops (clear).

// spareBudget is the bytes the spares of a consumer may hold together:
// twice --flush-size (a cycle's generation segment and its pack segment),
// at most an eighth of --max-temp-bytes.
func spareBudget(flushSize, maxTempBytes int64) int64 {
	return min(2*flushSize, maxTempBytes/8)
}

// spareNameExpr is the names of spare files, spare<n>.seg, as a regular
// expression (the temp dir's cleaning matches it too: segFileRE).
const spareNameExpr = `spare[0-9]+\.seg`

// spareRE matches the names of spare files.
var spareRE = regexp.MustCompile(`^` + spareNameExpr + `$`)

// maxSpares is how many released segment files are kept for reuse: the
// generation segment and the pack segment of one cycle.
const maxSpares = 2

// spareFile is a kept file and its size on disk.
type spareFile struct {
	path string
	size int64
}

// spareFiles is the consumer's pool of spare segment files. Safe for
// concurrent use: segments are released by the flusher and written by the
// consume loop and the pack workers. A nil *spareFiles keeps nothing.
type spareFiles struct {
	dir      string
	maxBytes int64

	mu    sync.Mutex
	free  []spareFile // most recently kept last
	bytes int64
	seq   uint64
}

// newSpareFiles keeps spares in dir, together at most maxBytes.
func newSpareFiles(dir string, maxBytes int64) *spareFiles {
	return &spareFiles{dir: dir, maxBytes: maxBytes}
}

// keep takes the file at path (size bytes on disk) as a spare, and reports
// whether it did; if not, the caller removes the file. The oldest spares
// make room for it.
func (p *spareFiles) keep(path string, size int64) bool {
	if p == nil || size <= 0 || size > p.maxBytes {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.free) > 0 && (len(p.free) >= maxSpares || p.bytes+size > p.maxBytes) {
		old := p.free[0]
		p.free = p.free[1:]
		p.bytes -= old.size
		_ = os.Remove(old.path)
	}
	p.seq++
	to := filepath.Join(p.dir, fmt.Sprintf("spare%d.seg", p.seq)) // spareNameExpr
	if err := os.Rename(path, to); err != nil {
		return false
	}
	p.free = append(p.free, spareFile{path: to, size: size})
	p.bytes += size
	return true
}

// take moves the most recently kept spare to path and opens it for writing
// from its start, and returns it with its size on disk. It returns nil when
// there is no spare it can use; the caller then creates the file.
func (p *spareFiles) take(path string) (*os.File, int64) {
	if p == nil {
		return nil, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		// Never write over a file already at path (a new segment's own
		// create refuses one too: O_EXCL).
		return nil, 0
	}
	for len(p.free) > 0 {
		s := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		p.bytes -= s.size
		if err := os.Rename(s.path, path); err != nil {
			_ = os.Remove(s.path) // gone already if the temp dir was cleaned
			continue
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			_ = os.Remove(path)
			return nil, 0
		}
		return f, s.size
	}
	return nil, 0
}

// reset forgets every spare; the temp dir's cleaning removed their files.
func (p *spareFiles) reset() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.free, p.bytes = nil, 0
	p.mu.Unlock()
}

// clear removes every spare's file and forgets it: a consumer that stops
// leaves no temp file behind.
func (p *spareFiles) clear() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.free {
		_ = os.Remove(s.path)
	}
	p.free, p.bytes = nil, 0
}
