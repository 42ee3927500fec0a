package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowlog/flowlog/sink"
)

// progressLine redraws one status line on a terminal, at most five times a
// second; elsewhere (a pipe, a file, a log collector) it stays silent, so
// that what a script reads holds only the result. Every long-running
// operator command draws one: restore, snapshot, truncate and gc. It is
// safe for concurrent use.
type progressLine struct {
	w    io.Writer
	on   bool
	mu   sync.Mutex
	last time.Time
}

// newProgressLine draws on f (stderr) if f is a terminal.
func newProgressLine(f *os.File) *progressLine {
	return &progressLine{w: f, on: isTerminal(f)}
}

// show draws the line, unless it was drawn less than 200ms ago.
func (p *progressLine) show(format string, args ...any) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\r\033[K"+format, args...)
}

// done clears the line.
func (p *progressLine) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on && !p.last.IsZero() {
		fmt.Fprint(p.w, "\r\033[K")
		p.last = time.Time{}
	}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// watchedBucket is a bucket that counts the objects it listed and read and
// reports the counts to show after each: the progress of work that only
// lists and reads (gc's plan, truncate's), without hooks in it.
type watchedBucket struct {
	sink.Bucket
	listed, read atomic.Int64
	show         func(listed, read int64)
}

// watchBucket wraps b; show is called from the goroutines that list and
// read.
func watchBucket(b sink.Bucket, show func(listed, read int64)) *watchedBucket {
	return &watchedBucket{Bucket: b, show: show}
}

func (w *watchedBucket) tick(n *atomic.Int64) {
	n.Add(1)
	w.show(w.listed.Load(), w.read.Load())
}

// List implements sink.Lister when the wrapped bucket does.
func (w *watchedBucket) List(ctx context.Context, prefix string, fn func(sink.ObjectInfo) error) error {
	l, ok := w.Bucket.(sink.Lister)
	if !ok {
		return fmt.Errorf("list %s: bucket cannot list object attributes", prefix)
	}
	return l.List(ctx, prefix, func(o sink.ObjectInfo) error { w.tick(&w.listed); return fn(o) })
}

// Iter implements sink.Bucket.
func (w *watchedBucket) Iter(ctx context.Context, prefix string, fn func(string) error) error {
	return w.Bucket.Iter(ctx, prefix, func(n string) error { w.tick(&w.listed); return fn(n) })
}

// Get implements sink.Bucket.
func (w *watchedBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	w.tick(&w.read)
	return w.Bucket.Get(ctx, name)
}

// GetRange implements sink.Bucket.
func (w *watchedBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	w.tick(&w.read)
	return w.Bucket.GetRange(ctx, name, off, length)
}
