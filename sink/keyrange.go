package sink

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"

	"github.com/flowlog/flowlog/event"
)

// KeyRange is a half-open range [Start, End) of raw keys (docs/RESTORE.md,
// "Selective restore"). A nil or empty Start has no lower bound, a nil or
// empty End no upper bound; the zero KeyRange holds every key.
//
// The bucket's keys are data keys, the memcomparable encoding of the raw key
// followed by the inverted ts, and the encoding sorts as the raw keys do
// and is prefix-free (docs/FORMAT.md, "Keys and timestamps"). So a data
// key's raw key is at or past Start exactly when the data key compares at or
// past Start's encoding, and it lies before End exactly when the data key
// compares before End's encoding: a chunk's start_key and end_key decide
// whether it can hold a key of the range without decoding a key.
type KeyRange struct {
	Start, End []byte
}

// ErrEmptyKeyRange is a KeyRange whose Start is not before its End.
var ErrEmptyKeyRange = errors.New("the start key is not before the end key")

// Validate fails with ErrEmptyKeyRange unless Start lies before End (when
// both are set).
func (r KeyRange) Validate() error {
	if len(r.Start) > 0 && len(r.End) > 0 && bytes.Compare(r.Start, r.End) >= 0 {
		return fmt.Errorf("key range [%x, %x): %w", r.Start, r.End, ErrEmptyKeyRange)
	}
	return nil
}

// All reports whether r holds every key.
func (r KeyRange) All() bool { return len(r.Start) == 0 && len(r.End) == 0 }

// Holds reports whether the raw key lies in r.
func (r KeyRange) Holds(raw []byte) bool {
	return (len(r.Start) == 0 || bytes.Compare(raw, r.Start) >= 0) && (len(r.End) == 0 || bytes.Compare(raw, r.End) < 0)
}

// HoldsTable reports whether some raw key of the table lies in r: the
// table's keys are those that start with event.TablePrefix(id).
func (r KeyRange) HoldsTable(id int64) bool {
	p := event.TablePrefix(id)
	// Start lies at or below some key of the table unless it is past them
	// all: greater than the prefix without starting with it.
	low := len(r.Start) == 0 || bytes.Compare(r.Start, p) <= 0 || bytes.HasPrefix(r.Start, p)
	// The prefix itself is the table's smallest possible key.
	return low && (len(r.End) == 0 || bytes.Compare(p, r.End) < 0)
}

// HoldsTableKeys reports whether some key of some table lies in r: table
// keys are exactly the keys from event.TablePrefix(math.MinInt64) ('t' and
// eight zero bytes) up to "u".
func (r KeyRange) HoldsTableKeys() bool {
	return (len(r.End) == 0 || bytes.Compare(r.End, event.TablePrefix(math.MinInt64)) > 0) &&
		(len(r.Start) == 0 || bytes.Compare(r.Start, []byte("u")) < 0)
}

// encoded is r with its bounds memcomparable-encoded, to compare data keys
// and encoded keys with.
func (r KeyRange) encoded() encRange {
	var e encRange
	if len(r.Start) > 0 {
		e.lo = event.EncodeBytes(nil, r.Start)
	}
	if len(r.End) > 0 {
		e.hi = event.EncodeBytes(nil, r.End)
	}
	return e
}

// OverlapsChunk reports whether a chunk whose smallest and largest data
// keys are the hex startKey and endKey (FileMeta.StartKey and EndKey,
// SnapshotChunk.MinKey and MaxKey) may hold a key of r. Either may be a
// prefix of the chunk's key; a chunk whose keys are missing or not hex may
// hold any key.
func (r KeyRange) OverlapsChunk(startKey, endKey string) bool {
	return r.encoded().overlaps(startKey, endKey)
}

// encRange is a KeyRange with memcomparable-encoded bounds; nil bounds are
// open.
type encRange struct {
	lo, hi []byte
}

// holds reports whether an encoded key (or a data key) lies in the range.
func (e encRange) holds(enc []byte) bool {
	return (e.lo == nil || bytes.Compare(enc, e.lo) >= 0) && (e.hi == nil || bytes.Compare(enc, e.hi) < 0)
}

// overlaps is KeyRange.OverlapsChunk.
func (e encRange) overlaps(startKey, endKey string) bool {
	// Either key may be a prefix of the chunk's key (a streamed meta cuts
	// long keys): a prefix at or past the end proves the key is too, and a
	// prefix below the start proves it only if it differs from the start
	// within its own length.
	if e.lo != nil {
		if last, err := hex.DecodeString(endKey); err == nil && len(last) > 0 && bytes.Compare(last, e.lo) < 0 && !bytes.HasPrefix(e.lo, last) {
			return false // every key of the chunk lies below the range
		}
	}
	if e.hi != nil {
		if first, err := hex.DecodeString(startKey); err == nil && len(first) > 0 && bytes.Compare(first, e.hi) >= 0 {
			return false // every key of the chunk lies at or past the end
		}
	}
	return true
}
