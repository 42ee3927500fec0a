package sink_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// A chunk written as a run of zstd frames (what the pipeline writes: one
// frame per temp file buffer) reads back whole through ReadChunk, with
// empty frames and a frame larger than the reader's 8 MiB window limit
// among them.
func TestChunkOfZstdFrames(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	parts := [][]byte{
		bytes.Repeat([]byte("entry-a "), 4000),
		nil,
		bytes.Repeat([]byte{7}, 12<<20), // one large entry: a frame of its own
		[]byte("tail"),
	}
	var raw, stored []byte
	for _, p := range parts {
		raw = append(raw, p...)
		var err error
		if stored, err = sink.AppendZstdFrame(stored, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Upload(ctx, sink.Object{Name: "o", Body: bytes.NewReader(stored), Size: int64(len(stored)), CRC32C: sink.CRC32C(stored)}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	f := sink.FileMeta{Offset: 0, Length: int64(len(stored)), RawLength: int64(len(raw)), Compression: sink.CompressionZstd,
		SHA256: hex.EncodeToString(sum[:]), CF: "write", Op: "put"}
	got, err := sink.ReadChunk(ctx, b, "o", f)
	if err != nil {
		t.Fatalf("read the chunk: %v", err)
	}
	if !bytes.Equal(got, raw) {
		t.Fatalf("read %d bytes, wrote %d", len(got), len(raw))
	}
}
