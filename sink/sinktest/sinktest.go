// Package sinktest holds the acceptance suite every sink.Bucket backend must
// pass.
package sinktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/flowlog/flowlog/sink"
)

// Options adjusts AcceptanceTest to known limits of a backend.
type Options struct {
	// SkipBadCRC skips the check that an upload with a wrong CRC32C is
	// rejected, for emulators that do not validate checksums.
	SkipBadCRC bool
}

func obj(name string, body []byte) sink.Object {
	return sink.Object{Name: name, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}
}

func readAll(t *testing.T, rc io.ReadCloser, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return b
}

// AcceptanceTest runs the Bucket contract against buckets made by newBucket;
// each subtest gets a fresh, empty bucket from it.
func AcceptanceTest(t *testing.T, newBucket func(t *testing.T) sink.Bucket, opt Options) {
	ctx := context.Background()
	body := []byte("0123456789abcdefghijklmnopqrstuvwxyz")

	t.Run("upload get size", func(t *testing.T) {
		b := newBucket(t)
		if err := b.Upload(ctx, obj("a/one", body)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		rc, err := b.Get(ctx, "a/one")
		if got := readAll(t, rc, err); !bytes.Equal(got, body) {
			t.Fatalf("get = %q, want %q", got, body)
		}
		n, err := b.Size(ctx, "a/one")
		if err != nil || n != int64(len(body)) {
			t.Fatalf("size = %d, %v; want %d", n, err, len(body))
		}
	})

	t.Run("empty object", func(t *testing.T) {
		b := newBucket(t)
		if err := b.Upload(ctx, obj("empty", nil)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		n, err := b.Size(ctx, "empty")
		if err != nil || n != 0 {
			t.Fatalf("size = %d, %v; want 0", n, err)
		}
	})

	t.Run("range", func(t *testing.T) {
		b := newBucket(t)
		if err := b.Upload(ctx, obj("r", body)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		for _, tc := range []struct {
			off, n int64
			want   string
		}{
			{0, 1, "0"},
			{10, 6, "abcdef"},
			{30, 6, "uvwxyz"},
			{30, 100, "uvwxyz"},
			{0, int64(len(body)), string(body)},
			{5, 0, ""},
		} {
			t.Run(fmt.Sprintf("%d+%d", tc.off, tc.n), func(t *testing.T) {
				rc, err := b.GetRange(ctx, "r", tc.off, tc.n)
				if got := readAll(t, rc, err); string(got) != tc.want {
					t.Fatalf("range = %q, want %q", got, tc.want)
				}
			})
		}
	})

	t.Run("exists", func(t *testing.T) {
		b := newBucket(t)
		if err := b.Upload(ctx, obj("x", body)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		err := b.Upload(ctx, obj("x", []byte("other")))
		if !errors.Is(err, sink.ErrExists) {
			t.Fatalf("second upload: %v, want ErrExists", err)
		}
		rc, err := b.Get(ctx, "x")
		if got := readAll(t, rc, err); !bytes.Equal(got, body) {
			t.Fatalf("object changed by rejected upload: %q", got)
		}
	})

	t.Run("not exist", func(t *testing.T) {
		b := newBucket(t)
		if _, err := b.Get(ctx, "missing"); !errors.Is(err, sink.ErrNotExist) {
			t.Errorf("get: %v, want ErrNotExist", err)
		}
		if _, err := b.GetRange(ctx, "missing", 0, 3); !errors.Is(err, sink.ErrNotExist) {
			t.Errorf("get range: %v, want ErrNotExist", err)
		}
		if _, err := b.Size(ctx, "missing"); !errors.Is(err, sink.ErrNotExist) {
			t.Errorf("size: %v, want ErrNotExist", err)
		}
	})

	t.Run("iter order", func(t *testing.T) {
		b := newBucket(t)
		names := []string{"p/b/2", "p/a", "p/b/10", "q/z", "p/c", "pp"}
		for _, n := range names {
			if err := b.Upload(ctx, obj(n, []byte(n))); err != nil {
				t.Fatalf("upload %s: %v", n, err)
			}
		}
		for _, tc := range []struct {
			prefix string
			want   []string
		}{
			{"p/", []string{"p/a", "p/b/10", "p/b/2", "p/c"}},
			{"p", []string{"p/a", "p/b/10", "p/b/2", "p/c", "pp"}},
			{"", []string{"p/a", "p/b/10", "p/b/2", "p/c", "pp", "q/z"}},
			{"none/", nil},
		} {
			t.Run(tc.prefix, func(t *testing.T) {
				var got []string
				if err := b.Iter(ctx, tc.prefix, func(n string) error { got = append(got, n); return nil }); err != nil {
					t.Fatalf("iter: %v", err)
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("iter %q = %v, want %v", tc.prefix, got, tc.want)
				}
			})
		}
		stop := errors.New("stop")
		calls := 0
		err := b.Iter(ctx, "p/", func(string) error { calls++; return stop })
		if !errors.Is(err, stop) || calls != 1 {
			t.Fatalf("iter stopping: %v after %d calls, want stop after 1", err, calls)
		}
	})

	t.Run("list attributes", func(t *testing.T) {
		b := newBucket(t)
		l, ok := b.(sink.Lister)
		if !ok {
			t.Skip("bucket does not implement sink.Lister")
		}
		before := time.Now().Add(-time.Minute) // emulator clocks may be a little off
		for _, n := range []string{"l/b", "l/a", "m"} {
			if err := b.Upload(ctx, obj(n, []byte(n+"-body"))); err != nil {
				t.Fatalf("upload %s: %v", n, err)
			}
		}
		var got []sink.ObjectInfo
		if err := l.List(ctx, "l/", func(o sink.ObjectInfo) error { got = append(got, o); return nil }); err != nil {
			t.Fatalf("list: %v", err)
		}
		if len(got) != 2 || got[0].Name != "l/a" || got[1].Name != "l/b" {
			t.Fatalf("list l/ = %+v, want l/a, l/b", got)
		}
		for _, o := range got {
			if o.Size != int64(len(o.Name+"-body")) || o.Created.Before(before) || o.Created.After(time.Now().Add(time.Minute)) {
				t.Errorf("list: %+v: wrong size or creation time", o)
			}
		}
	})

	t.Run("delete idempotent", func(t *testing.T) {
		b := newBucket(t)
		if err := b.Upload(ctx, obj("d", body)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		for i := range 2 {
			if err := b.Delete(ctx, "d"); err != nil {
				t.Fatalf("delete #%d: %v", i+1, err)
			}
		}
		if _, err := b.Size(ctx, "d"); !errors.Is(err, sink.ErrNotExist) {
			t.Fatalf("size after delete: %v, want ErrNotExist", err)
		}
		if err := b.Delete(ctx, "never"); err != nil {
			t.Fatalf("delete missing: %v", err)
		}
	})

	t.Run("bad crc rejected", func(t *testing.T) {
		if opt.SkipBadCRC {
			t.Skip("backend does not validate CRC32C")
		}
		b := newBucket(t)
		o := obj("bad", body)
		o.CRC32C ^= 1
		if err := b.Upload(ctx, o); err == nil {
			t.Fatal("upload with wrong crc32c succeeded")
		}
		if _, err := b.Size(ctx, "bad"); !errors.Is(err, sink.ErrNotExist) {
			t.Fatalf("object after rejected upload: %v, want ErrNotExist", err)
		}
		if err := b.Upload(ctx, obj("bad", body)); err != nil {
			t.Fatalf("upload with right crc32c after a rejected one: %v", err)
		}
	})

	t.Run("large", func(t *testing.T) {
		b := newBucket(t)
		big := bytes.Repeat([]byte("flowlog-"), 3<<20/8+123)
		if err := b.Upload(ctx, obj("big", big)); err != nil {
			t.Fatalf("upload: %v", err)
		}
		rc, err := b.GetRange(ctx, "big", 1<<20+5, 1000)
		if got := readAll(t, rc, err); !bytes.Equal(got, big[1<<20+5:1<<20+1005]) {
			t.Fatalf("range of large object differs")
		}
	})
}
