package sink

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Overwriter is implemented by buckets that can replace an object in one
// call. flowlog rewrites exactly one kind of object, the 8-byte global
// checkpoint; every other object is written once with Upload.
type Overwriter interface {
	// Overwrite writes obj.Name whether or not it exists, validating
	// CRC32C like Upload. Readers see the old or the new content, never
	// none.
	Overwrite(ctx context.Context, obj Object) error
}

// Overwrite implements Overwriter.
func (m *MemBucket) Overwrite(ctx context.Context, obj Object) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("overwrite %s: %w", obj.Name, err)
	}
	b, err := io.ReadAll(obj.Body)
	if err != nil {
		return fmt.Errorf("overwrite %s: read body: %w", obj.Name, err)
	}
	if int64(len(b)) != obj.Size || CRC32C(b) != obj.CRC32C {
		return fmt.Errorf("overwrite %s: body does not match its declared size and crc32c", obj.Name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.objects[obj.Name] = b
	m.created[obj.Name] = time.Now()
	return nil
}

// Overwrite implements Overwriter when the wrapped bucket does.
func (m *metricsBucket) Overwrite(ctx context.Context, obj Object) error {
	ow, ok := m.b.(Overwriter)
	if !ok {
		return fmt.Errorf("overwrite %s: bucket cannot overwrite", obj.Name)
	}
	start := time.Now()
	err := ow.Overwrite(ctx, obj)
	m.done("overwrite", start, err)
	return err
}
