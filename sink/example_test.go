package sink_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/flowlog/flowlog/sink"
)

// Example builds a data object of two chunks, uploads it, and reads one
// chunk back with its checksum verified.
func Example() {
	ctx := context.Background()
	b := sink.NewMemBucket()

	var buf bytes.Buffer
	w, err := sink.NewObjectWriter(&buf, sink.CompressionZstd)
	if err != nil {
		panic(err)
	}
	var files []sink.FileMeta
	for _, chunk := range [][]byte{[]byte("first temp file"), []byte("second temp file")} {
		off, n, raw, err := w.AddChunk(bytes.NewReader(chunk))
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(chunk)
		files = append(files, sink.FileMeta{Offset: off, Length: n, RawLength: raw, Compression: sink.CompressionZstd, SHA256: hex.EncodeToString(sum[:])})
	}
	const ts = 431656320867237891
	name := sink.DataPath("backups", "default", "orders", 1, ts, "c1")
	if err := b.Upload(ctx, sink.Object{Name: name, Body: &buf, Size: w.Size(), CRC32C: w.CRC32C()}); err != nil {
		panic(err)
	}
	chunk, err := sink.ReadChunk(ctx, b, name, files[1])
	if err != nil {
		panic(err)
	}
	fmt.Println(name)
	fmt.Println(sink.MetaPath("backups", "default", "orders", 1, ts, "c1"))
	fmt.Printf("%s\n", chunk)
	// Output:
	// backups/default/orders/v1/20220307/07/431656320867237891-1-c1.log
	// backups/default/orders/v1/backupmeta/00431656320867237891-1-c1.meta
	// second temp file
}
