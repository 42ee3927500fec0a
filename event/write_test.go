package event

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestDecodeWrite(t *testing.T) {
	uv := func(x uint64) []byte { return binary.AppendUvarint(nil, x) }
	tests := []struct {
		name string
		v    []byte
		want Write
	}{
		{"seed: put with short value", cat([]byte{'P'}, uv(12345678), []byte{'v', 5}, []byte("hello")),
			Write{Type: WritePut, StartTS: 12345678, ShortValue: []byte("hello"), HasShortValue: true}},
		{"put without value", cat([]byte{'P'}, uv(431656320867237891)), Write{Type: WritePut, StartTS: 431656320867237891}},
		{"delete", cat([]byte{'D'}, uv(1)), Write{Type: WriteDelete, StartTS: 1}},
		{"lock", cat([]byte{'L'}, uv(0)), Write{Type: WriteLock}},
		{"empty short value", cat([]byte{'P'}, uv(9), []byte{'v', 0}), Write{Type: WritePut, StartTS: 9, ShortValue: []byte{}, HasShortValue: true}},
		{"rollback with overlapped flag", cat([]byte{'R'}, uv(7), []byte{'R'}), Write{Type: WriteRollback, StartTS: 7}},
		{"all optional fields", cat([]byte{'P'}, uv(300), []byte{'R', 'F'}, make([]byte, 8), []byte{'l'}, make([]byte, 8), uv(1000),
			[]byte{'S'}, uv(2), []byte{'v', 2, 'h', 'i'}),
			Write{Type: WritePut, StartTS: 300, ShortValue: []byte("hi"), HasShortValue: true}},
		{"stops at unknown flag", cat([]byte{'P'}, uv(5), []byte{'v', 1, 'x', 'Z', 0xFF}),
			Write{Type: WritePut, StartTS: 5, ShortValue: []byte("x"), HasShortValue: true}},
		{"unknown flag before value", cat([]byte{'P'}, uv(5), []byte{'Z', 'v', 1, 'x'}), Write{Type: WritePut, StartTS: 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := DecodeWrite(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if w.Type != tc.want.Type || w.StartTS != tc.want.StartTS || w.HasShortValue != tc.want.HasShortValue ||
				!bytes.Equal(w.ShortValue, tc.want.ShortValue) {
				t.Fatalf("DecodeWrite = %+v, want %+v", w, tc.want)
			}
		})
	}
}

func TestDecodeWriteErrors(t *testing.T) {
	tests := []struct {
		name string
		v    []byte
	}{
		{"empty", nil},
		{"unknown type", []byte{'X', 1}},
		{"no start ts", []byte{'P'}},
		{"truncated start ts", []byte{'P', 0x80}},
		{"start ts overflow", []byte{'P', 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}},
		{"short value without length", []byte{'P', 1, 'v'}},
		{"short value truncated", []byte{'P', 1, 'v', 3, 'a', 'b'}},
		{"gc fence truncated", []byte{'P', 1, 'F', 0, 0, 0}},
		{"last change without varint", cat([]byte{'P', 1, 'l'}, make([]byte, 8))},
		{"txn source truncated", []byte{'P', 1, 'S', 0x80}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeWrite(tc.v)
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != ReasonWrite {
				t.Fatalf("DecodeWrite(%x) = %v, want reason %q", tc.v, err, ReasonWrite)
			}
		})
	}
}

func TestAppendWrite(t *testing.T) {
	tests := []struct {
		name    string
		w       Write
		wantErr bool
	}{
		{"put with value", Write{Type: WritePut, StartTS: 12345678, ShortValue: []byte("v"), HasShortValue: true}, false},
		{"put with 255-byte value", Write{Type: WritePut, StartTS: 1, ShortValue: make([]byte, 255), HasShortValue: true}, false},
		{"delete", Write{Type: WriteDelete, StartTS: 1 << 60}, false},
		{"value ignored without flag", Write{Type: WritePut, StartTS: 2, ShortValue: make([]byte, 300)}, false},
		{"256-byte value", Write{Type: WritePut, ShortValue: make([]byte, 256), HasShortValue: true}, true},
		{"unknown type", Write{Type: 'Q'}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := AppendWrite([]byte("pre"), tc.w)
			if tc.wantErr {
				if err == nil || string(out) != "pre" {
					t.Fatalf("AppendWrite = %q, %v; want dst unchanged and an error", out, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w, err := DecodeWrite(out[3:])
			if err != nil {
				t.Fatal(err)
			}
			if w.Type != tc.w.Type || w.StartTS != tc.w.StartTS || w.HasShortValue != tc.w.HasShortValue ||
				(tc.w.HasShortValue && !bytes.Equal(w.ShortValue, tc.w.ShortValue)) {
				t.Fatalf("round trip = %+v, want %+v", w, tc.w)
			}
		})
	}
}
