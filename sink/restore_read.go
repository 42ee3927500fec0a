package sink

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/flowlog/flowlog/event"
)

// The chunk readers' memory. A chunk's entries travel in batches of about
// batchSize; each reader fills one while up to o.Parallel wait in a channel.
// An entry larger than what is left of an ordinary batch grows that batch
// past its size: only one reader at a time may hold such an oversized batch
// (it takes bigBatch and the restore loop gives it back once it has used the
// batch), and no entry may exceed maxEntrySize. So a tampered chunk whose
// entry claims gigabytes fails at the length prefix, and several chunks with
// large entries cannot add up.

const batchSize = 1 << 20

// batchCap is the capacity of an ordinary batch buffer.
const batchCap = batchSize + 64<<10

// readerMemory approximates what parallel chunk readers hold: per reader a
// batch being filled, one queued in the channel and a read buffer.
func readerMemory(parallel int) int64 {
	return int64(parallel) * (2*batchCap + 256<<10)
}

// Bounds of a restore's entry size limit, which is a quarter of MaxMemory
// between them: the lower bound holds any entry the pipeline writes with
// its default --max-value-size (8 MiB for a key or a value), the upper one
// is event.EntryReader's.
const (
	minEntryLimit = 32 << 20
	maxEntryLimit = event.DefaultMaxEntrySize
)

// maxEntrySize is the largest entry (key plus value bytes) a restore with
// memory budget maxMemory reads.
func maxEntrySize(maxMemory int64) int {
	return int(min(max(maxMemory/4, minEntryLimit), maxEntryLimit))
}

// EntryTooLargeError is an entry of a chunk beyond the restore's limit
// (RestoreOptions.MaxMemory/4, at least 32 MiB and at most 256 MiB): a
// corrupt or tampered chunk, or a legitimately large entry that needs a
// larger MaxMemory.
type EntryTooLargeError struct {
	Object string // data object name
	Chunk  int    // index in the meta's files
	Size   uint64 // the entry's size as far as its length prefixes tell
	Limit  int
}

func (e *EntryTooLargeError) Error() string {
	return fmt.Sprintf("chunk %d of %s: entry of at least %d bytes exceeds the limit of %d bytes (a quarter of the memory budget, at least %d MiB, at most %d MiB)",
		e.Chunk, e.Object, e.Size, e.Limit, minEntryLimit>>20, maxEntryLimit>>20)
}

// entryBatch is a run of framed entries of one chunk, handed from a reader
// goroutine to the restore loop.
type entryBatch struct {
	job  chunkJob
	data []byte
	done bool // last batch of the chunk, verified
	big  bool // data grew past batchCap: the loop releases bigBatch after use
}

// readChunks reads the chunks jobs sends with o.Parallel goroutines, which
// decompress, check and split them into batches of entries; fn sees every
// entry on the calling goroutine. A chunk's entries are all delivered before
// its checksum is known, so a corrupt chunk fails the whole restore, and so
// does an error of jobs.
func readChunks(parent context.Context, o RestoreOptions, jobs func(ctx context.Context, send func(chunkJob) error) error, fn func(j *chunkJob, key, value []byte) error, st *RestoreStats) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	jobc := make(chan chunkJob, 64) // the metas are read while chunks are
	batches := make(chan entryBatch, o.Parallel)
	errc := make(chan error, o.Parallel+1)
	big := make(chan struct{}, 1)
	limit := maxEntrySize(o.MaxMemory)
	var wg sync.WaitGroup
	for range o.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobc {
				s := chunkStream{ctx: ctx, job: j, out: batches, big: big, limit: limit}
				if err := s.run(o.Bucket); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		}()
	}
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		defer close(jobc)
		err := jobs(ctx, func(j chunkJob) error {
			select {
			case jobc <- j:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if err != nil {
			errc <- err
			cancel()
		}
	}()
	go func() { wg.Wait(); close(batches) }()

	var ferr error
	for b := range batches {
		if ferr == nil {
			ferr = deliver(b, fn)
			if ferr != nil {
				cancel()
			}
			if b.done && ferr == nil {
				st.Chunks++
				st.LogBytes += b.job.f.RawLength
				if o.progress != nil {
					o.progress(*st)
				}
			}
		} // else drain, so that the readers can finish
		putBatchBuf(b.data)
		if b.big {
			<-big
		}
	}
	// The readers are done (batches closed); the metas' reader stops at the
	// cancellation if it has not ended, and owns errc until then.
	cancel()
	<-produced
	if ferr != nil {
		return ferr
	}
	// The first reader to fail cancelled the others; report its error, not
	// their cancellation.
	close(errc)
	var first error
	for err := range errc {
		if first == nil || errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled) {
			first = err
		}
	}
	if first != nil {
		return first
	}
	return parent.Err()
}

// deliver hands every entry of b to fn.
func deliver(b entryBatch, fn func(j *chunkJob, key, value []byte) error) error {
	rest := b.data
	for len(rest) > 0 {
		k, v, r, err := event.NextEntry(rest)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", b.job.index, b.job.path, err)
		}
		if err := fn(&b.job, k, v); err != nil {
			return err
		}
		rest = r
	}
	return nil
}

// batchBufs recycles entry batches between the chunk readers and the
// restore loop.
var batchBufs sync.Pool

func getBatchBuf() []byte {
	if p, ok := batchBufs.Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, batchCap)
}

func putBatchBuf(b []byte) {
	if cap(b) == batchCap { // keep only ordinary batches
		batchBufs.Put(&b)
	}
}

// chunkStream reads one chunk and sends its entries in batches of whole
// entries; the last batch is sent only after the chunk verified.
type chunkStream struct {
	ctx     context.Context
	job     chunkJob
	out     chan<- entryBatch
	big     chan struct{} // held while buf is oversized
	limit   int           // of one entry's key + value bytes
	buf     []byte
	holding bool
}

func (s *chunkStream) run(b Bucket) error {
	j := s.job
	r, err := OpenChunk(s.ctx, b, j.path, j.index, j.f)
	if err != nil {
		return err
	}
	defer r.Close()
	defer func() {
		if s.holding { // an error before the oversized batch was sent
			<-s.big
		}
	}()
	br := bufio.NewReaderSize(r, 256<<10)
	s.buf = getBatchBuf()
	var (
		hdr     [4]byte
		entries int64
		pos     int64 // bytes of the chunk read
	)
	for {
		n, err := io.ReadFull(br, hdr[:])
		if errors.Is(err, io.EOF) && n == 0 {
			break
		}
		if err != nil {
			return chunkErr(j, err)
		}
		klen := uint64(binary.LittleEndian.Uint32(hdr[:]))
		if err := s.checkSize(klen, pos+minEntrySize); err != nil {
			return err
		}
		if err := s.appendHeader(hdr[:]); err != nil {
			return err
		}
		if err := s.readN(br, int(klen)); err != nil {
			return chunkErr(j, err)
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return chunkErr(j, err)
		}
		vlen := uint64(binary.LittleEndian.Uint32(hdr[:]))
		if err := s.checkSize(klen+vlen, pos+minEntrySize); err != nil {
			return err
		}
		if err := s.appendHeader(hdr[:]); err != nil {
			return err
		}
		if err := s.readN(br, int(vlen)); err != nil {
			return chunkErr(j, err)
		}
		entries++
		pos += int64(minEntrySize + klen + vlen)
		if len(s.buf) >= batchSize {
			if err := s.send(false); err != nil {
				return err
			}
		}
	}
	// The reader returned io.EOF: the chunk's bytes match its sha256.
	if entries != j.f.NumberOfEntries {
		return &ChecksumError{Object: j.path, Chunk: j.index, Offset: j.f.Offset,
			Err: fmt.Errorf("chunk holds %d entries, its meta says %d", entries, j.f.NumberOfEntries)}
	}
	return s.send(true)
}

// checkSize checks an entry's n key and value bytes (as far as its length
// prefixes are read) against the limit and against what the chunk holds by
// its meta, of which the entry's start and its two prefixes take framed
// bytes, before anything is allocated for it.
func (s *chunkStream) checkSize(n uint64, framed int64) error {
	j := s.job
	switch {
	case n > uint64(max(j.f.RawLength-framed, 0)): // corrupt, first: a flipped bit of a length
		return &ChecksumError{Object: j.path, Chunk: j.index, Offset: j.f.Offset,
			Err: fmt.Errorf("entry of %d bytes runs past the chunk's raw_length %d", n, j.f.RawLength)}
	case n > uint64(s.limit):
		return &EntryTooLargeError{Object: j.path, Chunk: j.index, Size: n, Limit: s.limit}
	}
	return nil
}

// send hands the batch to the restore loop, passing on bigBatch if it is
// oversized, and starts a new one.
func (s *chunkStream) send(done bool) error {
	select {
	case s.out <- entryBatch{job: s.job, data: s.buf, done: done, big: s.holding}:
		s.holding = false
		s.buf = nil
		if !done {
			s.buf = getBatchBuf()
		}
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// readN appends n bytes of r to the batch.
func (s *chunkStream) readN(r io.Reader, n int) error {
	if err := s.grow(n); err != nil {
		return err
	}
	m, err := io.ReadFull(r, s.buf[len(s.buf):len(s.buf)+n])
	s.buf = s.buf[:len(s.buf)+m]
	return err
}

// appendHeader appends a length prefix to the batch.
func (s *chunkStream) appendHeader(hdr []byte) error {
	if err := s.grow(len(hdr)); err != nil {
		return err
	}
	s.buf = append(s.buf, hdr...)
	return nil
}

// grow makes room for n more bytes (n is within the entry limit, checked
// before). Growing the batch past its capacity first takes bigBatch,
// waiting while another reader holds it, and allocates what the entry
// needs plus room for the next length prefixes, so that the oversized batch
// is allocated once per field, not doubled.
func (s *chunkStream) grow(n int) error {
	if cap(s.buf)-len(s.buf) >= n {
		return nil
	}
	if !s.holding {
		select {
		case s.big <- struct{}{}:
			s.holding = true
		case <-s.ctx.Done():
			return s.ctx.Err()
		}
	}
	nb := make([]byte, len(s.buf), len(s.buf)+n+64<<10)
	copy(nb, s.buf)
	putBatchBuf(s.buf)
	s.buf = nb
	return nil
}

// chunkErr reports a chunk that ended inside an entry. A checksum error from
// the chunk reader takes precedence: it names the object and chunk.
func chunkErr(j chunkJob, err error) error {
	var ce *ChecksumError
	if errors.As(err, &ce) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("chunk %d of %s: truncated entry", j.index, j.path)
	}
	return fmt.Errorf("chunk %d of %s: %w", j.index, j.path, err)
}
