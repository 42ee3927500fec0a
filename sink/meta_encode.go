package sink

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
)

// A meta's file entries are encoded by hand, to the bytes encoding/json
// gives them (sink TestFileEntryEncodesAsEncodingJSON): a layout v2 meta
// of a wide cycle has thousands of them, each with its region runs, and
// encoding/json spent a reflection walk per entry and then a second pass
// over the bytes a MarshalJSON returns (about a twentieth of a wide row's
// CPU: docs/SIZING.md, "Width: many flows, tables and regions (layout
// v2)").

// appendJSON appends f's JSON object: its fields in declaration order,
// regions (from Regions or its run source) and flow_ids only when it has
// them, as encoding/json writes them.
func (f *FileMeta) appendJSON(b []byte) []byte {
	b = append(b, `{"offset":`...)
	b = strconv.AppendInt(b, f.Offset, 10)
	b = append(b, `,"length":`...)
	b = strconv.AppendInt(b, f.Length, 10)
	b = append(b, `,"raw_length":`...)
	b = strconv.AppendInt(b, f.RawLength, 10)
	b = append(b, `,"compression":`...)
	b = appendJSONString(b, f.Compression)
	b = append(b, `,"sha256":`...)
	b = appendJSONString(b, f.SHA256)
	b = append(b, `,"number_of_entries":`...)
	b = strconv.AppendInt(b, f.NumberOfEntries, 10)
	b = append(b, `,"min_ts":`...)
	b = strconv.AppendUint(b, f.MinTS, 10)
	b = append(b, `,"max_ts":`...)
	b = strconv.AppendUint(b, f.MaxTS, 10)
	b = append(b, `,"resolved_ts":`...)
	b = strconv.AppendUint(b, f.ResolvedTS, 10)
	b = append(b, `,"min_begin_ts_in_default_cf":`...)
	b = strconv.AppendUint(b, f.MinBeginTSInDefaultCF, 10)
	b = append(b, `,"start_key":`...)
	b = appendJSONString(b, f.StartKey)
	b = append(b, `,"end_key":`...)
	b = appendJSONString(b, f.EndKey)
	b = append(b, `,"table_id":`...)
	b = strconv.AppendInt(b, f.TableID, 10)
	b = append(b, `,"region_id":`...)
	b = strconv.AppendUint(b, f.RegionID, 10)
	// omitempty: a source's runs, or Regions when it has any.
	if f.runs != nil || len(f.Regions) > 0 {
		b = append(b, `,"regions":[`...)
		first := true
		f.eachRun(func(r RegionRun) {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = r.appendJSON(b)
		})
		b = append(b, ']')
	}
	b = append(b, `,"cf":`...)
	b = appendJSONString(b, f.CF)
	b = append(b, `,"op":`...)
	b = appendJSONString(b, f.Op)
	b = append(b, `,"is_meta":`...)
	b = strconv.AppendBool(b, f.IsMeta)
	b = append(b, `,"partition":`...)
	b = strconv.AppendInt(b, int64(f.Partition), 10)
	if len(f.FlowIDs) > 0 {
		b = append(b, `,"flow_ids":[`...)
		for i, id := range f.FlowIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(id), 10)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// jsonSize is about the length of f's JSON object, a little more as a
// rule: its field names, its strings, its numbers at their longest, and
// its region runs and flow ids at a usual length (ids of up to 10
// digits, runs of fewer than 100,000 entries). encodeMetaJSON sizes its
// buffer with it once: an estimate short of the bytes made the buffer
// grow and copy several times for a cycle of thousands of entries.
func (f *FileMeta) jsonSize() int {
	const (
		names   = 280 // field names, quotes, separators, braces, a bool
		numbers = 11 * 20
		run     = 10 + 5 + 3 // [region,entries],
		flowID  = 10 + 1
	)
	n := names + numbers + len(f.Compression) + len(f.SHA256) + len(f.StartKey) + len(f.EndKey) +
		len(f.CF) + len(f.Op) + flowID*len(f.FlowIDs)
	if f.runs != nil {
		return n + run*f.runs.Len()
	}
	return n + run*len(f.Regions)
}

// appendJSONString appends s as encoding/json quotes it. The fields of a
// file entry are hex and enum words, which need no escape; anything else
// goes through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// filesTail is how encoding/json ends a Meta whose files are empty: the
// files field is its last.
var filesTail = []byte(`"files":[]}`)

// encodeMetaJSON is json.Marshal(m) with m's file entries appended by
// hand: the rest of the meta is encoded by encoding/json with no files,
// and the entries go where its empty list was.
func encodeMetaJSON(m Meta) ([]byte, error) {
	files := m.Files
	m.Files = []FileMeta{}
	head, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(head, filesTail) {
		return nil, errors.New("meta JSON does not end with its files")
	}
	head = head[:len(head)-2] // keep `"files":[`
	size := len(head) + 2
	for i := range files {
		size += files[i].jsonSize()
	}
	b := make([]byte, 0, size)
	b = append(b, head...)
	for i := range files {
		if i > 0 {
			b = append(b, ',')
		}
		b = files[i].appendJSON(b)
	}
	return append(b, "]}"...), nil
}
