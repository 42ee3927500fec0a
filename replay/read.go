package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/flowlog/flowlog/sink"
)

// budget is a count of bytes that readers take before they read a chunk
// and give back once it was replayed.
type budget struct {
	mu   sync.Mutex
	cond *sync.Cond
	left int64
	max  int64
}

func newBudget(n int64) *budget {
	b := &budget{left: n, max: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// take waits until n bytes (at most the whole budget) are free and takes
// them; it returns what it took, or false if ctx ended.
func (b *budget) take(ctx context.Context, n int64) (int64, bool) {
	n = min(n, b.max)
	stop := context.AfterFunc(ctx, func() { b.mu.Lock(); b.cond.Broadcast(); b.mu.Unlock() })
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.left < n {
		if ctx.Err() != nil {
			return 0, false
		}
		b.cond.Wait()
	}
	b.left -= n
	return n, true
}

func (b *budget) give(n int64) {
	b.mu.Lock()
	b.left += n
	b.cond.Broadcast()
	b.mu.Unlock()
}

// fetched is a chunk read ahead: its verified bytes, or the error.
type fetched struct {
	data  []byte
	taken int64
	err   error
}

// readAhead reads the chunks of jobs with parallel readers, each chunk
// whole and checked (sink.ReadChunk), holding at most mem bytes of chunks
// at once (a chunk larger than mem is read alone), and hands them to fn in
// job order. fn's bytes are valid only during the call.
func readAhead(ctx context.Context, b sink.Bucket, jobs []job, parallel int, mem int64, fn func(i int, data []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	bud := newBudget(mem)
	slots := make(chan chan fetched, parallel)
	sem := make(chan struct{}, parallel)
	go func() {
		defer close(slots)
		for i := range jobs {
			taken, ok := bud.take(ctx, jobs[i].f.RawLength)
			if !ok {
				return
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				bud.give(taken)
				return
			}
			c := make(chan fetched, 1)
			select {
			case slots <- c:
			case <-ctx.Done():
				bud.give(taken)
				<-sem
				return
			}
			go func(j *job) {
				defer func() { <-sem }()
				data, err := readChunk(ctx, b, j)
				c <- fetched{data: data, taken: taken, err: err}
			}(&jobs[i])
		}
	}()
	i := 0
	var ferr error
	for c := range slots {
		f := <-c
		if ferr == nil {
			ferr = f.err
			if ferr == nil {
				ferr = fn(i, f.data)
			}
			if ferr != nil {
				cancel()
			}
		}
		bud.give(f.taken)
		i++
	}
	if ferr != nil {
		return ferr
	}
	return ctx.Err()
}

// readChunk reads a job's chunk whole and checked. The buffer is sized by
// the meta's raw_length plus one byte, to see the end: one allocation for
// a chunk up to 64 MiB, and never more than raw_length is asked for on the
// meta's word alone (a larger one grows with the bytes really read).
func readChunk(ctx context.Context, b sink.Bucket, j *job) ([]byte, error) {
	r, err := sink.OpenChunk(ctx, b, j.dataPath, j.index, j.f)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	raw := j.f.RawLength
	buf := make([]byte, 0, min(raw, 64<<20)+1)
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > raw {
				return nil, fmt.Errorf("chunk %d of %s: more than its raw_length %d bytes", j.index, j.dataPath, raw)
			}
			buf = slices.Grow(buf, int(min(raw+1-int64(len(buf)), int64(len(buf)))))
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
