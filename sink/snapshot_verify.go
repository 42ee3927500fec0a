package sink

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/flowlog/flowlog/event"
)

// SnapshotReport is the part of a VerifyReport about the listed snapshots.
type SnapshotReport struct {
	Snapshots      int    `json:"snapshots"`
	SnapshotTables int    `json:"snapshot_tables"`
	SnapshotChunks int    `json:"snapshot_chunks"`
	SnapshotBytes  int64  `json:"snapshot_bytes"` // uncompressed bytes checked
	NewestSnapshot uint64 `json:"newest_snapshot_ts"`
}

// verifySnapshots checks every listed snapshot of o: its snapshot.meta
// reads, validates and belongs to the flow; every table's object exists
// and holds its chunks; every chunk matches its sha256 and
// number_of_entries, its keys strictly increase (across the chunks of a
// kind too), belong to the table, and its first and last keys are its
// min_key and max_key. It marks the snapshots' objects referenced.
func verifySnapshots(ctx context.Context, o VerifyOptions, referenced map[string]bool, r *VerifyReport) error {
	for _, ref := range o.Snapshots {
		referenced[ref.Path] = true
		m, err := ReadSnapshotMeta(ctx, o.Bucket, o.Flow, ref)
		if err != nil {
			if errors.Is(err, ErrNotExist) || errors.Is(err, ErrBadSnapshotMeta) {
				r.fault("snapshot at %d: %v", ref.TS, err)
				continue
			}
			return err
		}
		r.Snapshots++
		r.NewestSnapshot = max(r.NewestSnapshot, ref.TS)
		for _, t := range m.Tables {
			referenced[t.DataPath] = true
			r.SnapshotTables++
			size, err := o.Bucket.Size(ctx, t.DataPath)
			if errors.Is(err, ErrNotExist) {
				r.fault("snapshot at %d: object %s of table %d is missing", ref.TS, t.DataPath, t.TableID)
				continue
			}
			if err != nil {
				return err
			}
			var last [2][]byte // last key of the value and the no-value chunks
			for i, c := range t.Chunks {
				if c.Offset+c.Length > size {
					r.fault("snapshot at %d: chunk %d of %s: range [%d, %d) exceeds the object's %d bytes", ref.TS, i, t.DataPath, c.Offset, c.Offset+c.Length, size)
					continue
				}
				kind := 0
				if c.NoValue {
					kind = 1
				}
				err := checkSnapChunk(ctx, o.Bucket, t, i, last[kind])
				var ce *ChecksumError
				switch {
				case err == nil:
					r.SnapshotChunks++
					r.SnapshotBytes += c.RawLength
				case errors.As(err, &ce):
					r.fault("snapshot at %d: %v", ref.TS, err)
				default:
					return err
				}
				last[kind], _ = hex.DecodeString(c.MaxKey)
			}
		}
	}
	return nil
}

// checkSnapChunk reads chunk i of table t's snapshot object through and
// checks it; prev is the last key of the chunk of the same kind before it.
// Problems with the bytes are *ChecksumErrors.
func checkSnapChunk(ctx context.Context, b Bucket, t SnapshotTable, i int, prev []byte) error {
	c := t.Chunks[i]
	bad := func(format string, args ...any) error {
		return &ChecksumError{Object: t.DataPath, Chunk: i, Offset: c.Offset, Err: fmt.Errorf(format, args...)}
	}
	rc, err := OpenChunk(ctx, b, t.DataPath, i, c.fileMeta(t.TableID))
	if err != nil {
		return err
	}
	defer rc.Close()
	er := event.NewEntryReader(bufio.NewReaderSize(rc, 64<<10))
	var (
		n           int64
		first, last []byte
	)
	for {
		k, v, err := er.Next()
		if errors.Is(err, io.EOF) {
			break // the reader checked the sha256
		}
		var ce *ChecksumError
		if errors.As(err, &ce) {
			return err
		}
		if err != nil {
			return bad("%v", err)
		}
		n++
		if prev != nil && bytes.Compare(k, prev) <= 0 {
			return bad("keys do not increase at entry %d", n)
		}
		enc, _, err := event.SplitDataKey(k)
		if err != nil {
			return bad("entry %d: %v", n, err)
		}
		if tid, ok := event.TableIDOfRaw(appendRaw(nil, enc)); !ok || tid != t.TableID {
			return bad("entry %d is not a key of table %d", n, t.TableID)
		}
		if c.NoValue && len(v) > 0 {
			return bad("entry %d of a no-value chunk has a value", n)
		}
		if first == nil {
			first = append([]byte{}, k...)
		}
		last = append(last[:0], k...)
		prev = last
	}
	switch {
	case n != c.NumberOfEntries:
		return bad("chunk holds %d entries, the snapshot meta says %d", n, c.NumberOfEntries)
	case hex.EncodeToString(first) != c.MinKey || hex.EncodeToString(last) != c.MaxKey:
		return bad("first and last keys are not the chunk's min_key and max_key")
	}
	return nil
}
