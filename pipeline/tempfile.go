package pipeline

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"math"
	"os"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// tempBufSize is each temp file's write buffer. Memory use is this times the
// number of open files of a generation, independent of backlog.
const tempBufSize = 32 << 10

// fileKey identifies one temp file of a generation: DESIGN section 5 keys
// files by (kafka partition, flow, table, region, cf, op, is_meta).
type fileKey struct {
	partition int32
	flow      meta.FlowID
	table     int64
	region    uint64
	cf        event.CF
	op        event.Op
	isMeta    bool
}

// tempFile is one append-only temp file. It frames entries into a buffer and
// hashes and writes the buffer when it fills, so the sha256 and stats of
// DESIGN section 5 are known when the file is frozen without reading it
// again. A tempFile is owned by one goroutine at a time: the consume loop
// while its generation is current, the flusher once frozen.
type tempFile struct {
	key  fileKey
	flow *meta.Flow
	path string

	f    *os.File
	buf  []byte
	hash hash.Hash

	size           int64 // framed bytes, buffered included
	entries        int64
	minTS, maxTS   uint64
	minBeginTS     uint64 // min start ts of write-CF puts
	minKey, maxKey []byte
	resolvedTS     uint64 // set at freeze: the region's last resolved ts
	sum            string // hex sha256, set by close
}

func newTempFile(path string, key fileKey, flow *meta.Flow) (*tempFile, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create temp file: %w", err)
	}
	return &tempFile{
		key: key, flow: flow, path: path, f: f,
		buf:        make([]byte, 0, tempBufSize),
		hash:       sha256.New(),
		minTS:      math.MaxUint64,
		minBeginTS: math.MaxUint64,
	}, nil
}

// append frames one entry. ts is the key's ts; beginTS the start ts of a
// write-CF put (0 when not applicable).
func (t *tempFile) append(key, value []byte, ts, beginTS uint64) error {
	n := event.EntrySize(key, value)
	if len(t.buf)+n > cap(t.buf) {
		if err := t.spill(); err != nil {
			return err
		}
	}
	if n > cap(t.buf) {
		// A large entry goes straight through, hashed on the way.
		big := event.AppendEntry(make([]byte, 0, n), key, value)
		t.hash.Write(big)
		if _, err := t.f.Write(big); err != nil {
			return fmt.Errorf("write %s: %w", t.path, err)
		}
	} else {
		t.buf = event.AppendEntry(t.buf, key, value)
	}
	t.size += int64(n)
	t.entries++
	t.minTS = min(t.minTS, ts)
	t.maxTS = max(t.maxTS, ts)
	if beginTS != 0 {
		t.minBeginTS = min(t.minBeginTS, beginTS)
	}
	if t.entries == 1 || bytes.Compare(key, t.minKey) < 0 {
		t.minKey = append(t.minKey[:0], key...)
	}
	if t.entries == 1 || bytes.Compare(key, t.maxKey) > 0 {
		t.maxKey = append(t.maxKey[:0], key...)
	}
	return nil
}

func (t *tempFile) spill() error {
	if len(t.buf) == 0 {
		return nil
	}
	t.hash.Write(t.buf)
	if _, err := t.f.Write(t.buf); err != nil {
		return fmt.Errorf("write %s: %w", t.path, err)
	}
	t.buf = t.buf[:0]
	return nil
}

// close writes what is buffered, closes the file and fixes the checksum. The
// file accepts nothing after it.
func (t *tempFile) close() error {
	if t.f == nil {
		return nil
	}
	err := t.spill()
	if cerr := t.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close %s: %w", t.path, cerr)
	}
	t.f, t.buf = nil, nil
	t.sum = hex.EncodeToString(t.hash.Sum(nil))
	return err
}

// remove closes (if needed) and deletes the file.
func (t *tempFile) remove() {
	if t.f != nil {
		_ = t.f.Close()
		t.f = nil
	}
	_ = os.Remove(t.path)
}

// beginTS reports min_begin_ts_in_default_cf: the min start ts of a
// write-CF chunk's puts, and min_ts for other chunks.
func (t *tempFile) beginTS() uint64 {
	if t.key.cf == event.CF_CF_WRITE && t.minBeginTS != math.MaxUint64 {
		return t.minBeginTS
	}
	return t.minTS
}
