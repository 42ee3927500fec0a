package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/flowlog/flowlog/sink"
)

// Full temp file buffers are not written one at a time by the consume loop:
// each is queued on its file (tempFile.pending) and the generation writes
// the queued buffers of all its files together once pendingMax of them
// wait (drain), on up to drainWorkers goroutines. A buffer's write is where
// the CPU goes (sha256, a zstd frame, the write call), so the consume loop
// thus gets as many cores as there are, where it had one. A drain also
// compresses equal buffers once: an event of a table in two flows is
// appended to a file of each, so their buffers fill alike.
//
// Why a file's bytes stay in order: one worker writes all the queued
// buffers of one file, oldest first, and every other write of a file (a
// large entry, its last buffer when it is closed or sealed) first writes
// what it has queued. Drains run inside the consume loop's call (append,
// touch, seal), which waits for the workers: nothing else touches a
// generation's files meanwhile, and a write error reaches the caller as
// before (and stays with its file: tempFile.err fails its cycle).

// pendingMax is how many full buffers a generation queues before it writes
// them: 2 MiB of 32 KiB buffers besides those of --max-open-files (and as
// many zstd frames while a drain writes), enough to spread over the
// workers.
const pendingMax = 64

// drainWorkers is the most goroutines a drain writes on (and the zstd
// frame encoders in use at once).
const drainWorkers = 4

// queueBuf queues the file's full buffer for the next drain and gives it a
// fresh one. A file outside a generation writes at once.
func (t *tempFile) queueBuf() error {
	if len(t.buf) == 0 {
		return nil
	}
	g := t.g
	if g == nil {
		return t.spill()
	}
	if !t.queued {
		t.queued = true
		g.pending = append(g.pending, t)
	}
	t.pending = append(t.pending, t.buf)
	t.buf = getBuf(t.bufSize)
	g.npending++
	if g.npending >= pendingMax {
		return g.drain()
	}
	return nil
}

// writeQueued writes the file's queued buffers in order, outside a drain
// (before a large entry or closing the file).
func (t *tempFile) writeQueued() error {
	if t.g != nil {
		t.g.npending -= len(t.pending)
	}
	return t.writePending(nil)
}

// writePending writes and releases the queued buffers, with the zstd
// frames a drain compressed for them (frames[i] for t.pending[i]) or, when
// frames is nil, compressing them here. After a failed write the rest are
// dropped (the file has lost bytes either way). The error is also kept in
// t.err.
func (t *tempFile) writePending(frames []*frameJob) error {
	var err error
	for i, b := range t.pending {
		if err == nil {
			switch {
			case frames == nil:
				err = t.write(b)
			case frames[i].err != nil:
				err = fmt.Errorf("write %s: %w", t.name(), frames[i].err)
			default:
				err = t.writeOut(b, *frames[i].frame)
			}
		}
		putBuf(b)
		t.pending[i] = nil
	}
	t.pending = t.pending[:0]
	if err != nil && t.err == nil {
		t.err = err
	}
	return err
}

// dropQueued releases the queued buffers unwritten (the file is removed).
func (t *tempFile) dropQueued() {
	if t.g != nil {
		t.g.npending -= len(t.pending)
	}
	for _, b := range t.pending {
		putBuf(b)
	}
	t.pending = nil
}

// frameJob is one distinct buffer of a drain and its zstd frame.
type frameJob struct {
	raw   []byte
	frame *[]byte // from frameBufs
	err   error
}

// drain writes every queued buffer of the generation and returns the write
// errors. With zstd it first compresses each distinct buffer once (a table
// in two flows fills equal buffers in both flows' files), spread over up
// to drainWorkers goroutines; then the files are written, spread likewise.
func (g *generation) drain() error {
	files := g.pending
	g.pending, g.npending = nil, 0
	if len(files) == 0 {
		return nil
	}
	for _, t := range files {
		t.queued = false
	}
	var per [][]*frameJob
	if g.compr == sink.CompressionZstd {
		var jobs []*frameJob
		jobs, per = distinctBuffers(files)
		parallel(len(jobs), func(i int) {
			j := jobs[i]
			j.frame = frameBufs.Get().(*[]byte)
			*j.frame, j.err = sink.AppendZstdFrame((*j.frame)[:0], j.raw)
		})
		defer func() {
			for _, j := range jobs {
				putFrameBuf(j.frame)
			}
		}()
	}
	errs := make([]error, len(files))
	parallel(len(files), func(i int) {
		var frames []*frameJob
		if per != nil {
			frames = per[i]
		}
		errs[i] = files[i].writePending(frames)
	})
	return errors.Join(errs...)
}

// distinctBuffers lists the distinct buffers queued on files, and for each
// file the job of each of its buffers. Equal buffers are looked for only
// among siblings, files whose keys differ in the flow alone: they get the
// same entries when their table is in several flows. (A mismatch shows in
// the first bytes, the entry's key, so comparing costs little.)
func distinctBuffers(files []*tempFile) (jobs []*frameJob, per [][]*frameJob) {
	seen := map[fileKey][]*frameJob{}
	per = make([][]*frameJob, len(files))
	for i, t := range files {
		per[i] = make([]*frameJob, len(t.pending))
		sibling := t.key
		sibling.flow = 0
		for k, b := range t.pending {
			var job *frameJob
			for _, j := range seen[sibling] {
				if bytes.Equal(j.raw, b) {
					job = j
					break
				}
			}
			if job == nil {
				job = &frameJob{raw: b}
				seen[sibling] = append(seen[sibling], job)
				jobs = append(jobs, job)
			}
			per[i][k] = job
		}
	}
	return jobs, per
}

// parallel calls fn(0..n-1) on up to drainWorkers goroutines (no more than
// GOMAXPROCS) and waits for them.
func parallel(n int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), drainWorkers, n)
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}
