package sink

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
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
