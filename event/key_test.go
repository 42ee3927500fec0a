package event

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i + 1)
	}
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestEncodeBytes(t *testing.T) {
	z := func(n int) []byte { return make([]byte, n) }
	tests := []struct {
		name string
		raw  []byte
		want []byte
	}{
		{"len 0", nil, cat(z(8), []byte{0xF7})},
		{"len 3 with zero", []byte{1, 2, 0}, []byte{1, 2, 0, 0, 0, 0, 0, 0, 0xFA}},
		{"len 7", seq(7), cat(seq(7), z(1), []byte{0xFE})},
		{"len 8", seq(8), cat(seq(8), []byte{0xFF}, z(8), []byte{0xF7})},
		{"len 9", seq(9), cat(seq(8), []byte{0xFF, 9}, z(7), []byte{0xF8})},
		{"len 16", seq(16), cat(seq(8), []byte{0xFF}, seq(16)[8:], []byte{0xFF}, z(8), []byte{0xF7})},
		{"len 17", seq(17), cat(seq(8), []byte{0xFF}, seq(16)[8:], []byte{0xFF, 17}, z(7), []byte{0xF8})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			enc := EncodeBytes([]byte("prefix"), tc.raw)
			if !bytes.Equal(enc[6:], tc.want) {
				t.Fatalf("EncodeBytes = %x, want %x", enc[6:], tc.want)
			}
			if len(tc.want) != EncodedLen(len(tc.raw)) {
				t.Fatalf("EncodedLen(%d) = %d, want %d", len(tc.raw), EncodedLen(len(tc.raw)), len(tc.want))
			}
			raw, rest, err := DecodeBytes(append(enc[6:], "tail"...))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(raw, tc.raw) || string(rest) != "tail" {
				t.Fatalf("DecodeBytes = %x, %q; want %x, \"tail\"", raw, rest, tc.raw)
			}
		})
	}
}

func TestEncodeBytesPreservesOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	raws := make([][]byte, 2000)
	for i := range raws {
		// Small alphabet and lengths around group boundaries so that
		// prefixes and trailing zeros are common.
		raws[i] = make([]byte, rng.IntN(26))
		for j := range raws[i] {
			raws[i][j] = []byte{0, 1, 0xF7, 0xFF}[rng.IntN(4)]
		}
	}
	encs := make([][]byte, len(raws))
	for i, r := range raws {
		encs[i] = EncodeBytes(nil, r)
	}
	for i := 1; i < len(raws); i++ {
		if got, want := bytes.Compare(encs[i-1], encs[i]), bytes.Compare(raws[i-1], raws[i]); got != want {
			t.Fatalf("order of %x vs %x: encoded %d, raw %d", raws[i-1], raws[i], got, want)
		}
	}
	slices.SortFunc(encs, bytes.Compare)
	slices.SortFunc(raws, bytes.Compare)
	for i := range encs {
		raw, _, err := DecodeBytes(encs[i])
		if err != nil || !bytes.Equal(raw, raws[i]) {
			t.Fatalf("sorted position %d: decoded %x (%v), want %x", i, raw, err, raws[i])
		}
	}
}

func TestDecodeBytesErrors(t *testing.T) {
	good := EncodeBytes(nil, seq(3))
	tests := []struct {
		name string
		enc  []byte
	}{
		{"empty", nil},
		{"short group", good[:8]},
		{"missing final group", EncodeBytes(nil, seq(8))[:9]},
		{"marker below 0xF7", cat(seq(8), []byte{0xF6})},
		{"non-zero padding", []byte{1, 2, 3, 0, 0, 0, 1, 0, 0xFA}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodeBytes(tc.enc)
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != ReasonKey {
				t.Fatalf("DecodeBytes(%x) = %v, want reason %q", tc.enc, err, ReasonKey)
			}
		})
	}
}

func TestDataKey(t *testing.T) {
	tests := []struct {
		name string
		raw  []byte
		ts   uint64
	}{
		{"row", RowKey(42, -7), 431656320867237891},
		{"empty raw, zero ts", nil, 0},
		{"meta, max ts", []byte("mDB:1\x00"), math.MaxUint64},
		{"len 8", seq(8), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := AppendDataKey(nil, tc.raw, tc.ts)
			enc, ts, err := SplitDataKey(key)
			if err != nil {
				t.Fatal(err)
			}
			if ts != tc.ts || !bytes.Equal(enc, EncodeBytes(nil, tc.raw)) {
				t.Fatalf("SplitDataKey = %x, %d; want %x, %d", enc, ts, EncodeBytes(nil, tc.raw), tc.ts)
			}
			raw, ts, err := DecodeDataKey(key)
			if err != nil || ts != tc.ts || !bytes.Equal(raw, tc.raw) {
				t.Fatalf("DecodeDataKey = %x, %d, %v; want %x, %d", raw, ts, err, tc.raw, tc.ts)
			}
		})
	}
	// Newer versions of a key sort first.
	if bytes.Compare(AppendDataKey(nil, []byte("k"), 20), AppendDataKey(nil, []byte("k"), 10)) >= 0 {
		t.Fatal("data key at ts 20 does not sort before ts 10")
	}
}

func TestSplitDataKeyErrors(t *testing.T) {
	ts := []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFE}
	tests := []struct {
		name string
		key  []byte
	}{
		{"empty", nil},
		{"8 bytes", ts},
		{"lock key without ts", EncodeBytes(nil, RowKey(1, 1))},
		{"ts cut short", AppendDataKey(nil, RowKey(1, 1), 5)[:36]},
		{"extra byte", cat(EncodeBytes(nil, seq(3)), []byte{0}, ts)},
		{"bad marker", cat(seq(8), []byte{0x01}, ts)},
		{"non-zero padding", cat([]byte{1, 2, 3, 0, 0, 0, 1, 0, 0xFA}, ts)},
		{"unterminated", cat(seq(8), []byte{0xFF}, ts)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := SplitDataKey(tc.key)
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != ReasonKeyTS {
				t.Fatalf("SplitDataKey(%x) = %v, want reason %q", tc.key, err, ReasonKeyTS)
			}
			if _, _, err := DecodeDataKey(tc.key); !errors.As(err, &de) || de.Reason != ReasonKeyTS {
				t.Fatalf("DecodeDataKey(%x) = %v, want reason %q", tc.key, err, ReasonKeyTS)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name    string
		raw     []byte
		kind    KeyKind
		tableID int64
	}{
		{"row key", RowKey(42, 1), KindTable, 42},
		{"table prefix only", TablePrefix(7), KindTable, 7},
		{"negative table id", RowKey(-3, 1), KindTable, -3},
		{"max table id", TablePrefix(math.MaxInt64), KindTable, math.MaxInt64},
		{"t and 7 bytes", TablePrefix(7)[:8], KindBadTable, 0},
		{"bare t", []byte("t"), KindBadTable, 0},
		{"meta", []byte("mDBs"), KindMeta, 0},
		{"bare m", []byte("m"), KindMeta, 0},
		{"long meta", []byte("mTable:12345678901234567890"), KindMeta, 0},
		{"empty", nil, KindOther, 0},
		{"other", []byte("zzz"), KindOther, 0},
		{"leading zero", []byte{0, 't'}, KindOther, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, enc := range [][]byte{EncodeBytes(nil, tc.raw), AppendDataKey(nil, tc.raw, 99)} {
				kind, id := Classify(enc)
				if kind != tc.kind || id != tc.tableID {
					t.Fatalf("Classify(%x) = %v, %d; want %v, %d", enc, kind, id, tc.kind, tc.tableID)
				}
			}
			id, ok := TableIDOfRaw(tc.raw)
			if ok != (tc.kind == KindTable) || id != tc.tableID {
				t.Fatalf("TableIDOfRaw = %d, %v", id, ok)
			}
		})
	}
	if kind, _ := Classify([]byte{'t', 0x80, 0, 0, 0, 0, 0, 0, 0xFF}); kind != KindBadTable {
		t.Fatalf("truncated second group classified as %v", kind)
	}
	enc := AppendDataKey(nil, RowKey(1, 1), 1)
	if n := testing.AllocsPerRun(100, func() { Classify(enc) }); n != 0 {
		t.Fatalf("Classify allocates %v times", n)
	}
}

func TestRowKeyLayout(t *testing.T) {
	want := []byte{'t', 0x80, 0, 0, 0, 0, 0, 0, 0x2A, '_', 'r', 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}
	if got := RowKey(42, -1); !bytes.Equal(got, want) {
		t.Fatalf("RowKey(42, -1) = %x, want %x", got, want)
	}
	if !bytes.HasPrefix(RowKey(42, 5), TablePrefix(42)) {
		t.Fatal("RowKey does not start with TablePrefix")
	}
	// Table ids and handles sort numerically, negatives first.
	if bytes.Compare(RowKey(-1, 0), RowKey(1, 0)) >= 0 || bytes.Compare(RowKey(1, -5), RowKey(1, 3)) >= 0 {
		t.Fatal("row keys do not sort numerically")
	}
}
