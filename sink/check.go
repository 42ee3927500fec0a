package sink

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ErrBucketNotExist is wrapped by a Bucket's errors when the bucket itself
// does not exist (a typo in --gcs-bucket), as opposed to one object.
var ErrBucketNotExist = errors.New("bucket does not exist")

// errStopIter ends an Iter after its first name.
var errStopIter = errors.New("stop")

// ProbePath is the name of the object CheckAccess writes to prove it may:
// <prefix>/.probe/<random>. ".probe" can never be a catalog name (a '.' is
// not in [A-Za-z0-9_-]), so no reader of the layout takes it for a flow's
// object: restore and verify never list it, and gc counts it among the
// objects it never deletes (docs/FORMAT.md, "Bucket layout").
func ProbePath(prefix, random string) string {
	p := ".probe/" + random
	if prefix != "" {
		p = strings.TrimSuffix(prefix, "/") + "/" + p
	}
	return p
}

// ProbeWriteError is CheckAccess's error when the bucket could be listed
// but the probe object could not be created or deleted.
type ProbeWriteError struct{ Err error }

func (e *ProbeWriteError) Error() string { return e.Err.Error() }
func (e *ProbeWriteError) Unwrap() error { return e.Err }

// CheckAccess checks, at the start of a command, that the bucket exists and
// can be listed under prefix (what every reader does first), and with write
// also that an object can be created and deleted there (what the consumer
// does every cycle): it uploads an empty object at ProbePath and deletes
// it. The bucket's attributes would need storage.buckets.get, which a
// consumer's role (objects only) does not grant, and would not prove that
// objects can be written. A missing bucket wraps ErrBucketNotExist; a
// failed create or delete of the probe is a *ProbeWriteError, so that a
// caller can tell a bucket that refuses writes from one whose writes
// failed this once.
func CheckAccess(ctx context.Context, b Bucket, prefix string, write bool) error {
	err := b.Iter(ctx, ProbePath(prefix, ""), func(string) error { return errStopIter })
	if err != nil && !errors.Is(err, errStopIter) {
		return fmt.Errorf("list objects: %w", err)
	}
	if !write {
		return nil
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	name := ProbePath(prefix, hex.EncodeToString(r[:]))
	if err := b.Upload(ctx, Object{Name: name, Body: bytes.NewReader(nil), Size: 0, CRC32C: CRC32C(nil)}); err != nil {
		return &ProbeWriteError{fmt.Errorf("create an object: %w", err)}
	}
	if err := b.Delete(ctx, name); err != nil {
		return &ProbeWriteError{fmt.Errorf("delete the object it created (%s): %w", name, err)}
	}
	return nil
}
