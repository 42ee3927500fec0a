package sink

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrOutDirNotEmpty is returned by Restore for a non-empty OutDir without
// Force.
var ErrOutDirNotEmpty = errors.New("output directory is not empty")

// checkOutDir fails with ErrOutDirNotEmpty if dir has entries and force is
// not set; a missing dir is fine.
func checkOutDir(dir string, force bool) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("restore: output directory: %w", err)
	case len(entries) > 0 && !force:
		return fmt.Errorf("restore: %s holds %d entries (%s, ...): %w", dir, len(entries), entries[0].Name(), ErrOutDirNotEmpty)
	}
	return nil
}

// isTableFile reports whether name is <table_id>.jsonl.
func isTableFile(name string) bool {
	id, ok := strings.CutSuffix(name, ".jsonl")
	if !ok {
		return false
	}
	_, err := strconv.ParseInt(id, 10, 64)
	return err == nil
}

// createOut creates table id's file in dir (the restore's staging dir): a
// new file of mode 0600, never an existing entry and never through a
// symbolic link (O_EXCL|O_NOFOLLOW).
func createOut(dir string, id int64) (*os.File, error) {
	name := filepath.Join(dir, strconv.FormatInt(id, 10)+".jsonl")
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|oNoFollow, 0o600)
	if err != nil {
		return nil, fmt.Errorf("restore: create %s: %w", name, err)
	}
	return f, nil
}

// appendRaw appends the raw key of the memcomparable encoding enc, which
// event.SplitDataKey has validated, to dst.
func appendRaw(dst, enc []byte) []byte {
	for len(enc) >= groupLen {
		marker := enc[encGroupSize]
		if marker == 0xFF {
			dst = append(dst, enc[:encGroupSize]...)
			enc = enc[groupLen:]
			continue
		}
		pad := min(int(0xFF-marker), encGroupSize)
		return append(dst, enc[:encGroupSize-pad]...)
	}
	return dst
}

const (
	encGroupSize = 8
	groupLen     = encGroupSize + 1
)

func appendLine(b, raw, val []byte, ts uint64) []byte {
	b = append(b, `{"key":"`...)
	b = hex.AppendEncode(b, raw)
	b = append(b, `","value":"`...)
	b = base64.StdEncoding.AppendEncode(b, val)
	b = append(b, `","commit_ts":`...)
	b = strconv.AppendUint(b, ts, 10)
	return append(b, "}\n"...)
}

// outBufSize is the size of the buffers handed to the file writer.
const outBufSize = 1 << 20

// tableWriter writes the jsonl files. Keys come in raw key order, which
// groups them by table (the table id is the key's big-endian prefix), so one
// file is open at a time. Lines are encoded on the caller's goroutine into
// a buffer; full buffers are written, and files closed, by a writer
// goroutine, so that the restore loop does not wait for the file system.
type tableWriter struct {
	dir     string
	id      int64
	f       *os.File
	buf     []byte
	written map[int64]bool
	ops     chan writeOp
	free    chan []byte
	done    chan error
	err     error // of finish
	ended   bool
}

// writeOp is a write of data to f, then a close of f if close is set.
type writeOp struct {
	f     *os.File
	id    int64
	data  []byte
	close bool
}

func newTableWriter(dir string) *tableWriter {
	t := &tableWriter{dir: dir, written: map[int64]bool{}, buf: make([]byte, 0, outBufSize+64<<10),
		ops: make(chan writeOp, 2), free: make(chan []byte, 2), done: make(chan error, 1)}
	t.free <- make([]byte, 0, outBufSize+64<<10)
	go t.run()
	return t
}

// run executes the writes in order and reports the first error; after an
// error it only closes files and recycles buffers.
func (t *tableWriter) run() {
	var first error
	for op := range t.ops {
		if len(op.data) > 0 && first == nil {
			if _, err := op.f.Write(op.data); err != nil {
				first = fmt.Errorf("restore: write table %d: %w", op.id, err)
			}
		}
		if op.data != nil {
			t.free <- op.data[:0]
		}
		if op.close {
			if err := op.f.Close(); err != nil && first == nil {
				first = fmt.Errorf("restore: write table %d: %w", op.id, err)
			}
		}
	}
	t.done <- first
}

func (t *tableWriter) open(id int64) error {
	t.closeFile()
	if t.written[id] {
		return fmt.Errorf("restore: table %d: keys out of order", id)
	}
	f, err := createOut(t.dir, id)
	if err != nil {
		return err
	}
	t.id, t.f, t.written[id] = id, f, true
	return nil
}

// writeLine appends the jsonl line of one key to table id's file.
func (t *tableWriter) writeLine(id int64, raw, val []byte, ts uint64) error {
	if t.f == nil || t.id != id {
		if err := t.open(id); err != nil {
			return err
		}
	}
	t.buf = appendLine(t.buf, raw, val, ts)
	if len(t.buf) >= outBufSize {
		t.send(false)
	}
	return nil
}

// send hands the buffer to the writer and takes a free one.
func (t *tableWriter) send(close bool) {
	t.ops <- writeOp{f: t.f, id: t.id, data: t.buf, close: close}
	t.buf = <-t.free
}

// closeFile sends the rest of the open file's lines and its close.
func (t *tableWriter) closeFile() {
	if t.f != nil {
		t.send(true)
		t.f = nil
	}
}

// finish closes the open file, waits for the writer and returns its first
// error. It may be called more than once.
func (t *tableWriter) finish() error {
	if t.ended {
		return t.err
	}
	t.ended = true
	t.closeFile()
	close(t.ops)
	t.err = <-t.done
	return t.err
}
