package sink_test

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// The CRC32C combined from the parts' checksums is the CRC32C of the
// whole, for empty, short and long parts.
func TestCombineCRC32C(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sizes := range [][]int{{0}, {0, 0}, {1}, {5, 0, 7}, {31, 1, 32, 33}, {1 << 16, 3, 100_003}, {0, 1 << 20, 1}, {2047, 2048, 2049, 4096}, {100, 2 << 10, 1, (2 << 10) + 1}} {
		var whole []byte
		var crc uint32
		for _, n := range sizes {
			part := make([]byte, n)
			for i := range part {
				part[i] = byte(rng.Uint32())
			}
			whole = append(whole, part...)
			crc = sink.CombineCRC32C(crc, sink.CRC32C(part), int64(n))
		}
		if want := sink.CRC32C(whole); crc != want {
			t.Errorf("parts %v: combined %08x, whole %08x", sizes, crc, want)
		}
	}
	if got, want := sink.CombineCRC32C(sink.CRC32C([]byte("ab")), sink.CRC32C([]byte("c")), 1), sink.CRC32C(bytes.Repeat([]byte("abc"), 1)); got != want {
		t.Errorf("ab+c: %08x, want %08x", got, want)
	}
}

// BenchmarkCombineCRC32C is one combine of a part of each size, as the
// consumer makes per chunk and extent: a wide cycle's chunks are a few
// hundred bytes, a narrow one's tens of KiB.
func BenchmarkCombineCRC32C(b *testing.B) {
	for _, n := range []int64{300, 1500, 2 << 10, 3000, 32 << 10} {
		b.Run(strconv.FormatInt(n, 10), func(b *testing.B) {
			var crc uint32
			for b.Loop() {
				crc = sink.CombineCRC32C(crc, 0x12345678, n)
			}
			_ = crc
		})
	}
}
