package sinktest

import (
	"context"
	"io"
	"strings"
	"sync"

	"github.com/flowlog/flowlog/sink"
)

// ReadCounter is a bucket that counts the bytes its readers deliver: what
// the client of the wrapped bucket (the GCS client, for a GCS bucket)
// really read, by whole-object reads (Get) and ranged reads (GetRange).
type ReadCounter struct {
	sink.Bucket
	mu     sync.Mutex
	gets   int64 // bytes
	ranges int64 // bytes
	names  map[string]int64
}

// NewReadCounter wraps b.
func NewReadCounter(b sink.Bucket) *ReadCounter {
	return &ReadCounter{Bucket: b, names: map[string]int64{}}
}

// Get counts the bytes read of the object.
func (c *ReadCounter) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	rc, err := c.Bucket.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	return c.count(rc, name, &c.gets), nil
}

// GetRange counts the bytes read of the range.
func (c *ReadCounter) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	rc, err := c.Bucket.GetRange(ctx, name, off, length)
	if err != nil {
		return nil, err
	}
	return c.count(rc, name, &c.ranges), nil
}

func (c *ReadCounter) count(rc io.ReadCloser, name string, total *int64) io.ReadCloser {
	return &countedReader{ReadCloser: rc, add: func(n int) {
		c.mu.Lock()
		*total += int64(n)
		c.names[name] += int64(n)
		c.mu.Unlock()
	}}
}

// Bytes is the bytes read so far, by Get and by GetRange.
func (c *ReadCounter) Bytes() (get, ranged int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets, c.ranges
}

// Total is every byte read so far.
func (c *ReadCounter) Total() int64 {
	g, r := c.Bytes()
	return g + r
}

// BytesUnder is the bytes read so far of the objects whose names contain
// part.
func (c *ReadCounter) BytesUnder(part string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for name, b := range c.names {
		if strings.Contains(name, part) {
			n += b
		}
	}
	return n
}

// Reset forgets what was counted.
func (c *ReadCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gets, c.ranges = 0, 0
	c.names = map[string]int64{}
}

type countedReader struct {
	io.ReadCloser
	add func(int)
}

func (r *countedReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.add(n)
	return n, err
}
