package gcs

import (
	"context"
	"fmt"
	"io"

	"github.com/flowlog/flowlog/sink"
)

// Overwrite implements sink.Overwriter: a single-request write without a
// precondition, so readers see the old or the new object, never none. It
// uses the KMS key of Upload.
func (b *Bucket) Overwrite(ctx context.Context, obj sink.Object) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := b.newWriter(ctx, b.bkt.Object(obj.Name), obj)
	w.ChunkSize = 0 // one request whatever the size
	if _, err := io.Copy(w, obj.Body); err != nil {
		cancel()
		_ = w.Close()
		return fmt.Errorf("overwrite gs://%s/%s: %w", b.name, obj.Name, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("overwrite gs://%s/%s: %w", b.name, obj.Name, err)
	}
	return nil
}
