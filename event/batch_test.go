package event

import (
	"bytes"
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// randBatch returns a random ApplyBatch with valid enums.
func randBatch(rng *rand.Rand) *ApplyBatch {
	m := &ApplyBatch{}
	if rng.IntN(4) > 0 {
		m.RegionId = rng.Uint64() >> rng.IntN(64)
	}
	if rng.IntN(4) > 0 {
		m.ResolvedTs = rng.Uint64() >> rng.IntN(64)
	}
	for range rng.IntN(20) {
		e := &ApplyEvent{Cf: CF(rng.IntN(3)), Op: Op(rng.IntN(2))}
		if n := rng.IntN(40); n > 0 {
			e.Key = randBytes(rng, n)
		}
		if n := rng.IntN(300); n > 0 {
			e.Value = randBytes(rng, n)
		}
		m.Events = append(m.Events, e)
	}
	return m
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

// sameBatch reports whether the decoded b equals the generated m.
func sameBatch(t *testing.T, b *Batch, m *ApplyBatch) {
	t.Helper()
	if b.RegionID != m.RegionId || b.ResolvedTS != m.ResolvedTs {
		t.Fatalf("header = (%d, %d), want (%d, %d)", b.RegionID, b.ResolvedTS, m.RegionId, m.ResolvedTs)
	}
	if len(b.Events) != len(m.Events) {
		t.Fatalf("%d events, want %d", len(b.Events), len(m.Events))
	}
	for i, e := range b.Events {
		w := m.Events[i]
		if !bytes.Equal(e.Key, w.Key) || !bytes.Equal(e.Value, w.Value) || e.CF != w.Cf || e.Op != w.Op {
			t.Fatalf("event %d = %+v, want %v", i, e, w)
		}
	}
}

func toBatch(m *ApplyBatch) *Batch {
	b := &Batch{RegionID: m.RegionId, ResolvedTS: m.ResolvedTs}
	for _, e := range m.Events {
		b.Events = append(b.Events, Event{Key: e.Key, Value: e.Value, CF: e.Cf, Op: e.Op})
	}
	return b
}

func TestDecodeBatchMatchesProtoUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var b Batch
	for i := range 500 {
		m := randBatch(rng)
		wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		// Our encoder writes the same bytes as proto.Marshal ...
		if got := EncodeBatch(nil, toBatch(m)); !bytes.Equal(got, wire) {
			t.Fatalf("case %d: EncodeBatch differs from proto.Marshal", i)
		}
		// ... and the decoder reads what proto.Marshal wrote, with unknown
		// fields in between skipped as proto.Unmarshal does.
		if i%2 == 1 {
			wire = protowire.AppendTag(wire, 99, protowire.BytesType)
			wire = protowire.AppendBytes(wire, []byte("unknown"))
			wire = protowire.AppendTag(wire, fieldRegionID, protowire.Fixed64Type) // known number, wrong type
			wire = protowire.AppendFixed64(wire, 7)
		}
		var back ApplyBatch
		if err := proto.Unmarshal(wire, &back); err != nil {
			t.Fatalf("case %d: proto.Unmarshal: %v", i, err)
		}
		if err := DecodeBatch(&b, wire, ""); err != nil {
			t.Fatalf("case %d: DecodeBatch: %v", i, err)
		}
		sameBatch(t, &b, &back)
		sameBatch(t, &b, m)
	}
}

func TestDecodeBatchJSON(t *testing.T) {
	key := AppendDataKey(nil, RowKey(1, 2), 42)
	want := &ApplyBatch{RegionId: 7, ResolvedTs: 99, Events: []*ApplyEvent{
		{Key: key, Value: []byte("v"), Cf: CFWrite, Op: OpDelete},
		{Key: key, Cf: CFLock},
	}}
	keyB64 := base64.StdEncoding.EncodeToString(key)
	tests := []struct {
		name, ct, body string
	}{
		{"snake_case enum names", "application/json",
			`{"region_id":"7","resolved_ts":99,"events":[{"key":"` + keyB64 + `","value":"dg==","cf":"CF_WRITE","op":"OP_DELETE"},{"key":"` + keyB64 + `","cf":"CF_LOCK"}]}`},
		{"camelCase enum numbers", "application/json; charset=utf-8",
			`{"regionId":7,"resolvedTs":"99","events":[{"key":"` + keyB64 + `","value":"dg==","cf":1,"op":1},{"key":"` + keyB64 + `","cf":2,"op":0}]}`},
		{"EncodeBatchJSON output", "Application/JSON", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			if tc.body == "" {
				var err error
				if body, err = EncodeBatchJSON(toBatch(want)); err != nil {
					t.Fatal(err)
				}
			}
			var b Batch
			if err := DecodeBatch(&b, body, tc.ct); err != nil {
				t.Fatalf("DecodeBatch: %v", err)
			}
			sameBatch(t, &b, want)
		})
	}
}

func TestIsJSON(t *testing.T) {
	tests := []struct {
		ct   string
		want bool
	}{
		{"application/json", true},
		{"application/json; charset=utf-8", true},
		{"Application/JSON", true},
		{"  application/json ;q=1", true},
		{"application/json+foo", false},
		{"application/x-protobuf", false},
		{"text/plain", false},
		{"", false},
	}
	for _, tc := range tests {
		t.Run(tc.ct, func(t *testing.T) {
			if got := IsJSON(tc.ct); got != tc.want {
				t.Fatalf("IsJSON(%q) = %v, want %v", tc.ct, got, tc.want)
			}
		})
	}
}

func TestDecodeBatchErrors(t *testing.T) {
	event := func(fields ...byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, fieldEvents, protowire.BytesType), fields)
	}
	tests := []struct {
		name, ct string
		value    []byte
		reason   string
	}{
		{"truncated varint", "", []byte{0x08, 0x80}, ReasonProto},
		{"missing varint", "", []byte{0x08}, ReasonProto},
		{"field number zero", "", []byte{0x00, 0x01}, ReasonProto},
		{"event length past end", "", []byte{0x1a, 0x05, 0x0a}, ReasonProto},
		{"bad nested event", "", event(0x0a, 0x09), ReasonProto},
		{"stray end group", "", []byte{0x0c}, ReasonProto},
		{"cf 3", "", event(0x18, 0x03), ReasonCF},
		{"cf negative", "", event(0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), ReasonCF},
		{"op 2", "", event(0x20, 0x02), ReasonOp},
		{"json syntax", "application/json", []byte(`{"region_id":`), ReasonJSON},
		{"json unknown field", "application/json", []byte(`{"region":1}`), ReasonJSON},
		{"json unknown enum name", "application/json", []byte(`{"events":[{"cf":"CF_RAFT"}]}`), ReasonJSON},
		{"json cf number", "application/json", []byte(`{"events":[{"cf":5}]}`), ReasonCF},
		{"json op number", "application/json", []byte(`{"events":[{"op":9}]}`), ReasonOp},
		{"json given as proto", "", []byte(`{"region_id":1}`), ReasonProto},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			err := DecodeBatch(&b, tc.value, tc.ct)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("DecodeBatch = %v, want *DecodeError", err)
			}
			if de.Reason != tc.reason {
				t.Fatalf("reason = %q (%v), want %q", de.Reason, err, tc.reason)
			}
		})
	}
}

func TestDecodeBatchReusesEvents(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	big := EncodeBatch(nil, toBatch(&ApplyBatch{RegionId: 1, Events: randBatch(rng).Events}))
	heartbeat := EncodeBatch(nil, &Batch{RegionID: 2, ResolvedTS: 5})
	var b Batch
	if err := DecodeBatch(&b, big, ""); err != nil {
		t.Fatal(err)
	}
	if err := DecodeBatch(&b, heartbeat, ""); err != nil {
		t.Fatal(err)
	}
	if b.RegionID != 2 || b.ResolvedTS != 5 || len(b.Events) != 0 {
		t.Fatalf("heartbeat decoded as %+v", b)
	}
}

func BenchmarkDecodeBatch(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	src := &Batch{RegionID: 12, ResolvedTS: ComposeTS(1646636400000, 3)}
	for i := range 256 {
		w, _ := AppendWrite(nil, Write{Type: WritePut, StartTS: uint64(i), ShortValue: randBytes(rng, 64), HasShortValue: true})
		src.Events = append(src.Events, Event{Key: AppendDataKey(nil, RowKey(7, int64(i)), uint64(i)+10), Value: w, CF: CFWrite})
	}
	wire := EncodeBatch(nil, src)
	dst := Batch{Events: make([]Event, 0, len(src.Events))}
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeBatch(&dst, wire, ""); err != nil {
			b.Fatal(err)
		}
	}
}

func TestDecodeBatchDoesNotAllocate(t *testing.T) {
	src := &Batch{RegionID: 1, Events: []Event{{Key: []byte("k"), Value: []byte("v"), CF: CFWrite}, {Key: []byte("k2")}}}
	wire := EncodeBatch(nil, src)
	dst := Batch{Events: make([]Event, 0, 4)}
	if n := testing.AllocsPerRun(100, func() { _ = DecodeBatch(&dst, wire, "") }); n != 0 {
		t.Fatalf("DecodeBatch allocates %v times per run", n)
	}
}
