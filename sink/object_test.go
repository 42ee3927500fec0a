package sink_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// buildObject uploads the chunks as one data object and returns their metas.
func buildObject(t testing.TB, b sink.Bucket, name, compression string, chunks [][]byte) []sink.FileMeta {
	t.Helper()
	var buf bytes.Buffer
	w, err := sink.NewObjectWriter(&buf, compression)
	if err != nil {
		t.Fatal(err)
	}
	var files []sink.FileMeta
	for _, c := range chunks {
		off, n, raw, err := w.AddChunk(bytes.NewReader(c))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(c)
		files = append(files, sink.FileMeta{Offset: off, Length: n, RawLength: raw, Compression: compression,
			SHA256: hex.EncodeToString(sum[:]), CF: "write", Op: "put"})
	}
	if w.Size() != int64(buf.Len()) || w.CRC32C() != sink.CRC32C(buf.Bytes()) {
		t.Fatalf("writer size/crc %d/%08x, bytes %d/%08x", w.Size(), w.CRC32C(), buf.Len(), sink.CRC32C(buf.Bytes()))
	}
	if err := b.Upload(context.Background(), sink.Object{Name: name, Body: &buf, Size: w.Size(), CRC32C: w.CRC32C()}); err != nil {
		t.Fatal(err)
	}
	return files
}

func randomChunks(r *rand.Rand, n int) [][]byte {
	var out [][]byte
	for i := range n {
		c := []byte(strings.Repeat(fmt.Sprintf("entry-%d-", i), r.IntN(5000)))
		for j := range c {
			if r.IntN(8) == 0 {
				c[j] = byte(r.Uint32())
			}
		}
		out = append(out, c)
	}
	return append(out, nil) // an empty chunk too
}

func TestObjectChunks(t *testing.T) {
	ctx := context.Background()
	for _, comp := range []string{sink.CompressionNone, sink.CompressionZstd} {
		t.Run(comp, func(t *testing.T) {
			b := sink.NewMemBucket()
			chunks := randomChunks(rand.New(rand.NewPCG(1, 2)), 6)
			files := buildObject(t, b, "obj", comp, chunks)
			var end int64
			for i, f := range files {
				if f.Offset != end {
					t.Fatalf("chunk %d at %d, want back to back at %d", i, f.Offset, end)
				}
				end += f.Length
				got, err := sink.ReadChunk(ctx, b, "obj", f)
				if err != nil {
					t.Fatalf("chunk %d: %v", i, err)
				}
				if !bytes.Equal(got, chunks[i]) || f.RawLength != int64(len(chunks[i])) {
					t.Fatalf("chunk %d differs", i)
				}
			}
			if comp == sink.CompressionZstd && files[0].Length >= files[0].RawLength {
				t.Errorf("zstd chunk not smaller: %d >= %d", files[0].Length, files[0].RawLength)
			}
		})
	}
}

func TestReadChunkCorrupt(t *testing.T) {
	ctx := context.Background()
	for _, comp := range []string{sink.CompressionNone, sink.CompressionZstd} {
		for _, tc := range []struct {
			name string
			mod  func(b *sink.MemBucket, f *sink.FileMeta)
		}{
			{"flipped byte", func(b *sink.MemBucket, f *sink.FileMeta) { b.Corrupt("obj", f.Offset+f.Length/2) }},
			{"wrong sha", func(b *sink.MemBucket, f *sink.FileMeta) { f.SHA256 = strings.Repeat("0", 64) }},
			{"short length", func(b *sink.MemBucket, f *sink.FileMeta) { f.Length--; f.RawLength = min(f.RawLength, f.Length+1000) }},
			{"raw length", func(b *sink.MemBucket, f *sink.FileMeta) { f.RawLength-- }},
		} {
			t.Run(comp+"/"+tc.name, func(t *testing.T) {
				b := sink.NewMemBucket()
				files := buildObject(t, b, "obj", comp, randomChunks(rand.New(rand.NewPCG(3, 4)), 3))
				f := files[1]
				tc.mod(b, &f)
				_, err := sink.ReadChunk(ctx, b, "obj", f)
				var ce *sink.ChecksumError
				if !errors.As(err, &ce) {
					t.Fatalf("ReadChunk = %v, want *ChecksumError", err)
				}
				if ce.Object != "obj" || ce.Offset != f.Offset || !strings.Contains(err.Error(), "obj") {
					t.Fatalf("error does not name object and chunk: %v", err)
				}
			})
		}
	}
	if _, err := sink.ReadChunk(ctx, sink.NewMemBucket(), "missing", sink.FileMeta{Length: 1, RawLength: 1}); !errors.Is(err, sink.ErrNotExist) {
		t.Fatalf("missing object: %v", err)
	}
}

func BenchmarkAddChunk(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	// Framed entries resembling real ones: keys with shared prefixes,
	// half-random values.
	var chunk []byte
	for len(chunk) < 4<<20 {
		k := fmt.Appendf(nil, "t\x80\x00\x00\x00\x00\x00\x00\x01_r%016x", r.Uint64()%100000)
		v := make([]byte, 64)
		for i := range v[:32] {
			v[i] = byte(r.Uint32())
		}
		chunk = append(chunk, byte(len(k)), 0, 0, 0)
		chunk = append(chunk, k...)
		chunk = append(chunk, byte(len(v)), 0, 0, 0)
		chunk = append(chunk, v...)
	}
	for _, comp := range []string{sink.CompressionNone, sink.CompressionZstd} {
		b.Run(comp, func(b *testing.B) {
			w, err := sink.NewObjectWriter(discard{}, comp)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(chunk)))
			for b.Loop() {
				if _, _, _, err := w.AddChunk(bytes.NewReader(chunk)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(w.Size())/float64(int64(len(chunk))*int64(b.N)), "ratio")
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// A consumer builds a data object per flow per cycle, every
// second or so. Building one must not allocate a fresh zstd encoder with
// its window history (16 MiB at an 8 MiB window, once a chunk is past a
// block of 128 KiB): encoders are borrowed from a pool for one chunk at a
// time, with a 1 MiB window. 20 objects of three 256 KiB chunks allocate
// little more than their own bytes; every chunk still reads back.
func TestObjectWriterReusesEncoders(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	r := rand.New(rand.NewPCG(10, 2))
	var chunks [][]byte
	for range 3 {
		c := make([]byte, 256<<10)
		for j := range c {
			c[j] = "abcdefghijklmnopqrstuvwxyz0123456789"[r.IntN(36)]
		}
		chunks = append(chunks, c)
	}
	build := func(name string) []sink.FileMeta { return buildObject(t, b, name, sink.CompressionZstd, chunks) }
	build("warm-up")
	const objects = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range objects {
		build(fmt.Sprintf("o-%d", i))
	}
	runtime.ReadMemStats(&after)
	// An object's own bytes (its buffer as it grows, the bucket's copy)
	// come to about 4 MiB; an encoder of its own adds 17 MiB.
	per := (after.TotalAlloc - before.TotalAlloc) / objects
	if per > 10<<20 {
		t.Errorf("building an object of 768 KiB allocated %d KiB, want at most 10 MiB", per>>10)
	}
	files := build("check")
	for i, f := range files {
		got, err := sink.ReadChunk(ctx, b, "check", f)
		if err != nil || !bytes.Equal(got, chunks[i]) {
			t.Fatalf("chunk %d: %v (%d bytes, want %d)", i, err, len(got), len(chunks[i]))
		}
	}
}
