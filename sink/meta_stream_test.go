package sink

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// streamAll decodes raw with decodeMetaStream and returns the meta with its
// files gathered.
func streamAll(raw []byte, keep metaParts) (Meta, error) {
	var files []FileMeta
	m, n, err := decodeMetaStream(newMetaLexer(bytes.NewReader(raw), keep.keys), keep, metaVisitor{file: func(_ int, f *FileMeta) error {
		files = append(files, *f)
		return nil
	}})
	if err == nil && n != len(files) {
		return m, errors.New("file count differs from the files seen")
	}
	m.Files = files
	return m, err
}

// normalized makes empty lists nil: the streamed read builds lists
// element by element, DecodeMeta makes empty ones.
func normalized(m Meta) Meta {
	if len(m.Flows) == 0 {
		m.Flows = nil
	}
	if len(m.Offsets) == 0 {
		m.Offsets = nil
	}
	m.Files = append([]FileMeta(nil), m.Files...)
	for i := range m.Files {
		if len(m.Files[i].FlowIDs) == 0 {
			m.Files[i].FlowIDs = nil
		}
	}
	return m
}

func v1Meta() Meta {
	m := validV2Meta()
	m.Version, m.Flow, m.FlowID, m.Flows, m.Coverage, m.Partitions, m.Group = MetaVersion, "a", 3, nil, nil, nil, ""
	m.Files = append([]FileMeta(nil), m.Files...)
	m.Files[0].FlowIDs = nil
	m.Files = append(m.Files, m.Files[0])
	m.Files[1].Offset, m.Files[1].StartKey, m.Files[1].EndKey, m.Files[1].CF = 16, "00", "0011", CFDefault
	return m
}

// The streamed read gives what DecodeMeta gives, but the keys, which it
// drops, or cuts to their first keyPrefixHex hex digits for a reader that
// asks for them.
func TestStreamMetaMatchesDecodeMeta(t *testing.T) {
	long := v1Meta()
	long.Files[0].StartKey, long.Files[0].EndKey = strings.Repeat("ab", keyPrefixHex), strings.Repeat("c", keyPrefixHex+2)
	for name, m := range map[string]Meta{"v1": v1Meta(), "v2": validV2Meta(), "long keys": long} {
		t.Run(name, func(t *testing.T) {
			raw, err := EncodeMeta(m)
			if err != nil {
				t.Fatal(err)
			}
			want, err := DecodeMeta(raw)
			if err != nil {
				t.Fatal(err)
			}
			cut := normalized(want)
			cut.Files = slices.Clone(cut.Files)
			for i := range want.Files {
				f, c := &want.Files[i], &cut.Files[i]
				c.StartKey, c.EndKey = f.StartKey[:min(len(f.StartKey), keyPrefixHex)], f.EndKey[:min(len(f.EndKey), keyPrefixHex)]
				f.StartKey, f.EndKey = "", ""
			}
			if got, err := streamAll(raw, metaParts{partitions: true, coverage: true, keys: true}); err != nil || !reflect.DeepEqual(normalized(got), cut) {
				t.Fatalf("streamed with keys: %v\n%+v\nwant\n%+v", err, got, cut)
			}
			got, err := streamAll(raw, metaParts{partitions: true, coverage: true})
			if err != nil {
				t.Fatal(err)
			}
			want = normalized(want)
			if got = normalized(got); !reflect.DeepEqual(got, want) {
				t.Fatalf("streamed\n%+v\nwant\n%+v", got, want)
			}
			// Whitespace and unknown members make no difference.
			spaced := bytes.ReplaceAll(bytes.ReplaceAll(raw, []byte(","), []byte(",\n\t ")), []byte(":"), []byte(" : "))
			spaced = bytes.Replace(spaced, []byte("{"), []byte(`{ "aa_unknown": [{"start_key": "not hex", "x": [1, "y", null]}], `), 1)
			if got, err := streamAll(spaced, metaParts{partitions: true, coverage: true}); err != nil || !reflect.DeepEqual(normalized(got), want) {
				t.Fatalf("spaced, with an unknown member: %v\n%+v", err, got)
			}
			after := bytes.Replace(raw, []byte(`"version":`), []byte(`"zz_unknown":1,"version":`), 1)
			after = append(after[:len(after)-1], []byte(`,"data_path":"x"}`)...)
			if _, err := streamAll(after, metaParts{}); err == nil || !strings.Contains(err.Error(), "last member") {
				t.Fatalf("a member after files: %v", err)
			}
		})
	}
}

// Every meta Validate refuses, the streamed read refuses too.
func TestStreamMetaRefusesInvalid(t *testing.T) {
	for name, mutate := range invalidV2Mutations() {
		m := validV2Meta()
		m.Files = append([]FileMeta(nil), m.Files...)
		mutate(&m)
		raw, _ := json.Marshal(m)
		if _, err := streamAll(raw, metaParts{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	v1 := map[string]func(*Meta){
		"overlap":      func(m *Meta) { m.Files[1].Offset = 8 },
		"sha":          func(m *Meta) { m.Files[1].SHA256 = "xyz" },
		"key hex":      func(m *Meta) { m.Files[1].StartKey = "7G" },
		"upper hex":    func(m *Meta) { m.Files[1].EndKey = "AB" },
		"odd hex":      func(m *Meta) { m.Files[1].EndKey = "abc" },
		"no path":      func(m *Meta) { m.DataPath = "" },
		"offsets":      func(m *Meta) { m.Offsets = []OffsetRange{{From: 3, To: 2}} },
		"flow name":    func(m *Meta) { m.Flow = "../x" },
		"min ts":       func(m *Meta) { m.MinTS = 3 },
		"v2 partition": func(m *Meta) { m.Partitions = []PartitionState{{Topic: "t"}} },
	}
	for name, mutate := range v1 {
		m := v1Meta()
		mutate(&m)
		raw, _ := json.Marshal(m)
		if _, err := DecodeMeta(raw); err == nil {
			t.Errorf("%s: DecodeMeta accepted", name)
		}
		if _, err := streamAll(raw, metaParts{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	raw, _ := EncodeMeta(v1Meta())
	for name, bad := range map[string][]byte{
		"truncated":      raw[:len(raw)-3],
		"trailing data":  append(append([]byte{}, raw...), []byte(` {}`)...),
		"twice a member": bytes.Replace(raw, []byte(`"version":1,`), []byte(`"version":1,"Version":1,`), 1),
		"not an object":  []byte(`[1]`),
		"escaped key":    bytes.Replace(raw, []byte(`"start_key":"00"`), []byte(`"start_key":"\u0030\u0030"`), 1),
		"long string":    bytes.Replace(raw, []byte(`"store_id":"host-a"`), []byte(`"store_id":"`+strings.Repeat("a", maxMetaString+1)+`"`), 1),
		"long number":    bytes.Replace(raw, []byte(`"min_ts":1`), []byte(`"min_ts":1`+strings.Repeat("0", maxMetaScalar)), 1),
		"deep":           bytes.Replace(raw, []byte(`"version":1,`), []byte(`"version":1,"x":`+strings.Repeat("[", maxMetaDepth)+strings.Repeat("]", maxMetaDepth)+`,`), 1),
		"big element":    bytes.Replace(raw, []byte(`"files":[`), []byte(`"files":[{"x":[`+strings.Repeat(`"`+strings.Repeat("a", 1000)+`",`, maxMetaElement/1000)+`1]},`), 1),
	} {
		if _, err := streamAll(bad, metaParts{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// genReader yields head, then n bytes of fill, then tail, without holding
// the fill.
type genReader struct {
	head, tail []byte
	fill       byte
	n          int64
}

func (g *genReader) Read(p []byte) (int, error) {
	switch {
	case len(g.head) > 0:
		n := copy(p, g.head)
		g.head = g.head[n:]
		return n, nil
	case g.n > 0:
		n := int(min(int64(len(p)), g.n))
		for i := range p[:n] {
			p[i] = g.fill
		}
		g.n -= int64(n)
		return n, nil
	case len(g.tail) > 0:
		n := copy(p, g.tail)
		g.tail = g.tail[n:]
		return n, nil
	}
	return 0, io.EOF
}

// A 40 MiB key, which a key of --max-value-size may need, streams through
// without being held; a meta over 64 MiB is refused as it streams.
func TestStreamMetaBoundsMemory(t *testing.T) {
	m := v1Meta()
	m.Files[1].EndKey = "@@"
	raw, _ := json.Marshal(m)
	head, tail, _ := bytes.Cut(raw, []byte("@@"))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	files := 0
	_, _, err := decodeMetaStream(newMetaLexer(&genReader{head: head, fill: 'a', n: 40 << 20, tail: tail}, false), metaParts{},
		metaVisitor{file: func(int, *FileMeta) error { files++; return nil }})
	runtime.ReadMemStats(&after)
	if err != nil || files != 2 {
		t.Fatalf("40 MiB key: %d files, %v", files, err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Errorf("reading a meta with a 40 MiB key allocated %d MiB", n>>20)
	}
	_, _, err = decodeMetaStream(newMetaLexer(&genReader{head: head, fill: 'a', n: maxMetaSize, tail: tail}, false), metaParts{}, metaVisitor{})
	if !errors.Is(err, errMetaTooLarge) {
		t.Fatalf("a meta over %d MiB: %v", maxMetaSize>>20, err)
	}
}

// A header-only read stops at the files and hands over the header.
func TestStreamMetaHeaderOnly(t *testing.T) {
	m := validV2Meta()
	raw, _ := EncodeMeta(m)
	bad := bytes.Replace(raw, []byte(`"sha256":"`), []byte(`"sha256":"z`), 1) // a bad file after the header
	var seen *Meta
	got, _, err := decodeMetaStream(newMetaLexer(bytes.NewReader(bad), false), metaParts{}, metaVisitor{
		header: func(h *Meta) error { seen = h; return errStopMeta },
		file:   func(int, *FileMeta) error { t.Fatal("file read after the header stopped the read"); return nil },
	})
	if err != nil || seen == nil || got.DataPath != m.DataPath || len(got.Flows) != 2 {
		t.Fatalf("header only: %+v, %v", got, err)
	}
}
