package sink_test

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// pipelineLikeEntries returns n bytes of framed entries shaped like the
// e2e BenchmarkPipeline load: encoded row keys with a ts, values of the
// load generator's kind (a row tag, then pseudo-random letters and
// digits), 1 in 4 of 1 KiB and the rest of 200 B. Such values hold no
// repeats for zstd to find; its entropy coding of the literals is what
// saves (about 6 bits of 8).
func pipelineLikeEntries(n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var out []byte
	x := uint64(42)
	for h := 0; len(out) < n; h++ {
		size := 200
		if h%4 == 0 {
			size = 1024
		}
		raw := binary.BigEndian.AppendUint64([]byte{'t'}, 7^1<<63)
		raw = binary.BigEndian.AppendUint64(append(raw, '_', 'r'), uint64(h)^1<<63)
		key := binary.BigEndian.AppendUint64(event.EncodeBytes(nil, raw), ^uint64(1<<40+h))
		v := fmt.Appendf(nil, "t7h%d-", h)
		for len(v) < size {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			v = append(v, alphabet[x%uint64(len(alphabet))])
		}
		out = event.AppendEntry(out, key, v)
	}
	return out[:n]
}

// BenchmarkTempBuffer measures, per 32 KiB temp-file buffer of
// pipeline-like entries, the two per-byte costs the consumer cannot skip
// with --compression zstd: the buffer's zstd frame (sink.AppendZstdFrame,
// the fastest level) and the sha256 of its framed bytes that every chunk's
// meta carries (docs/FORMAT.md, "Meta objects"). On one core; compare
// MB/s with the
// consumer's core-seconds per GB of BenchmarkPipeline
// (docs/SIZING.md, "Throughput and CPU of the flush").
func BenchmarkTempBuffer(b *testing.B) {
	const bufSize = 32 << 10
	src := pipelineLikeEntries(16 << 20)
	b.Run("zstd-frame", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		var dst []byte
		var in, out int64
		for b.Loop() {
			for i := 0; i+bufSize <= len(src); i += bufSize {
				var err error
				if dst, err = sink.AppendZstdFrame(dst[:0], src[i:i+bufSize]); err != nil {
					b.Fatal(err)
				}
				in += bufSize
				out += int64(len(dst))
			}
		}
		b.ReportMetric(float64(out)/float64(in), "ratio")
	})
	b.Run("sha256", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			h := sha256.New()
			for i := 0; i+bufSize <= len(src); i += bufSize {
				h.Write(src[i : i+bufSize])
			}
			h.Sum(nil)
		}
	})
}
