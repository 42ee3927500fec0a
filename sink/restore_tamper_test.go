package sink_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
)

// putJSON stores m as the meta object path as is, without the validation
// EncodeMeta does: a tampered meta.
func putJSON(t testing.TB, b *sink.MemBucket, path string, m sink.Meta) {
	t.Helper()
	ctx := context.Background()
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	b.Delete(ctx, path)
	if err := b.Upload(ctx, sink.Object{Name: path, Body: bytes.NewReader(raw), Size: int64(len(raw)), CRC32C: sink.CRC32C(raw)}); err != nil {
		t.Fatal(err)
	}
}

// tamper rewrites the meta object at path with mod applied.
func tamper(t *testing.T, b *sink.MemBucket, path string, mod func(*sink.Meta)) {
	t.Helper()
	m := metaOf(t, b, path)
	mod(&m)
	putJSON(t, b, path, m)
}

// putChunk stores stored as a data object holding one chunk and returns a
// meta object naming it, with the chunk's fields made consistent with raw
// (its decompressed bytes) and then changed by mod.
func putChunk(t testing.TB, b *sink.MemBucket, stored, raw []byte, rawLen int64, mod func(*sink.FileMeta)) string {
	t.Helper()
	data := "default/f/v1/20220307/07/1-tampered.log"
	if err := b.Upload(context.Background(), sink.Object{Name: data, Body: bytes.NewReader(stored), Size: int64(len(stored)), CRC32C: sink.CRC32C(stored)}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	f := sink.FileMeta{Length: int64(len(stored)), RawLength: rawLen, Compression: sink.CompressionZstd, SHA256: hex.EncodeToString(sum[:]),
		NumberOfEntries: 1, MinTS: 1, MaxTS: 1, TableID: 1, CF: sink.CFWrite, Op: sink.OpPut}
	if mod != nil {
		mod(&f)
	}
	path := sink.MetaPath("", "default", "f", 1, 1, "tampered")
	putJSON(t, b, path, sink.Meta{Version: 1, Flow: "f", FlowID: 1, CycleID: "tampered", DataPath: data, MinTS: 1, MaxTS: 1, Files: []sink.FileMeta{f}})
	return path
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// hugeKeyChunk is a zstd chunk of one entry whose key really is keyLen zero
// bytes: a few hundred KiB stored for gigabytes decompressed.
func hugeKeyChunk(t testing.TB, keyLen int64) (stored []byte, rawLen int64) {
	t.Helper()
	var buf bytes.Buffer
	w, err := sink.NewObjectWriter(&buf, sink.CompressionZstd)
	if err != nil {
		t.Fatal(err)
	}
	var hdr [4]byte
	hdr[0], hdr[1], hdr[2], hdr[3] = byte(keyLen), byte(keyLen>>8), byte(keyLen>>16), byte(keyLen>>24)
	in := io.MultiReader(bytes.NewReader(hdr[:]), io.LimitReader(zeros{}, keyLen), bytes.NewReader(make([]byte, 4)))
	_, _, rawLen, err = w.AddChunk(in)
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), rawLen
}

// bigWindowFrame is a 19-byte zstd frame declaring a 512 MiB window that
// holds one small entry in a raw block.
func bigWindowFrame() (frame, raw []byte) {
	raw = event.AppendEntry(nil, []byte("k"), []byte("v"))
	frame = []byte{0x28, 0xb5, 0x2f, 0xfd, // magic
		0x00,                        // frame header: no content size, no checksum
		19 << 3,                     // window descriptor: 2^(10+19) = 512 MiB
		byte(1 | len(raw)<<3), 0, 0} // last raw block of len(raw) bytes
	return append(frame, raw...), raw
}

// allocated returns the bytes allocated on the heap while fn ran.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestRestoreVerifyTampered feeds Restore (MaxMemory 64 MiB) and Verify
// tampered metas and chunks: both must refuse them with an error or fault
// naming the problem, and allocate less than MaxMemory + 64 MiB in all
// while doing so, whatever sizes the tampered objects claim.
func TestRestoreVerifyTampered(t *testing.T) {
	const maxMemory = 64 << 20
	evs := []kv{wput(1, 1, 10, 9, "a"), dput(1, 2, 5, []byte("default value")), wput(1, 2, 6, 5, "")}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, b *sink.MemBucket) string // returns the meta path
		want  []string                                     // in the restore error and a verify fault
	}{
		{"raw_length 8 GiB", func(t *testing.T, b *sink.MemBucket) string {
			mp := writeBackup(t, b, "c1", "zstd", evs)
			tamper(t, b, mp, func(m *sink.Meta) { m.Files[0].RawLength = 8 << 30 })
			return mp
		}, []string{"meta default/f/v1/backupmeta/", "raw_length 8589934592 is more than"}},
		{"uncompressed raw_length", func(t *testing.T, b *sink.MemBucket) string {
			mp := writeBackup(t, b, "c1", "none", evs)
			tamper(t, b, mp, func(m *sink.Meta) { m.Files[1].RawLength = 8 << 30 })
			return mp
		}, []string{"meta default/f/v1/backupmeta/", "uncompressed chunk with length"}},
		{"1.5 GiB key, raw_length 8 GiB", func(t *testing.T, b *sink.MemBucket) string {
			stored, _ := hugeKeyChunk(t, 1536<<20)
			return putChunk(t, b, stored, nil, 8<<30, nil)
		}, []string{"default/f/v1/20220307/07/1-tampered.log", "entry of at least 1610612736 bytes exceeds"}},
		{"1.5 GiB key, true raw_length", func(t *testing.T, b *sink.MemBucket) string {
			stored, raw := hugeKeyChunk(t, 1536<<20)
			return putChunk(t, b, stored, nil, raw, nil)
		}, []string{"default/f/v1/20220307/07/1-tampered.log", "entry of at least 1610612736 bytes exceeds"}},
		{"key past raw_length", func(t *testing.T, b *sink.MemBucket) string {
			stored, _ := hugeKeyChunk(t, 20<<20)
			return putChunk(t, b, stored, nil, 1<<20, nil)
		}, []string{"chunk 0 (offset 0) of default/f/v1/20220307/07/1-tampered.log", "runs past the chunk's raw_length"}},
		{"512 MiB zstd window", func(t *testing.T, b *sink.MemBucket) string {
			frame, raw := bigWindowFrame()
			return putChunk(t, b, frame, raw, int64(len(raw)), nil)
		}, []string{"chunk 0 (offset 0) of default/f/v1/20220307/07/1-tampered.log", "window over the 8 MiB limit"}},
		{"entry count", func(t *testing.T, b *sink.MemBucket) string {
			mp := writeBackup(t, b, "c1", "zstd", evs)
			tamper(t, b, mp, func(m *sink.Meta) { m.Files[0].NumberOfEntries = 3 })
			return mp
		}, []string{"chunk 0 (offset 0) of default/f/v1/20220307/07/1-c1.log", "holds 2 entries, its meta says 3"}},
		{"data_path of another flow", func(t *testing.T, b *sink.MemBucket) string {
			mp := writeBackup(t, b, "c1", "none", evs)
			m := metaOf(t, b, mp)
			other := strings.Replace(m.DataPath, "/f/", "/g/", 1)
			rc, _ := b.Get(context.Background(), m.DataPath)
			data, _ := io.ReadAll(rc)
			b.Upload(context.Background(), sink.Object{Name: other, Body: bytes.NewReader(data), Size: int64(len(data)), CRC32C: sink.CRC32C(data)})
			tamper(t, b, mp, func(m *sink.Meta) { m.DataPath = other })
			return mp
		}, []string{"meta default/f/v1/backupmeta/", `data_path "default/g/v1/20220307/07/1-c1.log" lies outside the flow's directory default/f/v1/`}},
		{"data_path climbing out", func(t *testing.T, b *sink.MemBucket) string {
			mp := writeBackup(t, b, "c1", "none", evs)
			tamper(t, b, mp, func(m *sink.Meta) { m.DataPath = "default/f/v1/../../g/v1/x.log" })
			return mp
		}, []string{"meta default/f/v1/backupmeta/", "lies outside the flow's directory"}},
		{"meta of another flow id", func(t *testing.T, b *sink.MemBucket) string {
			mp := writeBackup(t, b, "c1", "none", evs)
			tamper(t, b, mp, func(m *sink.Meta) { m.FlowID = 2 })
			return mp
		}, []string{"meta default/f/v1/backupmeta/", `belongs to flow "f" (id 2), not default/f (id 1)`}},
		{"meta of another flow name", func(t *testing.T, b *sink.MemBucket) string {
			mp := writeBackup(t, b, "c1", "none", evs)
			tamper(t, b, mp, func(m *sink.Meta) { m.Flow = "g" })
			return mp
		}, []string{"meta default/f/v1/backupmeta/", `belongs to flow "g" (id 1)`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := sink.NewMemBucket()
			mp := tc.setup(t, b)
			check := func(what, msg string) {
				t.Helper()
				for _, w := range tc.want {
					if !strings.Contains(msg, w) {
						t.Errorf("%s: %q does not mention %q", what, msg, w)
					}
				}
			}

			out := t.TempDir()
			var err error
			n := allocated(func() {
				_, err = sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: []string{mp}, TS: 100,
					OutDir: out, TempDir: t.TempDir(), MaxMemory: maxMemory})
			})
			if err == nil {
				t.Fatal("restore of a tampered backup succeeded")
			}
			t.Logf("restore: %v (%d MiB allocated)", err, n>>20)
			check("restore", err.Error())
			if n > maxMemory+64<<20 {
				t.Errorf("restore allocated %d MiB, over MaxMemory + 64 MiB", n>>20)
			}
			if files, _ := os.ReadDir(out); len(files) != 0 {
				t.Errorf("restore wrote %v", files)
			}

			var r sink.VerifyReport
			n = allocated(func() {
				r, err = sink.Verify(ctx, sink.VerifyOptions{Bucket: b, Flow: testFlow, MetaPaths: []string{mp}})
			})
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			if len(r.Faults) != 1 {
				t.Fatalf("verify faults %q, want one", r.Faults)
			}
			t.Logf("verify: %s (%d MiB allocated)", r.Faults[0], n>>20)
			check("verify", r.Faults[0])
			if n > maxMemory+64<<20 {
				t.Errorf("verify allocated %d MiB, over 128 MiB", n>>20)
			}
		})
	}
}

// TestRestoreLargeEntries restores entries of up to the limit from several
// chunks at once, which the readers may only hold one at a time beyond
// their ordinary batches, and checks an entry over the limit fails.
func TestRestoreLargeEntries(t *testing.T) {
	b := sink.NewMemBucket()
	var evs []kv
	for i := range 6 {
		v := bytes.Repeat([]byte{byte('a' + i)}, 3<<20+i)
		evs = append(evs, dput(int64(1+i%3), int64(i), 10, v), wput(int64(1+i%3), int64(i), 11, 10, ""))
	}
	metas := []string{writeBackup(t, b, "c1", "zstd", evs[:6]), writeBackup(t, b, "c2", "none", evs[6:])}
	out := t.TempDir()
	// MaxMemory 16 MiB: the entry limit is its floor of 32 MiB.
	st, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: 100,
		OutDir: out, TempDir: t.TempDir(), MaxMemory: 16 << 20, Parallel: 4})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readTables(t, out), expectRestore(evs, 100); st.Keys != 6 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stats %+v; the restored tables differ from the naive MVCC read", st)
	}

	big := []kv{dput(1, 1, 10, make([]byte, 33<<20)), wput(1, 1, 11, 10, "")}
	b2 := sink.NewMemBucket()
	mp := writeBackup(t, b2, "c1", "zstd", big)
	_, err = sink.Restore(context.Background(), sink.RestoreOptions{Bucket: b2, Flow: testFlow, MetaPaths: []string{mp}, TS: 100,
		OutDir: t.TempDir(), TempDir: t.TempDir(), MaxMemory: 16 << 20})
	var tl *sink.EntryTooLargeError
	if !errors.As(err, &tl) || tl.Limit != 32<<20 || tl.Chunk != 0 {
		t.Fatalf("restore of a 33 MiB entry with MaxMemory 16 MiB = %v, want EntryTooLargeError at the 32 MiB limit", err)
	}
	// The limit grows with MaxMemory.
	if _, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: b2, Flow: testFlow, MetaPaths: []string{mp}, TS: 100,
		OutDir: t.TempDir(), TempDir: t.TempDir(), MaxMemory: 256 << 20}); err != nil {
		t.Fatalf("restore of a 33 MiB entry with MaxMemory 256 MiB: %v", err)
	}
}
