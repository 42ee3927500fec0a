package event

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"
)

var testEntries = []struct{ key, value []byte }{
	{[]byte("k1"), []byte("value one")},
	{nil, nil},
	{[]byte("k3"), nil},
	{bytes.Repeat([]byte{'x'}, 3<<20), []byte("big key, spans several read chunks")},
}

func framed() []byte {
	var b []byte
	for _, e := range testEntries {
		n := len(b)
		b = AppendEntry(b, e.key, e.value)
		if len(b)-n != EntrySize(e.key, e.value) {
			panic("EntrySize disagrees with AppendEntry")
		}
	}
	return b
}

func TestEntryFraming(t *testing.T) {
	if got := AppendEntry(nil, []byte("ab"), []byte("c")); !bytes.Equal(got, []byte{2, 0, 0, 0, 'a', 'b', 1, 0, 0, 0, 'c'}) {
		t.Fatalf("AppendEntry = %x", got)
	}
	b := framed()
	readers := []struct {
		name string
		r    io.Reader
	}{
		{"bytes", bytes.NewReader(b)},
		{"one byte at a time", iotest.OneByteReader(bytes.NewReader(b))},
	}
	for _, rc := range readers {
		t.Run(rc.name, func(t *testing.T) {
			er := NewEntryReader(rc.r)
			rest := b
			for i, want := range testEntries {
				k, v, err := er.Next()
				if err != nil {
					t.Fatalf("entry %d: %v", i, err)
				}
				if !bytes.Equal(k, want.key) || !bytes.Equal(v, want.value) {
					t.Fatalf("entry %d: reader got %d/%d bytes, want %d/%d", i, len(k), len(v), len(want.key), len(want.value))
				}
				var k2, v2 []byte
				if k2, v2, rest, err = NextEntry(rest); err != nil {
					t.Fatalf("NextEntry %d: %v", i, err)
				}
				if !bytes.Equal(k2, want.key) || !bytes.Equal(v2, want.value) {
					t.Fatalf("NextEntry %d: wrong entry", i)
				}
			}
			if _, _, err := er.Next(); err != io.EOF {
				t.Fatalf("after the last entry: %v, want io.EOF", err)
			}
			if len(rest) != 0 {
				t.Fatalf("%d bytes left", len(rest))
			}
		})
	}
}

func TestEntryTruncation(t *testing.T) {
	b := AppendEntry(nil, []byte("key"), []byte("value"))
	for cut := 1; cut < len(b); cut++ {
		if _, _, _, err := NextEntry(b[:cut]); !isFrameErr(err) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("NextEntry cut at %d: %v", cut, err)
		}
		er := NewEntryReader(bytes.NewReader(b[:cut]))
		if _, _, err := er.Next(); !isFrameErr(err) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("EntryReader cut at %d: %v", cut, err)
		}
	}
}

func TestEntryReaderLimit(t *testing.T) {
	tests := []struct {
		name  string
		input []byte
		limit int
		ok    bool
	}{
		{"within limit", AppendEntry(nil, []byte("key"), []byte("value")), 8, true},
		{"value over limit", AppendEntry(nil, []byte("key"), []byte("value")), 7, false},
		{"key over limit", AppendEntry(nil, []byte("key"), nil), 2, false},
		{"corrupt 4 GiB length", []byte{0xFF, 0xFF, 0xFF, 0xFF, 'x'}, DefaultMaxEntrySize, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			er := NewEntryReader(bytes.NewReader(tc.input))
			er.SetMaxEntrySize(tc.limit)
			_, _, err := er.Next()
			if tc.ok != (err == nil) || (!tc.ok && !isFrameErr(err)) {
				t.Fatalf("Next = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	// A corrupt length below the limit over a short stream fails without
	// allocating the announced size.
	input := []byte{0x00, 0x00, 0x00, 0x0F, 'x'} // 240 MiB key, 1 byte present
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, _, err := NewEntryReader(bytes.NewReader(input)).Next(); !isFrameErr(err) {
		t.Fatalf("Next = %v", err)
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 8<<20 {
		t.Fatalf("truncated 240 MiB entry allocated %d bytes", n)
	}
}

func TestEntryReaderPassesReadErrors(t *testing.T) {
	boom := errors.New("disk on fire")
	er := NewEntryReader(iotest.ErrReader(boom))
	if _, _, err := er.Next(); !errors.Is(err, boom) {
		t.Fatalf("Next = %v, want %v", err, boom)
	}
}

func isFrameErr(err error) bool {
	var de *DecodeError
	return errors.As(err, &de) && de.Reason == ReasonFrame
}
