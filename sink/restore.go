package sink

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/flowlog/flowlog/event"
)

// RestoreOptions says what Restore reads and where it writes.
type RestoreOptions struct {
	// Bucket holds the backup.
	Bucket Bucket
	// MetaPaths are the flow's committed meta objects (metas:<flow_id>).
	MetaPaths []string
	// TS is the timestamp to restore as of; the caller checks it does not
	// exceed the flow's checkpoint.
	TS uint64
	// Tables restricts the restore to these table ids; nil means all.
	Tables map[int64]bool
	// OutDir receives <table_id>.jsonl per table.
	OutDir string
	// TempDir holds sorted runs while restoring (default os.TempDir()).
	TempDir string
	// MaxMemory bounds what the restore buffers (default 256 MiB): the
	// chunk readers' batches come out of it and the rest holds the sorted
	// runs of write records and default-CF values before they are spilled
	// to TempDir. The Go runtime and zstd decoders come on top.
	MaxMemory int64
	// Parallel is the number of chunks read at once (default 4).
	Parallel int
}

// RestoreStats summarises a restore.
type RestoreStats struct {
	Tables   int   // jsonl files written
	Keys     int64 // live keys written
	LogBytes int64 // uncompressed chunk bytes read and checked
	Chunks   int   // chunks read
}

// Restore rebuilds tables as of o.TS from a flow's backup, as TiKV reads
// MVCC data: for each key the newest write-CF record with commit ts <= TS,
// skipping lock and rollback records; a delete means the key is absent; a
// put's value is its short value, else the default-CF entry at (key,
// start_ts). It writes OutDir/<table_id>.jsonl, one line per live key in raw
// key order: {"key": hex, "value": base64, "commit_ts": N}. There is a file
// (possibly empty) for every table in o.Tables and every table with a
// write-CF record at or below TS; a table with none has no file.
//
// Only the chunks that can matter are read, each with one range read and its
// sha256 checked: not meta-key chunks, not chunks of other tables, not chunks
// whose min_ts is past TS, and not delete-op chunks (a CF delete carries no
// write record; TiKV emits them only for garbage-collected versions).
// Memory stays bounded: write records and default-CF values go through
// external sorts keyed by the stored data key (memcomparable raw key, then
// ts descending) and are merge-joined, so no table is held in memory.
func Restore(ctx context.Context, o RestoreOptions) (RestoreStats, error) {
	var st RestoreStats
	if o.MaxMemory <= 0 {
		o.MaxMemory = 256 << 20
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return st, fmt.Errorf("restore: %w", err)
	}
	tmp, err := os.MkdirTemp(o.TempDir, "flowlog-restore-")
	if err != nil {
		return st, fmt.Errorf("restore: temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	jobs, err := planChunks(ctx, o)
	if err != nil {
		return st, err
	}
	// The readers' batches and buffers come out of the budget; the sorters
	// share the rest.
	sortMem := max(o.MaxMemory-readerMemory(o.Parallel), 0)
	writes := newExtSorter(tmp, "write", int(sortMem/2))
	defer writes.close()
	defaults := newExtSorter(tmp, "default", int(sortMem/2))
	defer defaults.close()
	tables := map[int64]bool{}
	for id, ok := range o.Tables {
		if ok {
			tables[id] = true
		}
	}
	err = readChunks(ctx, o, jobs, func(j chunkJob, key, value []byte) error {
		_, ts, err := event.SplitDataKey(key)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", j.index, j.path, err)
		}
		if ts > o.TS {
			return nil
		}
		if j.f.CF == CFDefault {
			return defaults.add(key, value)
		}
		w, err := event.DecodeWrite(value)
		if err != nil {
			return fmt.Errorf("chunk %d of %s: %w", j.index, j.path, err)
		}
		tables[j.f.TableID] = true
		if w.Type == event.WriteLock || w.Type == event.WriteRollback {
			return nil
		}
		return writes.add(key, value)
	}, &st)
	if err != nil {
		return st, err
	}
	return st, writeTables(o, writes, defaults, tables, &st)
}

type chunkJob struct {
	path  string
	index int
	f     FileMeta
}

// planChunks reads the metas and lists the chunks the restore needs.
func planChunks(ctx context.Context, o RestoreOptions) ([]chunkJob, error) {
	var jobs []chunkJob
	for _, mp := range o.MetaPaths {
		m, err := readMeta(ctx, o.Bucket, mp)
		if err != nil {
			return nil, err
		}
		for i, f := range m.Files {
			if f.IsMeta || f.Op != OpPut || f.MinTS > o.TS || f.NumberOfEntries == 0 && f.RawLength == 0 {
				continue
			}
			if o.Tables != nil && !o.Tables[f.TableID] {
				continue
			}
			jobs = append(jobs, chunkJob{path: m.DataPath, index: i, f: f})
		}
	}
	return jobs, nil
}

// readMeta reads and decodes one meta object.
func readMeta(ctx context.Context, b Bucket, path string) (Meta, error) {
	rc, err := b.Get(ctx, path)
	if err != nil {
		return Meta{}, fmt.Errorf("read meta: %w", err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, 256<<20))
	if err != nil {
		return Meta{}, fmt.Errorf("read meta %s: %w", path, err)
	}
	m, err := DecodeMeta(raw)
	if err != nil {
		return Meta{}, &badMetaError{path: path, err: err}
	}
	return m, nil
}

// badMetaError is a meta object that exists but does not decode.
type badMetaError struct {
	path string
	err  error
}

func (e *badMetaError) Error() string { return fmt.Sprintf("meta %s: %v", e.path, e.err) }
func (e *badMetaError) Unwrap() error { return e.err }

// entryBatch is a run of framed entries of one chunk, handed from a reader
// goroutine to the restore loop.
type entryBatch struct {
	job  chunkJob
	data []byte
	done bool // last batch of the chunk, verified
}

// readChunks reads the jobs' chunks with o.Parallel goroutines, which
// decompress, check and split them into batches of entries; fn sees every
// entry on the calling goroutine. A chunk's entries are all delivered before
// its checksum is known, so a corrupt chunk fails the whole restore.
func readChunks(parent context.Context, o RestoreOptions, jobs []chunkJob, fn func(j chunkJob, key, value []byte) error, st *RestoreStats) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	jobc := make(chan chunkJob)
	batches := make(chan entryBatch, o.Parallel)
	errc := make(chan error, o.Parallel+1)
	var wg sync.WaitGroup
	for range o.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobc {
				if err := streamChunk(ctx, o.Bucket, j, batches); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		}()
	}
	go func() {
		defer close(jobc)
		for _, j := range jobs {
			select {
			case jobc <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() { wg.Wait(); close(batches) }()

	var ferr error
	for b := range batches {
		if ferr != nil {
			continue // drain so the readers can finish
		}
		rest := b.data
		for len(rest) > 0 {
			k, v, r, err := event.NextEntry(rest)
			if err != nil {
				ferr = fmt.Errorf("chunk %d of %s: %w", b.job.index, b.job.path, err)
				cancel()
				break
			}
			if err := fn(b.job, k, v); err != nil {
				ferr = err
				cancel()
				break
			}
			rest = r
		}
		if b.done {
			st.Chunks++
			st.LogBytes += b.job.f.RawLength
		}
		putBatchBuf(b.data)
	}
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

const batchSize = 1 << 20

// readerMemory approximates what parallel chunk readers hold: per reader a
// batch being filled, one queued in the channel and a read buffer.
func readerMemory(parallel int) int64 {
	return int64(parallel) * (2*(batchSize+64<<10) + 256<<10)
}

// batchBufs recycles entry batches between the chunk readers and the
// restore loop.
var batchBufs sync.Pool

func getBatchBuf() []byte {
	if p, ok := batchBufs.Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, batchSize+64<<10)
}

func putBatchBuf(b []byte) {
	if cap(b) >= batchSize && cap(b) <= 4*batchSize { // keep only ordinary batches
		batchBufs.Put(&b)
	}
}

// streamChunk reads one chunk and sends its entries in batches of whole
// entries; the last batch is sent only after the chunk verified.
func streamChunk(ctx context.Context, b Bucket, j chunkJob, out chan<- entryBatch) error {
	r, err := OpenChunk(ctx, b, j.path, j.index, j.f)
	if err != nil {
		return err
	}
	defer r.Close()
	br := bufio.NewReaderSize(r, 256<<10)
	buf := getBatchBuf()
	var hdr [4]byte
	for {
		n, err := io.ReadFull(br, hdr[:])
		if errors.Is(err, io.EOF) && n == 0 {
			break
		}
		if err != nil {
			return chunkErr(j, err)
		}
		klen := int(uint32(hdr[0]) | uint32(hdr[1])<<8 | uint32(hdr[2])<<16 | uint32(hdr[3])<<24)
		buf = append(buf, hdr[:]...)
		if buf, err = readN(br, buf, klen); err != nil {
			return chunkErr(j, err)
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return chunkErr(j, err)
		}
		vlen := int(uint32(hdr[0]) | uint32(hdr[1])<<8 | uint32(hdr[2])<<16 | uint32(hdr[3])<<24)
		buf = append(buf, hdr[:]...)
		if buf, err = readN(br, buf, vlen); err != nil {
			return chunkErr(j, err)
		}
		if len(buf) >= batchSize {
			select {
			case out <- entryBatch{job: j, data: buf}:
			case <-ctx.Done():
				return ctx.Err()
			}
			buf = getBatchBuf()
		}
	}
	select {
	case out <- entryBatch{job: j, data: buf, done: true}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readN appends n bytes of r to buf, growing it in steps so that a corrupt
// length cannot allocate more than the chunk holds (the chunk reader stops at
// raw_length+1 bytes).
func readN(r io.Reader, buf []byte, n int) ([]byte, error) {
	for n > 0 {
		step := min(n, 1<<20)
		buf = slicesGrow(buf, step)
		m, err := io.ReadFull(r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, err
		}
		n -= step
	}
	return buf, nil
}

func slicesGrow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, len(b), 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// chunkErr reports a chunk that ended inside an entry. A checksum error from
// the chunk reader takes precedence: it names the object and chunk.
func chunkErr(j chunkJob, err error) error {
	var ce *ChecksumError
	if errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("chunk %d of %s: truncated entry", j.index, j.path)
	}
	return fmt.Errorf("chunk %d of %s: %w", j.index, j.path, err)
}

// writeTables runs the MVCC read over the sorted write records, joining
// default-CF values, and writes the tables' jsonl files.
func writeTables(o RestoreOptions, writes, defaults *extSorter, tables map[int64]bool, st *RestoreStats) error {
	// Both sorters sort their last run in memory: do it side by side.
	var (
		dit  sortedIter
		derr error
		done = make(chan struct{})
	)
	go func() { dit, derr = defaults.iter(); close(done) }()
	wit, err := writes.iter()
	<-done
	if wit != nil {
		defer wit.Close()
	}
	if dit != nil {
		defer dit.Close()
	}
	if err != nil {
		return err
	}
	if derr != nil {
		return derr
	}
	out := newTableWriter(o.OutDir)
	defer out.finish()

	var (
		decided  []byte // encoded key whose version has been chosen
		dkey     []byte // current default-CF head
		dval     []byte
		dok      = true
		lookup   []byte
		raw      []byte
		defStart = true
	)
	for {
		key, value, ok, err := wit.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		encoded, commitTS, err := event.SplitDataKey(key)
		if err != nil {
			return err
		}
		if decided != nil && bytes.Equal(encoded, decided) {
			continue // an older version, or a duplicate of the chosen one
		}
		// Lock and rollback records and ts > TS were dropped when read, so
		// this is the newest visible put or delete of the key.
		decided = append(decided[:0], encoded...)
		w, err := event.DecodeWrite(value)
		if err != nil {
			return err
		}
		if w.Type == event.WriteDelete {
			continue
		}
		val := w.ShortValue
		if !w.HasShortValue {
			lookup = append(append(lookup[:0], encoded...), tsBytes(w.StartTS)...)
			for dok && (defStart || bytes.Compare(dkey, lookup) < 0) {
				defStart = false
				dkey, dval, dok, err = dit.next()
				if err != nil {
					return err
				}
			}
			if !dok || !bytes.Equal(dkey, lookup) {
				tid, _ := event.TableIDOfRaw(appendRaw(nil, encoded))
				return fmt.Errorf("restore: table %d: put at commit ts %d has no short value and no default-CF entry at start ts %d", tid, commitTS, w.StartTS)
			}
			val = dval
		}
		raw = appendRaw(raw[:0], encoded)
		tid, ok := event.TableIDOfRaw(raw)
		if !ok || o.Tables != nil && !o.Tables[tid] {
			continue
		}
		if err := out.writeLine(tid, raw, val, commitTS); err != nil {
			return err
		}
		st.Keys++
	}
	// Tables whose keys are all absent at TS restore as empty files.
	for id := range tables {
		if !out.written[id] {
			if err := out.open(id); err != nil {
				return err
			}
		}
	}
	st.Tables = len(out.written)
	return out.finish()
}

func tsBytes(ts uint64) []byte {
	var b [8]byte
	x := ^ts
	for i := 7; i >= 0; i-- {
		b[i] = byte(x)
		x >>= 8
	}
	return b[:]
}
