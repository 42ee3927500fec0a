package sink

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// MemBucket is a Bucket in memory, for tests. It enforces the same contract
// as the real stores: DoesNotExist preconditions and CRC32C validation.
type MemBucket struct {
	mu      sync.RWMutex
	objects map[string][]byte
	created map[string]time.Time // for List
}

var _ Bucket = (*MemBucket)(nil)

// NewMemBucket returns an empty MemBucket.
func NewMemBucket() *MemBucket {
	return &MemBucket{objects: map[string][]byte{}, created: map[string]time.Time{}}
}

// Upload implements Bucket.
func (m *MemBucket) Upload(ctx context.Context, obj Object) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("upload %s: %w", obj.Name, err)
	}
	b, err := io.ReadAll(obj.Body)
	if err != nil {
		return fmt.Errorf("upload %s: read body: %w", obj.Name, err)
	}
	if int64(len(b)) != obj.Size {
		return fmt.Errorf("upload %s: body is %d bytes, want %d", obj.Name, len(b), obj.Size)
	}
	if got := CRC32C(b); got != obj.CRC32C {
		return fmt.Errorf("upload %s: crc32c mismatch: body %08x, declared %08x", obj.Name, got, obj.CRC32C)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objects[obj.Name]; ok {
		return fmt.Errorf("upload %s: %w", obj.Name, ErrExists)
	}
	m.objects[obj.Name] = b
	m.created[obj.Name] = time.Now()
	return nil
}

func (m *MemBucket) get(name string) ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, ok := m.objects[name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, ErrNotExist)
	}
	return b, nil
}

// Get implements Bucket.
func (m *MemBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	b, err := m.get(name)
	if err != nil {
		return nil, fmt.Errorf("get %w", err)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// GetRange implements Bucket.
func (m *MemBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	b, err := m.get(name)
	if err != nil {
		return nil, fmt.Errorf("get range %w", err)
	}
	if off < 0 || length < 0 {
		return nil, fmt.Errorf("get range %s: bad range %d+%d", name, off, length)
	}
	if off > int64(len(b)) {
		off = int64(len(b))
	}
	end := min(off+length, int64(len(b)))
	return io.NopCloser(bytes.NewReader(b[off:end])), nil
}

// Size implements Bucket.
func (m *MemBucket) Size(ctx context.Context, name string) (int64, error) {
	b, err := m.get(name)
	if err != nil {
		return 0, fmt.Errorf("size %w", err)
	}
	return int64(len(b)), nil
}

// Iter implements Bucket.
func (m *MemBucket) Iter(ctx context.Context, prefix string, fn func(name string) error) error {
	m.mu.RLock()
	var names []string
	for n := range m.objects {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	m.mu.RUnlock()
	sort.Strings(names)
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(n); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements Bucket.
func (m *MemBucket) Delete(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.objects, name)
	delete(m.created, name)
	return nil
}

// Close implements Bucket.
func (m *MemBucket) Close() error { return nil }

// Corrupt flips one bit of the byte at off of object name, to test that
// readers detect damaged objects. It reports whether the object and offset
// exist.
func (m *MemBucket) Corrupt(name string, off int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.objects[name]
	if !ok || off < 0 || off >= int64(len(b)) {
		return false
	}
	c := bytes.Clone(b)
	c[off] ^= 0x01
	m.objects[name] = c
	return true
}
