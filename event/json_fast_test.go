package event

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"strconv"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
)

// jsonSpelling writes a batch in one of the many JSON spellings protojson
// accepts, chosen by rng: field name forms, order, integers as numbers or
// strings, enums as names or numbers, zero fields omitted or written,
// whitespace between tokens; and, with urlB64, URL-safe or unpadded base64
// (which the fast path leaves to protojson).
func jsonSpelling(rng *rand.Rand, b *Batch, urlB64 bool) []byte {
	var out bytes.Buffer
	ws := func() {
		for rng.IntN(4) == 0 {
			out.WriteByte(" \t\n\r"[rng.IntN(4)])
		}
	}
	tok := func(s string) { ws(); out.WriteString(s); ws() }
	uint := func(v uint64) string {
		if rng.IntN(2) == 0 {
			return strconv.Quote(strconv.FormatUint(v, 10))
		}
		return strconv.FormatUint(v, 10)
	}
	name := func(snake, camel string) string {
		if rng.IntN(2) == 0 {
			return strconv.Quote(snake)
		}
		return strconv.Quote(camel)
	}
	b64 := func(v []byte) string {
		enc := base64.StdEncoding
		if urlB64 {
			switch rng.IntN(3) {
			case 0:
				enc = base64.URLEncoding
			case 1:
				enc = base64.RawStdEncoding
			}
		}
		return strconv.Quote(enc.EncodeToString(v))
	}
	enum := func(v int32, names []string) string {
		if int(v) < len(names) && rng.IntN(2) == 0 {
			return strconv.Quote(names[v])
		}
		return strconv.Itoa(int(v))
	}
	members := func(fields []string) {
		tok("{")
		rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
		for i, f := range fields {
			if i > 0 {
				tok(",")
			}
			out.WriteString(f)
		}
		tok("}")
	}
	var top []string
	if b.RegionID != 0 || rng.IntN(2) == 0 {
		top = append(top, name("region_id", "regionId")+":"+uint(b.RegionID))
	}
	if b.ResolvedTS != 0 || rng.IntN(2) == 0 {
		top = append(top, name("resolved_ts", "resolvedTs")+":"+uint(b.ResolvedTS))
	}
	var events bytes.Buffer
	if len(b.Events) > 0 || rng.IntN(2) == 0 {
		saved := out
		out = bytes.Buffer{}
		tok("[")
		for i, e := range b.Events {
			if i > 0 {
				tok(",")
			}
			var f []string
			if e.Key != nil {
				f = append(f, `"key":`+b64(e.Key))
			}
			if e.Value != nil {
				f = append(f, `"value":`+b64(e.Value))
			}
			if e.CF != 0 || rng.IntN(3) == 0 {
				f = append(f, `"cf":`+enum(int32(e.CF), []string{"CF_DEFAULT", "CF_WRITE", "CF_LOCK"}))
			}
			if e.Op != 0 || rng.IntN(3) == 0 {
				f = append(f, `"op":`+enum(int32(e.Op), []string{"OP_PUT", "OP_DELETE"}))
			}
			members(f)
		}
		tok("]")
		events = out
		out = saved
		top = append(top, `"events":`+events.String())
	}
	members(top)
	return out.Bytes()
}

func randomBatch(rng *rand.Rand) *Batch {
	b := &Batch{}
	if rng.IntN(4) > 0 {
		b.RegionID = rng.Uint64() >> rng.IntN(64)
	}
	if rng.IntN(4) > 0 {
		b.ResolvedTS = rng.Uint64() >> rng.IntN(64)
	}
	for range rng.IntN(6) {
		e := Event{CF: CF(rng.IntN(3)), Op: Op(rng.IntN(2))}
		if rng.IntN(5) > 0 {
			e.Key = AppendDataKey(nil, RowKey(rng.Int64N(100), rng.Int64N(1000)), rng.Uint64())
		}
		if rng.IntN(3) > 0 {
			e.Value = make([]byte, rng.IntN(40))
			for i := range e.Value {
				e.Value[i] = byte(rng.Uint32())
			}
		}
		if rng.IntN(20) == 0 {
			e.CF = CF(3 + rng.IntN(5)) // unknown: decoded, then rejected
		}
		b.Events = append(b.Events, e)
	}
	return b
}

// mutate damages js the ways that move it outside the fast path's subset
// or outside JSON: a byte replaced by one that means something in JSON or
// protojson, a byte removed, a slice repeated.
func mutate(rng *rand.Rand, js []byte) []byte {
	out := append([]byte(nil), js...)
	for range 1 + rng.IntN(3) {
		if len(out) == 0 {
			break
		}
		i := rng.IntN(len(out))
		switch rng.IntN(3) {
		case 0:
			const special = "\"\\ -_.eE0123456789{}[],:nul+/=\x00\x7f\xff"
			out[i] = special[rng.IntN(len(special))]
		case 1:
			out = append(out[:i], out[i+1:]...)
		default:
			j := i + rng.IntN(min(12, len(out)-i))
			out = append(out[:j], append(append([]byte(nil), out[i:j]...), out[j:]...)...)
		}
	}
	return out
}

// checkFastAgrees fails unless the fast path either declines js or
// decodes exactly what protojson.Unmarshal decodes from it.
func checkFastAgrees(t *testing.T, js []byte) (fast bool) {
	t.Helper()
	var b Batch
	if !decodeJSONFast(&b, js) {
		return false
	}
	var m ApplyBatch
	if err := protojson.Unmarshal(js, &m); err != nil {
		t.Fatalf("fast path accepted what protojson rejects (%v): %s", err, js)
	}
	sameBatch(t, &b, &m)
	return true
}

// TestDecodeJSONFastMatchesProtojson checks the fast path against
// protojson on random batches in random spellings, and on damaged ones:
// whatever it accepts, protojson accepts with the same result. It also
// checks that the usual spellings do take the fast path, and the others
// reach protojson and decode all the same through DecodeBatch.
func TestDecodeJSONFastMatchesProtojson(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var fast, slow, mutatedFast int
	for i := range 4000 {
		b := randomBatch(rng)
		urlB64 := i%4 == 0
		js := jsonSpelling(rng, b, urlB64)
		if checkFastAgrees(t, js) {
			fast++
		} else {
			slow++
			if !urlB64 {
				t.Fatalf("a usual spelling missed the fast path: %s", js)
			}
		}
		var got Batch
		if err := DecodeBatch(&got, js, "application/json"); err != nil {
			if !hasUnknownEnum(b) {
				t.Fatalf("DecodeBatch(%s): %v", js, err)
			}
		} else {
			want := &ApplyBatch{RegionId: b.RegionID, ResolvedTs: b.ResolvedTS}
			for _, e := range b.Events {
				want.Events = append(want.Events, &ApplyEvent{Key: e.Key, Value: e.Value, Cf: e.CF, Op: e.Op})
			}
			sameBatch(t, &got, want)
		}
		for range 5 {
			if checkFastAgrees(t, mutate(rng, js)) {
				mutatedFast++
			}
		}
	}
	if own, _ := EncodeBatchJSON(randomBatch(rng)); !checkFastAgrees(t, own) {
		t.Fatalf("EncodeBatchJSON output missed the fast path: %s", own)
	}
	t.Logf("fast path: %d spellings (%d damaged ones it still accepted, all as protojson did); protojson: %d", fast, mutatedFast, slow)
}

func hasUnknownEnum(b *Batch) bool {
	for _, e := range b.Events {
		if checkEnums(e.CF, e.Op) != nil {
			return true
		}
	}
	return false
}

// TestDecodeJSONFastDeclines lists inputs protojson treats in its own way
// (or rejects), which the fast path must leave to it.
func TestDecodeJSONFastDeclines(t *testing.T) {
	for _, js := range []string{
		`{"regionId":null}`,
		`{"regionId":1,"region_id":2}`,
		`{"regionId":1e3}`,
		`{"regionId":1.0}`,
		`{"regionId":-1}`,
		`{"regionId":01}`,
		`{"regionId":"01"}`,
		`{"regionId":18446744073709551616}`,
		`{"regionId":"7" }x`,
		`{"events":[{"key":"dg"}]}`,
		`{"events":[{"key":"-_8="}]}`,
		`{"events":[{"key":"d\u0067=="}]}`,
		`{"events":[{"cf":"1"}]}`,
		`{"events":[{"cf":-1}]}`,
		`{"events":[{"cf":2147483648}]}`,
		`{"events":[null]}`,
		`{"events":[{"regionId":1}]}`,
		`{"events":[{"key":"dg==","key":"dg=="}]}`,
		`{"unknown":1}`,
		`{"regionId":1,}`,
		`[]`,
		``,
	} {
		var b Batch
		if decodeJSONFast(&b, []byte(js)) {
			t.Errorf("fast path accepted %s", js)
		}
	}
}

// FuzzDecodeJSONFast: on any input the fast path declines or agrees with
// protojson.
func FuzzDecodeJSONFast(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 8 {
		f.Add(jsonSpelling(rng, randomBatch(rng), i%2 == 0))
	}
	f.Add([]byte(`{"regionId":"1","events":[{"cf":"CF_LOCK"}]}`))
	f.Fuzz(func(t *testing.T, js []byte) { checkFastAgrees(t, js) })
}

// BenchmarkDecodeBatchJSON measures the JSON form's decoding: the fast
// path on protojson's own output, and protojson on the same bytes.
func BenchmarkDecodeBatchJSON(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	batch := &Batch{RegionID: 12, ResolvedTS: 1 << 60}
	for i := range 64 {
		v := make([]byte, 32)
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		batch.Events = append(batch.Events, Event{Key: AppendDataKey(nil, RowKey(3, int64(i)), 1<<58), Value: v, CF: CFWrite})
	}
	js, err := EncodeBatchJSON(batch)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(js)))
		var got Batch
		for b.Loop() {
			if err := DecodeBatch(&got, js, "application/json"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protojson", func(b *testing.B) {
		b.SetBytes(int64(len(js)))
		for b.Loop() {
			var m ApplyBatch
			if err := protojson.Unmarshal(js, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
