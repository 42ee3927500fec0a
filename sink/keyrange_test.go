package sink

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/flowlog/flowlog/event"
)

// A key range decides tables, chunks and keys consistently: a chunk it
// skips holds no key it holds, also when a chunk's keys are cut to a
// prefix.
func TestKeyRange(t *testing.T) {
	row := event.RowKey
	dk := func(raw []byte, ts uint64) string { return hex.EncodeToString(event.AppendDataKey(nil, raw, ts)) }
	r := KeyRange{Start: row(2, 10), End: event.TablePrefix(4)}
	for _, tc := range []struct {
		table int64
		want  bool
	}{{1, false}, {2, true}, {3, true}, {4, false}, {5, false}} {
		if got := r.HoldsTable(tc.table); got != tc.want {
			t.Errorf("HoldsTable(%d) = %v, want %v", tc.table, got, tc.want)
		}
	}
	// A row key as the end still holds the table's keys below it.
	if !(KeyRange{End: row(4, 0)}).HoldsTable(4) || !(KeyRange{Start: row(4, 0)}).HoldsTable(4) || (KeyRange{Start: event.TablePrefix(5)}).HoldsTable(4) || !(KeyRange{}).HoldsTable(-7) {
		t.Error("HoldsTable at a table's first key or with no bounds")
	}
	for _, tc := range []struct {
		name       string
		start, end string
		want       bool
	}{
		{"below", dk(row(1, 0), 5), dk(row(2, 9), 5), false},
		{"ends at the start key", dk(row(1, 0), 5), dk(row(2, 10), 1), true},
		{"inside", dk(row(2, 11), 5), dk(row(3, 0), 5), true},
		{"starts at the end key", dk(row(4, 0), 9), dk(row(5, 0), 5), false},
		{"spans", dk(row(1, 0), 5), dk(row(9, 0), 5), true},
		{"no keys", "", "", true},
		{"end cut to a prefix of the start", dk(row(1, 0), 5), hex.EncodeToString(event.EncodeBytes(nil, row(2, 10))[:9]), true},
		{"end cut below the start", dk(row(1, 0), 5), hex.EncodeToString(event.EncodeBytes(nil, row(1, 10))[:12]), false},
		{"start cut past the end", hex.EncodeToString(event.EncodeBytes(nil, row(4, 1))[:18]), dk(row(5, 0), 5), false},
	} {
		if got := r.OverlapsChunk(tc.start, tc.end); got != tc.want {
			t.Errorf("%s: OverlapsChunk = %v, want %v", tc.name, got, tc.want)
		}
	}
	enc := r.encoded()
	for _, tc := range []struct {
		raw  []byte
		want bool
	}{{row(2, 9), false}, {row(2, 10), true}, {append(row(3, 5), 'x'), true}, {row(4, 0), false}, {event.TablePrefix(4), false}, {event.TablePrefix(3), true}, {event.TablePrefix(2), false}} {
		if r.Holds(tc.raw) != tc.want || enc.holds(event.EncodeBytes(nil, tc.raw)) != tc.want || enc.holds(event.AppendDataKey(nil, tc.raw, 7)) != tc.want {
			t.Errorf("%x: Holds and holds of its encoding and data key disagree or are not %v", tc.raw, tc.want)
		}
	}
	for _, tc := range []struct {
		r    KeyRange
		want bool
	}{
		{KeyRange{}, true}, {KeyRange{End: []byte("t")}, false}, {KeyRange{Start: []byte("u")}, false},
		{KeyRange{Start: []byte("t")}, true}, {KeyRange{End: []byte("t\x00\x00\x00\x00\x00\x00\x00\x00\x01")}, true}, {KeyRange{Start: []byte("m"), End: []byte("n")}, false},
	} {
		if got := tc.r.HoldsTableKeys(); got != tc.want {
			t.Errorf("HoldsTableKeys of [%q, %q) = %v, want %v", tc.r.Start, tc.r.End, got, tc.want)
		}
	}
	if err := (KeyRange{Start: row(2, 1), End: row(2, 1)}).Validate(); !errors.Is(err, ErrEmptyKeyRange) {
		t.Errorf("Validate of an empty range = %v", err)
	}
}
