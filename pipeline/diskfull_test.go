package pipeline_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// smallDisk mounts a tmpfs of size bytes and returns its path.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("mount a tmpfs (CI runs as root): %v: %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs here (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes a file at path until the disk is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", path, err)
			}
			return
		}
	}
}

// A temp-file write that fails (disk full) drops what was not committed,
// pauses, and consumes it again once space returns: nothing is lost, the
// consumer never exits, and /readyz says what is wrong meanwhile. A full
// disk is the operator's to fix; it must cost neither data nor a restart.
func TestDiskFullRecoversByItself(t *testing.T) {
	disk := smallDisk(t, "2m")
	r := newRig(t, 1, sink.NewMemBucket(), func(c *pipeline.Config) {
		c.TempDir = filepath.Join(disk, "temp")
		c.FlushSize, c.MaxTempBytes, c.FlushInterval = 64<<10, 256<<10, 500*time.Millisecond
	})
	r.tempDir = filepath.Join(disk, "temp")
	r.start()
	id := r.createFlow("full", 1)
	r.produceBatch(putBatch(1, 1, 0, 50, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 50 }, "first events written")
	r.flush()

	ballast := filepath.Join(disk, "ballast")
	fill(t, ballast)
	for i := range 20 {
		r.produceBatch(putBatch(1, 1, int64(1000+i*50), 50, int64(1000+i*50)))
	}
	r.eventually(30*time.Second, func() bool { return r.cons.Stalled() != nil }, "/readyz reports the failed temp write")
	if v := testutil.ToFloat64(r.cons.MetricTempWriteErrors()); v < 1 {
		t.Fatalf("temp_write_errors_total = %v, want >= 1", v)
	}
	select {
	case err := <-r.done:
		t.Fatalf("consumer exited on a full disk: %v", err)
	default:
	}

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, got := r.entries(id)
		if len(got) == 50+20*50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries backed up after space returned, want %d; status %+v", len(got), 50+20*50, r.cons.Status())
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.eventually(30*time.Second, func() bool { return r.cons.Stalled() == nil }, "/readyz ready again")
	_, got := r.entries(id)
	for kv, n := range got {
		if n != 1 {
			t.Fatalf("entry %q backed up %d times", kv, n)
		}
	}
}
