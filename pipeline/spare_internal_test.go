package pipeline

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// inode is the inode number of the file at path.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// writeSegment writes each of parts to a new segment at path and seals it.
func writeSegment(t *testing.T, path string, spares *spareFiles, parts ...[]byte) *segment {
	t.Helper()
	s := newSegment(path, spares)
	s.acquire()
	var off int64
	for _, p := range parts {
		got, err := s.write(p)
		if err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
		if got != off {
			t.Fatalf("write %s at %d, want %d", path, got, off)
		}
		off += int64(len(p))
	}
	if err := s.seal(); err != nil {
		t.Fatalf("seal %s: %v", path, err)
	}
	if err := s.check(); err != nil {
		t.Fatalf("check %s: %v", path, err)
	}
	return s
}

// FileExists reports whether a file is at path (the external tests use it
// too).
func FileExists(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Lstat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// A released segment's file is written over by the next segment (the same
// inode: its cached pages are reused, not allocated again) and holds
// exactly what that segment wrote, however much longer the old file was.
func TestSegmentWritesOverASpare(t *testing.T) {
	dir := t.TempDir()
	spares := newSpareFiles(dir, 1<<20)
	long := bytes.Repeat([]byte("old-bytes."), 30_000) // 300,000 bytes: past segWriteBuf
	first := writeSegment(t, filepath.Join(dir, "g1.seg"), spares, long[:100_000], long[100_000:])
	ino := inode(t, first.path)
	first.release()
	if FileExists(t, first.path) {
		t.Fatal("g1.seg still there after its last chunk was released")
	}
	if !FileExists(t, filepath.Join(dir, "spare1.seg")) {
		t.Fatal("the released segment was not kept as spare1.seg")
	}

	short := []byte("the second segment's bytes")
	second := writeSegment(t, filepath.Join(dir, "g2.seg"), spares, short, short)
	if got := inode(t, second.path); got != ino {
		t.Errorf("g2.seg is inode %d, want the spare's %d", got, ino)
	}
	if FileExists(t, filepath.Join(dir, "spare1.seg")) {
		t.Error("spare1.seg still there after g2.seg took it")
	}
	got, err := os.ReadFile(second.path)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(append([]byte{}, short...), short...); !bytes.Equal(got, want) {
		t.Errorf("g2.seg holds %d bytes %.40q, want %d bytes %.40q", len(got), got, len(want), want)
	}

	// No spare left: the next segment makes a file of its own.
	third := writeSegment(t, filepath.Join(dir, "g3.seg"), spares, short)
	if inode(t, third.path) == ino {
		t.Error("g3.seg reused the inode g2.seg still holds")
	}
}

// Spares are bounded: at most maxSpares files, together at most the
// budget (the oldest are removed to make room, and a file larger than the
// whole budget is removed as before); a spare is never renamed over a file
// already at the new segment's path; and after the temp dir is cleaned the
// forgotten spares are gone and new segments create their files.
func TestSparesStayWithinTheirBudget(t *testing.T) {
	dir := t.TempDir()
	spares := newSpareFiles(dir, 1000)
	// All written before any is released, so that none takes a spare.
	segs := map[string]*segment{}
	for name, n := range map[string]int{"g1.seg": 400, "g2.seg": 400, "g3.seg": 300, "g4.seg": 500, "g5.seg": 1001} {
		segs[name] = writeSegment(t, filepath.Join(dir, name), spares, bytes.Repeat([]byte{'x'}, n))
	}
	release := func(name string) {
		t.Helper()
		segs[name].release()
		if FileExists(t, segs[name].path) {
			t.Fatalf("%s still there after its release", name)
		}
	}
	release("g1.seg") // spare1
	release("g2.seg") // spare2
	release("g3.seg") // spare3: maxSpares evicts spare1
	if FileExists(t, filepath.Join(dir, "spare1.seg")) {
		t.Error("spare1.seg kept beyond maxSpares")
	}
	release("g4.seg") // spare4: the budget evicts spare2
	for name, want := range map[string]bool{"spare2.seg": false, "spare3.seg": true, "spare4.seg": true} {
		if got := FileExists(t, filepath.Join(dir, name)); got != want {
			t.Errorf("%s exists = %v, want %v", name, got, want)
		}
	}
	if spares.bytes != 800 || len(spares.free) != 2 {
		t.Errorf("spares hold %d bytes in %d files, want 800 in 2", spares.bytes, len(spares.free))
	}
	release("g5.seg") // larger than the budget: removed
	if FileExists(t, filepath.Join(dir, "spare5.seg")) || spares.bytes != 800 {
		t.Errorf("a file over the whole budget was kept (%d bytes of spares)", spares.bytes)
	}

	// A file at the path: the spare stays a spare, and the segment's own
	// create refuses to write over the file.
	taken := filepath.Join(dir, "g6.seg")
	if err := os.WriteFile(taken, []byte("someone's"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newSegment(taken, spares)
	if _, err := s.write([]byte("new")); err == nil {
		t.Error("a segment wrote over a file already at its path")
	}
	if got, _ := os.ReadFile(taken); string(got) != "someone's" {
		t.Errorf("the file at the segment's path holds %q", got)
	}
	if len(spares.free) != 2 {
		t.Errorf("%d spares after a refused take, want 2", len(spares.free))
	}

	if err := cleanTempDir(dir); err != nil {
		t.Fatal(err)
	}
	spares.reset()
	for _, name := range []string{"spare3.seg", "spare4.seg"} {
		if FileExists(t, filepath.Join(dir, name)) {
			t.Errorf("%s left after the temp dir was cleaned", name)
		}
	}
	fresh := writeSegment(t, filepath.Join(dir, "g7.seg"), spares, []byte("after the clean"))
	if got, _ := os.ReadFile(fresh.path); string(got) != "after the clean" {
		t.Errorf("g7.seg holds %q", got)
	}
}
