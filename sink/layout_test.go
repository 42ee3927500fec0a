package sink_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

func TestValidName(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"flow_1-A", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{"..", false},
		{"a/b", false},
		{"a%2Fb", false},
		{"é", false},
		{"a b", false},
	} {
		t.Run(tc.s, func(t *testing.T) {
			if got := sink.ValidName(tc.s); got != tc.ok {
				t.Fatalf("ValidName(%q) = %v, want %v", tc.s, got, tc.ok)
			}
		})
	}
}

func TestPaths(t *testing.T) {
	const ts = 431656320867237891 // 2022-03-07 07:xx UTC
	for _, tc := range []struct {
		name, got, want string
	}{
		{"data", sink.DataPath("pre", "default", "f1", 3, ts, "c7"), "pre/default/f1/v1/20220307/07/431656320867237891-3-c7.log"},
		{"data no prefix", sink.DataPath("", "default", "f1", 3, ts, "c7"), "default/f1/v1/20220307/07/431656320867237891-3-c7.log"},
		{"meta", sink.MetaPath("a/b", "cat", "f", 5, 42, "c1"), "a/b/cat/f/v1/backupmeta/00000000000000000042-5-c1.meta"},
		{"meta max", sink.MetaPath("", "cat", "f", 1, 1<<64-1, "c"), "cat/f/v1/backupmeta/18446744073709551615-1-c.meta"},
		{"checkpoint", sink.CheckpointPath("", "cat", "f", "flowlog", 7), "cat/f/v1/global_checkpoint/flowlog-7.ts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
	if sink.MetaPath("", "c", "f", 1, 9, "x") >= sink.MetaPath("", "c", "f", 1, 10, "a") {
		t.Fatal("meta paths do not sort in resolved-ts order")
	}
	cat, flow, ok := sink.SplitFlowPath("pre", "pre/cat/f/v1/backupmeta/1-x.meta")
	if !ok || cat != "cat" || flow != "f" {
		t.Fatalf("SplitFlowPath = %q %q %v", cat, flow, ok)
	}
}

func sampleMeta() sink.Meta {
	return sink.Meta{
		Version: 1, Flow: "f", FlowID: 7, StoreID: "host", CycleID: "c1",
		DataPath: "default/f/v1/20220307/07/1-c1.log",
		MinTS:    1, MaxTS: 1<<64 - 1, MinResolvedTS: 1 << 63,
		Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 3, From: 10, To: 20}},
		Files: []sink.FileMeta{{
			Offset: 0, Length: 10, RawLength: 10, Compression: "none", SHA256: strings.Repeat("ab", 32),
			NumberOfEntries: 1, MinTS: 1, MaxTS: 1<<64 - 1, ResolvedTS: 5, MinBeginTSInDefaultCF: 1,
			StartKey: "74", EndKey: "74ff", TableID: 1, RegionID: 9, CF: "write", Op: "put", Partition: 3,
		}},
	}
}

func TestMetaRoundTrip(t *testing.T) {
	m := sampleMeta()
	b, err := sink.EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	// Exact uint64s and the documented snake_case names.
	for _, want := range []string{`"max_ts":18446744073709551615`, `"min_resolved_ts":9223372036854775808`, `"min_begin_ts_in_default_cf":1`, `"raw_length":10`, `"number_of_entries":1`, `"is_meta":false`, `"data_path":`, `"store_id":"host"`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("meta JSON lacks %s: %s", want, b)
		}
	}
	got, err := sink.DecodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(got)
	if !bytes.Equal(a, b) {
		t.Fatalf("round trip differs:\n%s\n%s", a, b)
	}
}

func TestMetaInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*sink.Meta)
	}{
		{"version", func(m *sink.Meta) { m.Version = 2 }},
		{"flow name", func(m *sink.Meta) { m.Flow = "../x" }},
		{"compression", func(m *sink.Meta) { m.Files[0].Compression = "gzip" }},
		{"cf", func(m *sink.Meta) { m.Files[0].CF = "lock" }},
		{"op", func(m *sink.Meta) { m.Files[0].Op = "merge" }},
		{"sha", func(m *sink.Meta) { m.Files[0].SHA256 = "xyz" }},
		{"uncompressed length", func(m *sink.Meta) { m.Files[0].RawLength = 11 }},
		{"offsets", func(m *sink.Meta) { m.Offsets[0].From = 30 }},
		{"overlap", func(m *sink.Meta) { m.Files = append(m.Files, m.Files[0]) }},
		{"key hex", func(m *sink.Meta) { m.Files[0].StartKey = "7G" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := sampleMeta()
			tc.mod(&m)
			if _, err := sink.EncodeMeta(m); err == nil {
				t.Fatal("EncodeMeta accepted an invalid meta")
			}
			b, _ := json.Marshal(m)
			if _, err := sink.DecodeMeta(b); err == nil {
				t.Fatal("DecodeMeta accepted an invalid meta")
			}
		})
	}
}

func TestCheckpoint(t *testing.T) {
	b := sink.EncodeCheckpoint(0x0102030405060708)
	if !bytes.Equal(b, []byte{8, 7, 6, 5, 4, 3, 2, 1}) {
		t.Fatalf("EncodeCheckpoint = %x", b)
	}
	if ts, err := sink.DecodeCheckpoint(b); err != nil || ts != 0x0102030405060708 {
		t.Fatalf("DecodeCheckpoint = %x, %v", ts, err)
	}
	if _, err := sink.DecodeCheckpoint(b[:7]); err == nil {
		t.Fatal("DecodeCheckpoint accepted 7 bytes")
	}
}
