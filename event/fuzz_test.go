package event

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"
)

// Each fuzz target checks that a decoder never panics and that what it
// accepts is consistent with the matching encoder.

func FuzzDecodeBatch(f *testing.F) {
	key := AppendDataKey(nil, RowKey(1, 1), 42)
	b := &Batch{RegionID: 3, ResolvedTS: 9, Events: []Event{{Key: key, Value: []byte("v"), CF: CFWrite, Op: OpDelete}}}
	js, _ := EncodeBatchJSON(b)
	f.Add(EncodeBatch(nil, b), false)
	f.Add(js, true)
	f.Add([]byte{0x1a, 0x02, 0x18, 0x05}, false)
	f.Add([]byte(`{"regionId":"1","events":[{"cf":"CF_LOCK"}]}`), true)
	f.Fuzz(func(t *testing.T, value []byte, isJSON bool) {
		ct := ""
		if isJSON {
			ct = "application/json"
		}
		var b Batch
		err := DecodeBatch(&b, value, ct)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			return
		}
		// Whatever decodes re-encodes to something proto.Unmarshal and
		// DecodeBatch read back identically.
		wire := EncodeBatch(nil, &b)
		var m ApplyBatch
		if err := proto.Unmarshal(wire, &m); err != nil {
			t.Fatalf("proto.Unmarshal of re-encoded batch: %v", err)
		}
		var again Batch
		if err := DecodeBatch(&again, wire, ""); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		sameBatch(t, &again, &m)
		if !isJSON {
			var ref ApplyBatch
			if err := proto.Unmarshal(value, &ref); err != nil {
				t.Fatalf("DecodeBatch accepted what proto.Unmarshal rejects: %v", err)
			}
			sameBatch(t, &b, &ref)
		}
	})
}

func FuzzDecodeBytes(f *testing.F) {
	f.Add(EncodeBytes(nil, []byte("t\x80\x00\x00\x00\x00\x00\x00\x01_r")))
	f.Add(EncodeBytes(nil, nil))
	f.Add([]byte{1, 2, 3, 0, 0, 0, 1, 0, 0xFA})
	f.Fuzz(func(t *testing.T, enc []byte) {
		raw, rest, err := DecodeBytes(enc)
		if err != nil {
			return
		}
		back := EncodeBytes(nil, raw)
		if !bytes.Equal(append(back, rest...), enc) {
			t.Fatalf("DecodeBytes(%x) = %x, %x does not re-encode", enc, raw, rest)
		}
		Classify(enc)
	})
}

func FuzzSplitDataKey(f *testing.F) {
	f.Add(AppendDataKey(nil, RowKey(5, 5), 431656320867237891))
	f.Add(AppendDataKey(nil, []byte("m"), 0))
	f.Add(EncodeBytes(nil, RowKey(5, 5)))
	f.Fuzz(func(t *testing.T, key []byte) {
		Classify(key)
		raw, ts, err := DecodeDataKey(key)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != ReasonKeyTS {
				t.Fatalf("DecodeDataKey error %v", err)
			}
			return
		}
		if !bytes.Equal(AppendDataKey(nil, raw, ts), key) {
			t.Fatalf("DecodeDataKey(%x) = %x, %d does not re-encode", key, raw, ts)
		}
		kind, id := Classify(key)
		if rid, ok := TableIDOfRaw(raw); ok != (kind == KindTable) || rid != id {
			t.Fatalf("Classify(%x) = %v, %d; raw table id %d, %v", key, kind, id, rid, ok)
		}
	})
}

func FuzzDecodeWrite(f *testing.F) {
	w, _ := AppendWrite(nil, Write{Type: WritePut, StartTS: 12345678, ShortValue: []byte("hello"), HasShortValue: true})
	f.Add(w)
	f.Add([]byte{'R', 7, 'R', 'F', 0, 0, 0, 0, 0, 0, 0, 0, 'l', 0, 0, 0, 0, 0, 0, 0, 0, 1, 'S', 2})
	f.Fuzz(func(t *testing.T, v []byte) {
		w, err := DecodeWrite(v)
		if err != nil {
			return
		}
		out, err := AppendWrite(nil, w)
		if err != nil {
			t.Fatalf("AppendWrite of decoded %+v: %v", w, err)
		}
		w2, err := DecodeWrite(out)
		if err != nil || w2.Type != w.Type || w2.StartTS != w.StartTS || w2.HasShortValue != w.HasShortValue ||
			!bytes.Equal(w2.ShortValue, w.ShortValue) {
			t.Fatalf("round trip of %+v = %+v, %v", w, w2, err)
		}
	})
}

func FuzzNextEntry(f *testing.F) {
	f.Add(AppendEntry(AppendEntry(nil, []byte("k"), []byte("v")), nil, []byte("x")))
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, b []byte) {
		er := NewEntryReader(bytes.NewReader(b))
		er.SetMaxEntrySize(1 << 16)
		rest := b
		for {
			k, v, r, err := NextEntry(rest)
			rk, rv, rerr := er.Next()
			if err != nil {
				if len(rest) == 0 {
					if rerr != io.EOF {
						t.Fatalf("reader at end: %v", rerr)
					}
				} else if rerr == nil {
					t.Fatalf("reader accepted what NextEntry rejects: %v", err)
				}
				return
			}
			if rerr != nil {
				if !isFrameErr(rerr) || len(k)+len(v) <= 1<<16 {
					t.Fatalf("reader failed on a valid entry: %v", rerr)
				}
				return
			}
			if !bytes.Equal(k, rk) || !bytes.Equal(v, rv) {
				t.Fatal("reader and NextEntry disagree")
			}
			rest = r
		}
	})
}
