package pipeline_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/pipeline"
)

// startIn builds a Consumer on tempDir, which runs the start-up cleanup of
// --temp-dir.
func startIn(tempDir string) error {
	_, err := pipeline.New(idleConfig(tempDir), pipeline.Deps{})
	return err
}

// idleConfig is a valid Config on tempDir for consumers that are built but
// not run.
func idleConfig(tempDir string) pipeline.Config {
	return pipeline.Config{
		TempDir: tempDir, FlushSize: 1 << 20, FlushInterval: time.Minute, MaxTempBytes: 1 << 30,
		MaxValueSize: 1 << 20, RegionTTL: time.Minute, StartOffset: "earliest", StoreID: "test",
		Compression: "zstd", UploadParallel: 1, FatalAfter: 1,
		RetryBackoff: time.Millisecond, MaxRetryDelay: time.Second, ShutdownTimeout: time.Second,
	}
}

func writeFile(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestTempDirCleanupRemovesOnlyGeneratedNames: in flowlog's own temp dir,
// the leftovers of an earlier process are removed and nothing else.
func TestTempDirCleanupRemovesOnlyGeneratedNames(t *testing.T) {
	dir := t.TempDir()
	if err := startIn(dir); err != nil { // adopts the empty directory
		t.Fatalf("start on an empty --temp-dir: %v", err)
	}
	cases := []struct {
		path    string
		removed bool
	}{
		{"default/demo/g1-p0-t1-r2-write-put.tmp", true},
		{"default/demo/g12-p7-t3-r99-default-delete-meta.tmp", true},
		{"default/demo/f7-g3-p0-t1-r2-write-delete.tmp", true},
		{"default/demo/1700000000000-host-a-3.spool", true},
		{"default/demo/f7-1700000000000-test-12.spool", true},
		{"cat_2/flow-x/g0-p1-t2-r3-default-put.tmp", true},
		{"default/demo/notes.tmp", false},
		{"default/demo/data.spool", false},
		{"default/demo/g1-p0-t1-r2-write-put.tmp.bak", false},
		{"default/demo/g1-p0-t1-r2-lock-put.tmp", false},
		{"default/demo/fx-g1-p0-t1-r2-write-put.tmp", false},
		{"default/demo/sub/g1-p0-t1-r2-write-put.tmp", false}, // one level too deep
		{"default/g1-p0-t1-r2-write-put.tmp", false},          // one level too shallow
		{"g1-p0-t1-r2-write-put.tmp", false},
		{"bad.name/demo/g1-p0-t1-r2-write-put.tmp", false}, // not a valid catalog name
		{"g1.seg", true},
		{"g123456.seg", true},
		{"g1.seg.bak", false},
		{"gx.seg", false},
		{"default/demo/g1.seg", false}, // segments live at the top
		{"spare3.seg", true},
		{"spare.seg", false},
		{"spare3.pack", false},
	}
	for _, tc := range cases {
		writeFile(t, filepath.Join(dir, tc.path))
	}
	if err := startIn(dir); err != nil {
		t.Fatalf("start on flowlog's --temp-dir with foreign files: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			if got := !pipeline.FileExists(t, filepath.Join(dir, tc.path)); got != tc.removed {
				t.Errorf("removed = %v, want %v", got, tc.removed)
			}
		})
	}
}

// TestTempDirCleanupNeverFollowsSymlinks: symlinked catalog or flow
// directories and symlinked files are left alone, and so is everything they
// point at.
func TestTempDirCleanupNeverFollowsSymlinks(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "temp")
	if err := startIn(dir); err != nil {
		t.Fatalf("start on a new --temp-dir: %v", err)
	}
	outside := filepath.Join(base, "precious")
	victims := []string{
		filepath.Join(outside, "g1-p0-t1-r2-write-put.tmp"),
		filepath.Join(outside, "1700000000000-host-1.spool"),
		filepath.Join(outside, "demo", "g1-p0-t1-r2-write-put.tmp"),
		filepath.Join(outside, "demo", "other.tmp"),
	}
	for _, v := range victims {
		writeFile(t, v)
	}
	links := []string{
		filepath.Join(dir, "default", "demo"),                              // flow dir -> outside
		filepath.Join(dir, "linked"),                                       // catalog dir -> outside
		filepath.Join(dir, "default", "real", "g5-p0-t1-r2-write-put.tmp"), // file -> outside file
	}
	symlink(t, outside, links[0])
	symlink(t, outside, links[1])
	symlink(t, victims[0], links[2])
	own := filepath.Join(dir, "default", "real", "g6-p0-t1-r2-write-put.tmp")
	writeFile(t, own)

	if err := startIn(dir); err != nil {
		t.Fatalf("start: %v", err)
	}
	for _, v := range victims {
		if !pipeline.FileExists(t, v) {
			t.Errorf("%s outside --temp-dir was removed through a symlink", v)
		}
	}
	for _, l := range links {
		if !pipeline.FileExists(t, l) {
			t.Errorf("symlink %s was removed", l)
		}
	}
	if pipeline.FileExists(t, own) {
		t.Errorf("leftover %s was not removed", own)
	}
}

// TestTempDirRefusesForeignDirectory: a mistaken --temp-dir such as a home
// directory is refused with one line naming --temp-dir, and nothing in it is
// touched.
func TestTempDirRefusesForeignDirectory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		link  string // a symlink at the top, if set
	}{
		{"home", []string{".bashrc", "projects/app/build.tmp", "projects/app/g1-p0-t1-r2-write-put.tmp"}, ""},
		{"only generated names, one foreign file", []string{"default/demo/g1-p0-t1-r2-write-put.tmp", "default/demo/README"}, ""},
		{"symlinked catalog", []string{"x/g1-p0-t1-r2-write-put.tmp"}, "default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "home")
			for _, f := range tc.files {
				writeFile(t, filepath.Join(dir, f))
			}
			if tc.link != "" {
				target := filepath.Join(base, "elsewhere")
				writeFile(t, filepath.Join(target, "demo", "g1-p0-t1-r2-write-put.tmp"))
				symlink(t, target, filepath.Join(dir, tc.link))
			}
			err := startIn(dir)
			if err == nil {
				t.Fatal("start on a foreign non-empty --temp-dir succeeded")
			}
			msg := err.Error()
			if !strings.Contains(msg, "--temp-dir "+dir) || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line naming --temp-dir %s", msg, dir)
			}
			for _, f := range tc.files {
				if !pipeline.FileExists(t, filepath.Join(dir, f)) {
					t.Errorf("%s was removed from a refused --temp-dir", f)
				}
			}
			if tc.link != "" && !pipeline.FileExists(t, filepath.Join(base, "elsewhere", "demo", "g1-p0-t1-r2-write-put.tmp")) {
				t.Error("a file behind a symlink was removed")
			}
			if pipeline.FileExists(t, filepath.Join(dir, ".flowlog-temp")) {
				t.Error("a refused --temp-dir was marked as flowlog's")
			}
		})
	}
}

// TestTempDirAdoptsUnmarkedFlowlogLayout: a directory an older flowlog
// left, without the marker but holding only its layout, is adopted and
// cleaned.
func TestTempDirAdoptsUnmarkedFlowlogLayout(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "default", "demo", "g1-p0-t1-r2-write-put.tmp")
	writeFile(t, f)
	if err := os.MkdirAll(filepath.Join(dir, "default", "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := startIn(dir); err != nil {
		t.Fatalf("start: %v", err)
	}
	if pipeline.FileExists(t, f) {
		t.Error("leftover temp file not removed")
	}
	if !pipeline.FileExists(t, filepath.Join(dir, ".flowlog-temp")) {
		t.Error("no marker written")
	}
}
