package pipeline

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
)

// Full temp file buffers are not written one at a time by the consume loop:
// each is queued on its file (tempFile.pending) and the generation writes
// the queued buffers of all its files together once pendingMax of them
// wait (drain), on up to drainWorkers goroutines. A buffer's write is where
// the CPU goes (sha256, a zstd frame, the write call), so the consume loop
// thus gets as many cores as there are, where it had one.
//
// Why a file's bytes stay in order: one worker writes all the queued
// buffers of one file, oldest first, and every other write of a file (a
// large entry, its last buffer when it is closed or sealed) first writes
// what it has queued. Drains run inside the consume loop's call (append,
// touch, seal), which waits for the workers: nothing else touches a
// generation's files meanwhile, and a write error reaches the caller as
// before (and stays with its file: tempFile.err fails its cycle).

// pendingMax is how many full buffers a generation queues before it writes
// them: 2 MiB of 32 KiB buffers besides those of --max-open-files, enough
// to spread over the workers.
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
	t.buf = getBuf()
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
	return t.writePending()
}

// writePending writes and releases the queued buffers; after a failed
// write the rest are dropped (the file has lost bytes either way). The
// error is also kept in t.err.
func (t *tempFile) writePending() error {
	var err error
	for i, b := range t.pending {
		if err == nil {
			err = t.write(b)
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

// drain writes every queued buffer of the generation, files spread over
// up to drainWorkers goroutines, and returns the write errors.
func (g *generation) drain() error {
	files := g.pending
	g.pending, g.npending = nil, 0
	for _, t := range files {
		t.queued = false
	}
	workers := min(runtime.GOMAXPROCS(0), drainWorkers, len(files))
	if workers <= 1 {
		var errs []error
		for _, t := range files {
			if err := t.writePending(); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	errs := make([]error, len(files))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(files) {
					return
				}
				errs[i] = files[i].writePending()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
