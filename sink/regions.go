package sink

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// MaxChunkRuns is the most region runs a chunk's file entry may list
// (FileMeta.Regions). The consumer starts a new chunk of the same key
// before a chunk would take one more, and readers refuse a file entry with
// more. At most 43 bytes of JSON each, 65,536 runs keep a file entry far
// below the streamed reader's bound on one array element (4 MiB).
const MaxChunkRuns = 1 << 16

// RegionRun is one run of a multi-region chunk: Entries consecutive entries
// that region Region sent. It is stored as the JSON array
// [<region id>, <entries>].
type RegionRun struct {
	Region  uint64
	Entries int64
}

// RegionRuns are the runs of a multi-region chunk, in entry order.
type RegionRuns []RegionRun

// MarshalJSON writes the runs as an array of [region, entries] pairs, all
// at once: a cycle's meta may list a million of them.
func (rs RegionRuns) MarshalJSON() ([]byte, error) {
	if rs == nil {
		return []byte("null"), nil
	}
	b := make([]byte, 0, 2+len(rs)*16)
	b = append(b, '[')
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = r.appendJSON(b)
	}
	return append(b, ']'), nil
}

// MarshalJSON writes r as [region, entries].
func (r RegionRun) MarshalJSON() ([]byte, error) { return r.appendJSON(make([]byte, 0, 44)), nil }

func (r RegionRun) appendJSON(b []byte) []byte {
	b = append(b, '[')
	b = strconv.AppendUint(b, r.Region, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, r.Entries, 10)
	return append(b, ']')
}

// UnmarshalJSON reads [region, entries]: an array of exactly two
// non-negative integers, entries at most MaxInt64. (The decoder hands it
// syntactically valid JSON: a value of digits alone is an integer.)
func (r *RegionRun) UnmarshalJSON(b []byte) error {
	bad := func(why string) error {
		return fmt.Errorf("region run %.40s: want [region id, entries]: %s", b, why)
	}
	in := bytes.TrimSpace(b)
	if len(in) < 2 || in[0] != '[' || in[len(in)-1] != ']' {
		return bad("not an array")
	}
	parts := bytes.Split(in[1:len(in)-1], []byte(","))
	if len(parts) != 2 {
		return bad(fmt.Sprintf("%d elements", len(parts)))
	}
	var v [2]uint64
	for i, p := range parts {
		p = bytes.TrimSpace(p)
		if len(p) == 0 || bytes.IndexFunc(p, func(c rune) bool { return c < '0' || c > '9' }) >= 0 {
			return bad("not a non-negative integer")
		}
		n, err := strconv.ParseUint(string(p), 10, 64)
		if err != nil {
			return bad("out of range")
		}
		v[i] = n
	}
	if v[1] > math.MaxInt64 {
		return bad("entries out of range")
	}
	r.Region, r.Entries = v[0], int64(v[1])
	return nil
}

// RegionRunSource gives a chunk's region runs in entry order without a
// RegionRuns slice. The consumer keeps a chunk's runs as a few bytes each
// and lists them in the chunk's file entry only while the meta is encoded
// (FileMeta.SetRegionRuns): decoded, at 16 bytes a run, a wide cycle's runs
// were a tenth of the consumer's heap at its peak.
type RegionRunSource interface {
	// Len is the number of runs.
	Len() int
	// Each calls fn with every run, in entry order.
	Each(fn func(RegionRun))
}

// SetRegionRuns makes src the file's region runs, in place of Regions,
// for encoding and checking the file entry; nil takes them away. The entry
// is encoded exactly as with Regions holding the same runs. Decoding fills
// Regions, never a source.
func (f *FileMeta) SetRegionRuns(src RegionRunSource) {
	f.Regions = nil
	f.runs = src
}

// eachRun calls fn with every region run the file lists (Regions, or its
// run source) and returns how many there are; none for a chunk of one
// region.
func (f *FileMeta) eachRun(fn func(RegionRun)) int {
	if f.runs != nil {
		f.runs.Each(fn)
		return f.runs.Len()
	}
	for _, r := range f.Regions {
		fn(r)
	}
	return len(f.Regions)
}

// listsRuns reports whether the file lists region runs.
func (f *FileMeta) listsRuns() bool { return f.Regions != nil || f.runs != nil }

// EachRegion calls fn for each run of regions of the chunk, in entry
// order: its Regions, or for a chunk of one region a single run of
// RegionID with every entry. A reader that keys entries by region takes
// the first run's entries from the first entries of the chunk, and so on.
func (f *FileMeta) EachRegion(fn func(region uint64, entries int64)) {
	if !f.listsRuns() {
		fn(f.RegionID, f.NumberOfEntries)
		return
	}
	f.eachRun(func(r RegionRun) { fn(r.Region, r.Entries) })
}

// MarshalJSON encodes the file entry as encoding/json encodes its fields,
// taking its region runs from its run source when it has one.
func (f FileMeta) MarshalJSON() ([]byte, error) {
	return f.appendJSON(nil), nil
}

// validateRegions checks a file's region runs (docs/FORMAT.md, "Meta
// objects, version 2"): only in a version 2 meta; region_id 0 beside them;
// at least two runs and at most MaxChunkRuns, each of at least one entry
// and of another region than the run before; as many entries as the chunk
// holds. A chunk of one region lists no runs: its region_id says it.
func (f *FileMeta) validateRegions(version int) error {
	if !f.listsRuns() {
		return nil
	}
	n := len(f.Regions)
	if f.runs != nil {
		n = f.runs.Len()
	}
	switch {
	case version != MetaVersion2:
		return errors.New("regions in a version 1 meta")
	case f.RegionID != 0:
		return fmt.Errorf("regions beside region_id %d: a chunk of several regions has region_id 0", f.RegionID)
	case n < 2:
		return fmt.Errorf("regions with %d run(s): a chunk of one region has its region_id and no regions", n)
	case n > MaxChunkRuns:
		return fmt.Errorf("%d region runs, more than %d", n, MaxChunkRuns)
	}
	var (
		sum  int64
		i    int
		prev uint64
		err  error
	)
	f.eachRun(func(r RegionRun) {
		switch {
		case err != nil:
			return
		case r.Entries < 1:
			err = fmt.Errorf("regions[%d]: region %d with %d entries, want at least 1", i, r.Region, r.Entries)
		case i > 0 && r.Region == prev:
			err = fmt.Errorf("regions[%d]: region %d right after a run of itself", i, r.Region)
		case r.Entries > f.NumberOfEntries-sum:
			err = fmt.Errorf("regions hold more entries than number_of_entries %d", f.NumberOfEntries)
		}
		sum += r.Entries
		prev = r.Region
		i++
	})
	if err != nil {
		return err
	}
	if i != n {
		return fmt.Errorf("regions: %d runs given of the %d said", i, n)
	}
	if sum != f.NumberOfEntries {
		return fmt.Errorf("regions hold %d entries, number_of_entries is %d", sum, f.NumberOfEntries)
	}
	return nil
}
