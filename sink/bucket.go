// Package sink stores flowlog's backups in an object store: the Bucket
// contract every backend implements (an in-memory one here, GCS in sink/gcs),
// the object layout and meta JSON (docs/FORMAT.md, "Bucket layout"), the
// data-object builder, and the readers that restore and verify a flow's
// backup.
package sink

import (
	"context"
	"errors"
	"hash/crc32"
	"io"
)

// ErrExists is wrapped by Bucket.Upload when the object already exists: names
// are never reused, so an existing object means a retried or duplicate write.
var ErrExists = errors.New("object already exists")

// ErrNotExist is wrapped by reads of an object that does not exist.
var ErrNotExist = errors.New("object does not exist")

// castagnoli is the CRC32C table objects are checksummed with.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the CRC32C (Castagnoli) checksum of b, the checksum
// Object.CRC32C carries.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateCRC32C returns crc updated with b.
func UpdateCRC32C(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

// Object is one object to upload.
type Object struct {
	// Name is the full object name (any prefix included).
	Name string
	// Body is the content; it is read once per Upload call.
	Body io.Reader
	// Size is the length of Body in bytes.
	Size int64
	// CRC32C is the Castagnoli CRC32 of Body; the store validates it and
	// rejects the upload if the bytes it received do not match.
	CRC32C uint32
}

// Bucket is an object store holding immutable objects. All methods are safe
// for concurrent use. Names are full object names: no backend adds a prefix.
type Bucket interface {
	// Upload writes obj.Name only if it does not exist yet (the DoesNotExist
	// precondition), sending CRC32C for server-side validation. It returns an
	// error wrapping ErrExists if the object exists, and an error if the
	// bytes do not match obj.CRC32C or obj.Size, in which case no object is
	// created. Body is read once per call; callers retry by calling again
	// with a fresh Body.
	Upload(ctx context.Context, obj Object) error
	// Get returns a reader of the whole object; the error wraps ErrNotExist
	// if the object is missing.
	Get(ctx context.Context, name string) (io.ReadCloser, error)
	// GetRange returns a reader of length bytes of the object from offset
	// off; the error wraps ErrNotExist if the object is missing. A range
	// past the end of the object yields fewer bytes (callers check).
	GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error)
	// Size returns the object's length in bytes; the error wraps
	// ErrNotExist if the object is missing.
	Size(ctx context.Context, name string) (int64, error)
	// Iter calls fn with the full name of every object whose name starts
	// with prefix, in lexical order, and stops at the first error fn
	// returns, returning it.
	Iter(ctx context.Context, prefix string, fn func(name string) error) error
	// Delete removes the object; deleting a missing object is not an error.
	Delete(ctx context.Context, name string) error
	// Close releases the bucket's resources.
	Close() error
}
