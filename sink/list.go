package sink

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// ObjectInfo is what a listing tells of one object.
type ObjectInfo struct {
	Name    string
	Size    int64
	Created time.Time // when the store created the object
}

// Lister is implemented by buckets that list objects with their size and
// creation time, which garbage collection needs to respect a grace period.
type Lister interface {
	// List calls fn with every object whose name starts with prefix, in
	// lexical order of names, and stops at the first error fn returns,
	// returning it.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
}

// List implements Lister. An object's creation time is when Upload or
// Overwrite stored it, unless SetCreated changed it.
func (m *MemBucket) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	m.mu.RLock()
	var infos []ObjectInfo
	for n, b := range m.objects {
		if strings.HasPrefix(n, prefix) {
			infos = append(infos, ObjectInfo{Name: n, Size: int64(len(b)), Created: m.created[n]})
		}
	}
	m.mu.RUnlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	for _, o := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

// SetCreated sets the creation time List reports for object name, so that
// tests can age objects past a grace period. It reports whether the object
// exists.
func (m *MemBucket) SetCreated(name string, t time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.objects[name]; !ok {
		return false
	}
	m.created[name] = t
	return true
}

// List implements Lister when the wrapped bucket does; it is timed as
// "iter".
func (m *metricsBucket) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	l, ok := m.b.(Lister)
	if !ok {
		return fmt.Errorf("list %s: bucket cannot list object attributes", prefix)
	}
	start := time.Now()
	err := l.List(ctx, prefix, fn)
	m.done("iter", start, err)
	return err
}
