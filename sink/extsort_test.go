package sink

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestExtSorter(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 50000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := newExtSorter(t.TempDir(), "t", 1<<20)
			r := rand.New(rand.NewPCG(1, uint64(n)))
			var want []string
			for i := range n {
				k := fmt.Appendf(nil, "%08x-%d", r.Uint32(), i)
				v := bytes.Repeat([]byte{byte(i)}, r.IntN(100))
				if err := s.add(k, v); err != nil {
					t.Fatal(err)
				}
				want = append(want, fmt.Sprintf("%s=%x", k, v))
			}
			if n == 50000 && len(s.runs) < 2 {
				t.Fatalf("%d runs spilled, want several", len(s.runs))
			}
			slices.Sort(want)
			it, err := s.iter()
			if err != nil {
				t.Fatal(err)
			}
			defer it.Close()
			var got []string
			for {
				k, v, ok, err := it.next()
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				got = append(got, fmt.Sprintf("%s=%x", k, v))
			}
			if !slices.Equal(got, want) {
				t.Fatalf("got %d entries, want %d, or order differs", len(got), len(want))
			}
		})
	}
}

// TestExtSorterKeyShapes checks the order where the cached key bytes tie or
// mislead: keys sharing a long prefix, keys that are prefixes of others,
// keys ending in zero bytes (equal to the padding), and entries larger than
// a slab, with spills in between.
func TestExtSorterKeyShapes(t *testing.T) {
	common := bytes.Repeat([]byte("z\x80\x00\x00\x00\x00\x00\x00\xff"), 3)
	shapes := []struct {
		name string
		n    int
		key  func(r *rand.Rand, i int) []byte
		vlen func(r *rand.Rand, i int) int
	}{
		{"long common prefix", 20000, func(r *rand.Rand, i int) []byte {
			return binary.BigEndian.AppendUint64(slices.Clone(common), r.Uint64()>>r.IntN(64))
		}, func(r *rand.Rand, i int) int { return r.IntN(200) }},
		{"prefixes and zero tails", 60000, func(r *rand.Rand, i int) []byte {
			k := slices.Clone(common)
			for range r.IntN(24) {
				k = append(k, []byte{0, 0, 1, 0xff}[r.IntN(4)])
			}
			return k
		}, func(r *rand.Rand, i int) int { return r.IntN(50) }},
		{"entries larger than a slab", 2000, func(r *rand.Rand, i int) []byte {
			return fmt.Appendf(slices.Clone(common), "%04d", r.IntN(500))
		}, func(r *rand.Rand, i int) int {
			if i%200 == 0 {
				return slabSize + r.IntN(slabSize)
			}
			return r.IntN(5000)
		}},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			s := newExtSorter(t.TempDir(), "t", 4<<20)
			r := rand.New(rand.NewPCG(2, 3))
			var want []string
			for i := range sh.n {
				k := sh.key(r, i)
				v := bytes.Repeat([]byte{byte(i)}, sh.vlen(r, i))
				if err := s.add(k, v); err != nil {
					t.Fatal(err)
				}
				want = append(want, fmt.Sprintf("%x=%x", k, v))
			}
			if len(s.runs) < 2 {
				t.Fatalf("%d runs spilled, want several", len(s.runs))
			}
			it, err := s.iter()
			if err != nil {
				t.Fatal(err)
			}
			defer it.Close()
			var got []string
			var prev []byte
			for {
				k, v, ok, err := it.next()
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				if bytes.Compare(prev, k) > 0 {
					t.Fatalf("key %x after %x", k, prev)
				}
				prev = append(prev[:0], k...)
				got = append(got, fmt.Sprintf("%x=%x", k, v))
			}
			// Equal keys may come in any order: compare as multisets.
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("got %d entries, want %d, or contents differ", len(got), len(want))
			}
		})
	}
}

// TestExtSorterSpillError reports a run file that cannot be written.
func TestExtSorterSpillError(t *testing.T) {
	s := newExtSorter(filepath.Join(t.TempDir(), "missing"), "t", 4<<20)
	var err error
	for i := 0; err == nil && i < 100000; i++ {
		err = s.add(fmt.Appendf(nil, "%08d", i), make([]byte, 100))
	}
	if err == nil {
		_, err = s.iter()
	}
	if err == nil || !strings.Contains(err.Error(), "spill sorted run") {
		t.Fatalf("got %v, want a spill error", err)
	}
	s.close()
}
