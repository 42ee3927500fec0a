package sink

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// multiRegionMeta is validV2Meta with a chunk of three runs of two regions.
func multiRegionMeta() Meta {
	m := validV2Meta()
	m.Files = append([]FileMeta(nil), m.Files...)
	f := &m.Files[0]
	f.Length, f.RawLength, f.NumberOfEntries, f.RegionID = 48, 48, 6, 0
	f.Regions = []RegionRun{{7, 2}, {0, 3}, {7, 1}}
	return m
}

// A multi-region chunk lists its runs as [region, entries] pairs, and both
// readers give them back; a chunk of one region has no regions member.
func TestRegionRunsRoundTrip(t *testing.T) {
	raw, err := EncodeMeta(multiRegionMeta())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(`"region_id":0,"regions":[[7,2],[0,3],[7,1]]`)) {
		t.Errorf("encoded runs not as documented: %s", raw)
	}
	want := RegionRuns{{7, 2}, {0, 3}, {7, 1}}
	m, err := DecodeMeta(raw)
	if err != nil {
		t.Fatal(err)
	}
	s, err := streamAll(raw, metaParts{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.Files[0].Regions, want) || !reflect.DeepEqual(s.Files[0].Regions, want) {
		t.Errorf("decoded runs %v, streamed %v, want %v", m.Files[0].Regions, s.Files[0].Regions, want)
	}
	var got RegionRuns
	m.Files[0].EachRegion(func(r uint64, n int64) { got = append(got, RegionRun{r, n}) })
	if !reflect.DeepEqual(got, want) {
		t.Errorf("EachRegion gave %v, want %v", got, want)
	}

	one, err := EncodeMeta(validV2Meta())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(one, []byte(`"region_id":1,"cf"`)) {
		t.Errorf("a chunk of one region lists runs: %s", one)
	}
	d, err := DecodeMeta(one)
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	d.Files[0].EachRegion(func(r uint64, n int64) { got = append(got, RegionRun{r, n}) })
	if !reflect.DeepEqual(got, RegionRuns{{1, 1}}) {
		t.Errorf("EachRegion of a one-region chunk gave %v, want [{1 1}]", got)
	}
}

// A chunk of MaxChunkRuns runs of the largest ids passes both readers (its
// entry stays below the streamed reader's bound on one element); one more
// run is refused.
func TestRegionRunsLimit(t *testing.T) {
	for _, n := range []int{MaxChunkRuns, MaxChunkRuns + 1} {
		m := multiRegionMeta()
		f := &m.Files[0]
		f.Regions = make([]RegionRun, n)
		for i := range f.Regions {
			f.Regions[i] = RegionRun{Region: ^uint64(0) - uint64(i%2), Entries: 1 << 40}
		}
		f.NumberOfEntries = int64(n) << 40
		f.Length, f.RawLength = f.NumberOfEntries*minEntrySize, f.NumberOfEntries*minEntrySize
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		_, derr := DecodeMeta(raw)
		_, serr := streamAll(raw, metaParts{})
		if n <= MaxChunkRuns && (derr != nil || serr != nil) {
			t.Errorf("%d runs refused: %v; streamed: %v", n, derr, serr)
		}
		if n > MaxChunkRuns && (derr == nil || serr == nil || !strings.Contains(serr.Error(), "more than 65536")) {
			t.Errorf("%d runs: DecodeMeta %v, streamed %v; want both refused", n, derr, serr)
		}
	}
}

// Every reader refuses region runs that do not describe the chunk's
// entries, with an error that says what is wrong.
func TestRegionRunsInvalid(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(m *Meta)
		want   string
	}{
		{"in a version 1 meta", func(m *Meta) {
			m.Version, m.Flow, m.FlowID, m.Flows, m.Coverage, m.Partitions, m.Group = MetaVersion, "a", 3, nil, nil, nil, ""
			m.Files[0].FlowIDs = nil
		}, "regions in a version 1 meta"},
		{"single run", func(m *Meta) { m.Files[0].Regions = []RegionRun{{7, 6}} }, "regions with 1 run(s)"},
		{"zero count", func(m *Meta) { m.Files[0].Regions = []RegionRun{{7, 2}, {8, 0}, {9, 4}} }, "regions[1]: region 8 with 0 entries"},
		{"adjacent equal regions", func(m *Meta) { m.Files[0].Regions = []RegionRun{{7, 2}, {7, 4}} }, "regions[1]: region 7 right after a run of itself"},
		{"sum too small", func(m *Meta) { m.Files[0].Regions = []RegionRun{{7, 2}, {8, 3}} }, "regions hold 5 entries, number_of_entries is 6"},
		{"sum too large", func(m *Meta) { m.Files[0].Regions = []RegionRun{{7, 2}, {8, 5}} }, "more entries than number_of_entries 6"},
		{"region id not 0", func(m *Meta) { m.Files[0].RegionID = 7 }, "regions beside region_id 7"},
		{"too many runs", func(m *Meta) {
			f := &m.Files[0]
			f.Regions = make([]RegionRun, MaxChunkRuns+1)
			for i := range f.Regions {
				f.Regions[i] = RegionRun{uint64(i), 1}
			}
			f.NumberOfEntries, f.Length, f.RawLength = MaxChunkRuns+1, 8*(MaxChunkRuns+1), 8*(MaxChunkRuns+1)
		}, "65537 region runs, more than 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := multiRegionMeta()
			tc.mutate(&m)
			if _, err := EncodeMeta(m); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("EncodeMeta: %v, want an error with %q", err, tc.want)
			}
			if m.Files[0].Regions != nil {
				fromSource := m
				fromSource.Files = append([]FileMeta(nil), m.Files...)
				fromSource.Files[0].SetRegionRuns(runSource(m.Files[0].Regions))
				if _, err := EncodeMeta(fromSource); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("EncodeMeta with the runs from a source: %v, want an error with %q", err, tc.want)
				}
			}
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeMeta(raw); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeMeta: %v, want an error with %q", err, tc.want)
			}
			if _, err := streamAll(raw, metaParts{}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("streamed: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// Runs decode with whitespace, as any JSON.
func TestRegionRunsWhitespace(t *testing.T) {
	raw, err := EncodeMeta(multiRegionMeta())
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte(`[[7,2],[0,3],[7,1]]`), []byte("[ [ 7 , 2 ] ,\n[0,3],[7,\t1]]"), 1)
	m, err := DecodeMeta(raw)
	if err != nil || !reflect.DeepEqual(m.Files[0].Regions, RegionRuns{{7, 2}, {0, 3}, {7, 1}}) {
		t.Fatalf("DecodeMeta with whitespace in runs: %v, %v", err, m.Files)
	}
}

// An empty list of runs is a list of runs: present, it is refused.
func TestRegionRunsEmptyList(t *testing.T) {
	raw, err := EncodeMeta(multiRegionMeta())
	if err != nil {
		t.Fatal(err)
	}
	raw = bytes.Replace(raw, []byte(`"regions":[[7,2],[0,3],[7,1]]`), []byte(`"regions":[]`), 1)
	const want = "regions with 0 run(s)"
	if _, err := DecodeMeta(raw); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("DecodeMeta: %v, want an error with %q", err, want)
	}
	if _, err := streamAll(raw, metaParts{}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("streamed: %v, want an error with %q", err, want)
	}
}

// A run that is not a pair of non-negative integers does not decode.
func TestRegionRunsMalformed(t *testing.T) {
	raw, err := EncodeMeta(multiRegionMeta())
	if err != nil {
		t.Fatal(err)
	}
	for name, run := range map[string]string{
		"three numbers":  `[7,2,1]`,
		"one number":     `[7]`,
		"object":         `{"region":7,"entries":2}`,
		"negative id":    `[-7,2]`,
		"negative count": `[7,-2]`,
		"fraction":       `[7,2.5]`,
		"huge count":     `[7,18446744073709551615]`,
	} {
		bad := bytes.Replace(raw, []byte(`[7,2],[0,3]`), []byte(run+`,[0,3]`), 1)
		if _, err := DecodeMeta(bad); err == nil {
			t.Errorf("%s: DecodeMeta accepted %s", name, run)
		}
		if _, err := streamAll(bad, metaParts{}); err == nil {
			t.Errorf("%s: streamed read accepted %s", name, run)
		}
	}
}

// runSource gives runs as a RegionRunSource, as the consumer does from its
// compact lists.
type runSource RegionRuns

func (s runSource) Len() int { return len(s) }
func (s runSource) Each(fn func(RegionRun)) {
	for _, r := range s {
		fn(r)
	}
}

// A file entry whose runs come from a source encodes to the same bytes as
// one that holds them in Regions, and decodes to them; a source whose runs
// are not as many as it says is refused.
func TestRegionRunSourceEncodesAsRegions(t *testing.T) {
	m := multiRegionMeta()
	want, err := EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	src := m
	src.Files = append([]FileMeta(nil), m.Files...)
	src.Files[0].SetRegionRuns(runSource(m.Files[0].Regions))
	if src.Files[0].Regions != nil {
		t.Fatal("SetRegionRuns left Regions")
	}
	got, err := EncodeMeta(src)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("encoded from a source:\n%s\nwant\n%s", got, want)
	}
	d, err := DecodeMeta(got)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Files[0].Regions, m.Files[0].Regions) {
		t.Errorf("decoded runs %v, want %v", d.Files[0].Regions, m.Files[0].Regions)
	}
	src.Files[0].SetRegionRuns(shortSource{runSource(m.Files[0].Regions)})
	if _, err := EncodeMeta(src); err == nil || !strings.Contains(err.Error(), "3 runs given of the 4 said") {
		t.Errorf("a source that miscounts its runs: %v, want it refused", err)
	}
}

// shortSource says it has one run more than it gives.
type shortSource struct{ runSource }

func (s shortSource) Len() int { return len(s.runSource) + 1 }
