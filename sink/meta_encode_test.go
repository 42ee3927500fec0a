package sink

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"testing"
)

// plainFile is FileMeta without its MarshalJSON: what encoding/json
// writes by reflection, the reference of the hand-written encoding.
type plainFile FileMeta

// A file entry encodes to exactly the bytes encoding/json gives its fields,
// and a meta to those json.Marshal gives it, so that hand-encoding changed
// no byte of the format.
func TestFileEntryEncodesAsEncodingJSON(t *testing.T) {
	base := validV2Meta().Files[0]
	withRuns := base
	withRuns.RegionID, withRuns.Regions = 0, RegionRuns{{7, 2}, {0, 3}, {math.MaxUint64, math.MaxInt64}}
	odd := base
	odd.Compression, odd.StartKey, odd.EndKey = "z<s>&\"\\\x01é", "", "ff"
	extremes := base
	extremes.Offset, extremes.Length, extremes.MinTS, extremes.MaxTS = math.MinInt64, math.MaxInt64, 0, math.MaxUint64
	extremes.TableID, extremes.Partition, extremes.IsMeta = -1, math.MinInt32, true
	noFlows := base
	noFlows.FlowIDs = nil
	emptyRuns := base
	emptyRuns.Regions = RegionRuns{}
	for _, tc := range []struct {
		name string
		f    FileMeta
		// sized: jsonSize covers the entry (escapes and runs of
		// 20-digit numbers are longer than it allows for)
		sized bool
	}{
		{"one region", base, true},
		{"region runs", withRuns, false},
		{"strings to escape", odd, false},
		{"extreme numbers", extremes, true},
		{"no flow ids", noFlows, true},
		{"empty runs omitted", emptyRuns, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(plainFile(tc.f))
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.f.appendJSON(nil); !bytes.Equal(got, want) {
				t.Errorf("hand-encoded\n%s\nwant\n%s", got, want)
			}
			if n := tc.f.jsonSize(); tc.sized && len(want) > n {
				t.Errorf("%d bytes, jsonSize %d", len(want), n)
			}
			if len(tc.f.Regions) > 0 {
				src := tc.f
				src.SetRegionRuns(runSource(tc.f.Regions))
				if got := src.appendJSON(nil); !bytes.Equal(got, want) {
					t.Errorf("hand-encoded from a run source\n%s\nwant\n%s", got, want)
				}
			}
		})
	}
	t.Run("meta", func(t *testing.T) {
		m := multiRegionMeta()
		m.Files = append(m.Files, base, noFlows)
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeMetaJSON(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("meta\n%s\nwant\n%s", got, want)
		}
		m.Files = nil
		if got, err := encodeMetaJSON(m); err != nil || !bytes.HasSuffix(got, []byte(`"files":[]}`)) {
			t.Errorf("meta without files: %s, %v", got, err)
		}
	})
}

// isHex takes even-length lowercase hex only, as the meta's hex fields are
// written.
func TestIsHex(t *testing.T) {
	for s, want := range map[string]bool{
		"": true, "00": true, "0123456789abcdef": true, "ff": true,
		"0": false, "ABCD": false, "0g": false, "/0": false, ":0": false, "`0": false,
		"0\x80": false, "0\xff": false, "a ": false, "zz": false,
	} {
		if got := isHex(s); got != want {
			t.Errorf("isHex(%q) = %v, want %v", s, got, want)
		}
	}
}

// BenchmarkIsHex checks sha256s in hex, as the meta's check does per
// chunk: many different ones, whose digits and letters fall at random.
func BenchmarkIsHex(b *testing.B) {
	var hs []string
	for i := range 4096 {
		sum := sha256.Sum256([]byte{byte(i), byte(i >> 8)})
		hs = append(hs, hex.EncodeToString(sum[:]))
	}
	i := 0
	for b.Loop() {
		if !isHex(hs[i&4095]) {
			b.Fatal("not hex")
		}
		i++
	}
}
