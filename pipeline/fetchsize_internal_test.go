package pipeline

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFetchSizer checks the fetch limit against the compression ratio of
// the batches read: small until a batch is seen, base over the ratio after,
// up at once when the data compresses better, back over about a fetch's
// worth of less compressible bytes, within [minFetchBytes, base].
func TestFetchSizer(t *testing.T) {
	const base = 8 << 20
	var set []int32
	f, first := newFetchSizer(base, func(n int32) { set = append(set, n) })
	if first != firstFetchBytes {
		t.Fatalf("first fetch limit %d, want %d", first, firstFetchBytes)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1")) // never dials: nothing is produced or fetched
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	f.setClient(cl)
	read := func(uncompressed, compressed int) int32 {
		f.OnFetchBatchRead(kgo.BrokerMetadata{}, "t", 0, kgo.FetchBatchMetrics{UncompressedBytes: uncompressed, CompressedBytes: compressed})
		return set[len(set)-1]
	}
	if got := read(100<<10, 100<<10); got != base {
		t.Fatalf("after an uncompressed batch: limit %d, want %d", got, base)
	}
	if got := read(400<<10, 100<<10); got != base/4 {
		t.Fatalf("after a batch compressed fourfold: limit %d, want %d", got, base/4)
	}
	if got := read(1<<20, 1<<10); got != minFetchBytes {
		t.Fatalf("after a batch compressed 1024-fold: limit %d, want the floor %d", got, minFetchBytes)
	}
	// Incompressible batches bring it back up, not at once.
	if got := read(1<<20, 1<<20); got != minFetchBytes && got >= base/2 {
		t.Fatalf("one incompressible MiB after a ratio of 1024: limit %d, want still small", got)
	}
	var got int32
	for range 128 { // 16 fetches' worth: the gap to 1 closes by e each
		got = read(1<<20, 1<<20)
	}
	if got < base*9/10 {
		t.Fatalf("after 128 MiB of incompressible batches: limit %d, want near %d", got, base)
	}
	n := len(set)
	read(1<<20, 1<<20)
	read(105<<10, 100<<10) // a ratio of 1.05: within a tenth of the limit set
	if len(set) != n {
		t.Fatalf("limit set again for a change under a tenth: %v", set[n:])
	}
	// Batches without sizes (a failed decode) change nothing.
	read(0, 0)
	if len(set) != n {
		t.Fatalf("limit set for a batch without sizes")
	}
}
