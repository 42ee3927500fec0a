package pipeline

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Decompressed batches are pooled. Without a pool every fetched batch was
// decompressed into a buffer of its own, garbage as soon as its records
// were handled: about as many bytes allocated as the topic carries, 40% of
// the consumer's allocations, and with the heap near the Go memory limit
// (thousands of busy temp files) each few MB allocated was a collection.
//
// The consumer's client is given the batchDecompressor as a kgo pool
// (kgo.WithPools): the client puts a batch's buffer back
// (PutDecompressBytes, zeroed) once every record decoded from it has been
// recycled (kgo.Record.Recycle), which the consume loop does after a record
// is handled, its keys and values copied into temp files. Nothing of a
// record is kept past that point (the DLQ is written synchronously).
//
// Buffers are kept by size class, four classes per doubling from 4 KiB:
// a buffer is at most a quarter larger than its batch, and an idle
// consumer's pools empty at the next collections.

// decompressClassCount is the number of buffer sizes: 4 per doubling
// from 4 KiB up to 1 GiB.
const decompressClassCount = 18 * 4

// decompressClasses are the buffer sizes pooled, ascending.
var decompressClasses = func() []int {
	s := make([]int, 0, decompressClassCount)
	for p := 4 << 10; len(s) < decompressClassCount; p <<= 1 {
		for q := range 4 {
			s = append(s, p+q*p/4)
		}
	}
	return s
}()

// decompressPool holds decompression buffers by size class. Its pools are
// sync.Pools: a buffer kept is live heap, and with the heap near the Go
// memory limit a free list of a fixed size made the collector run more
// often than the buffers it saved (docs/SIZING.md, "Width: many flows,
// tables and regions (layout v2)").
type decompressPool struct {
	classes [decompressClassCount]sync.Pool

	// gets, reused and puts count the buffers asked for, those of them
	// a pool had, and those given back.
	gets, reused, puts atomic.Int64
}

// get returns an empty buffer of capacity at least n.
func (p *decompressPool) get(n int) []byte {
	p.gets.Add(1)
	i, _ := slices.BinarySearch(decompressClasses, n)
	if i >= len(decompressClasses) {
		return make([]byte, 0, n)
	}
	if b, ok := p.classes[i].Get().(*[]byte); ok {
		p.reused.Add(1)
		return (*b)[:0]
	}
	return make([]byte, 0, decompressClasses[i])
}

// put keeps b for a later get of at most its capacity.
func (p *decompressPool) put(b []byte) {
	p.puts.Add(1)
	// The largest class b holds: the one below the first class past cap.
	i, found := slices.BinarySearch(decompressClasses, cap(b))
	if !found {
		i--
	}
	if i < 0 || i >= len(decompressClasses) {
		return
	}
	b = b[:0]
	p.classes[i].Put(&b)
}

var _ kgo.PoolDecompressBytes = (*batchDecompressor)(nil)

// GetDecompressBytes implements kgo.PoolDecompressBytes. The client calls
// it only for its own decompressor, which the consumer replaces; it is here
// for the interface, sized for a batch that decompresses to four times its
// size.
func (d *batchDecompressor) GetDecompressBytes(compressed []byte, _ kgo.CompressionCodecType) []byte {
	return d.bufs.get(min(4*len(compressed), d.batchMax+1))
}

// PutDecompressBytes implements kgo.PoolDecompressBytes: the client gives
// back a batch's buffer once every record of it was recycled.
func (d *batchDecompressor) PutDecompressBytes(b []byte) { d.bufs.put(b) }
