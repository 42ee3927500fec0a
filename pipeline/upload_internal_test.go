package pipeline

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// An upload's ErrExists is success only for the object the cycle itself
// wrote (same size and CRC32C); another object under the name is an error.
func TestUploadedTakesErrExistsOnlyForTheSameObject(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	ours := []byte("this cycle's data object")
	put := func(body []byte) error {
		return b.Upload(ctx, sink.Object{Name: "o", Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)})
	}
	if err := uploaded(ctx, b, "o", int64(len(ours)), sink.CRC32C(ours), put(ours)); err != nil {
		t.Fatalf("first upload: %v", err)
	}
	if err := uploaded(ctx, b, "o", int64(len(ours)), sink.CRC32C(ours), put(ours)); err != nil {
		t.Fatalf("retry of the same object: %v, want success", err)
	}
	for _, other := range [][]byte{[]byte("THIS CYCLE's data object"), []byte("another flow's object, longer")} {
		if err := uploaded(ctx, b, "o", int64(len(other)), sink.CRC32C(other), put(other)); !errors.Is(err, errForeignObject) {
			t.Fatalf("upload of other bytes over an existing object: %v, want errForeignObject", err)
		}
	}
	failed := errors.New("injected")
	if err := uploaded(ctx, b, "x", 1, 1, failed); !errors.Is(err, failed) {
		t.Fatalf("a failed upload: %v", err)
	}
}
