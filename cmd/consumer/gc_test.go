package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestGCCommand: gc says what it will delete, keeps what is young, listed
// or a checkpoint, deletes the rest, and writes its metrics.
func TestGCCommand(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	e := newRetentionEnv(t, rd, g, "gc1", 3, 6, 5)
	// A crashed cycle: uploaded, never committed.
	m, metaPath := sinktest.WriteCycle(t, e.bucket, sinktest.Cycle{Prefix: e.prefix, Catalog: "default", Flow: "f", FlowID: 1, CycleID: "crashed",
		ResolvedTS: e.ckpt, Entries: []sinktest.Entry{sinktest.WritePut(1, 1, e.ckpt-2, e.ckpt-1, []byte("x"), true)}})
	listed := len(e.objectNames(t))
	base := e.baseline(t, e.restoreTSs(e.ms(100, 0))...)

	out, err := e.run(t, "gc")
	if err != nil || !strings.Contains(out, "will delete 0 unreferenced objects") || !strings.Contains(out, "keeping 2 unreferenced objects") {
		t.Fatalf("gc with the default grace: %v, stdout:\n%s", err, out)
	}
	out, err = e.run(t, "gc", "--grace", "0s", "--dry-run")
	if err != nil || !strings.Contains(out, "would delete 2 unreferenced objects") || !strings.Contains(out, "would delete "+m.DataPath) ||
		len(e.objectNames(t)) != listed {
		t.Fatalf("gc --dry-run: %v, stdout:\n%s", err, out)
	}
	prom := filepath.Join(t.TempDir(), "gc.prom")
	r := runConsumer(t, 30*time.Second, nil, e.cmd("gc", "--grace", "0s", "--metrics-file", prom)...)
	if r.code != 0 || !strings.Contains(r.stdout, "gc deleted 2 objects") {
		t.Fatalf("gc: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	names := e.objectNames(t)
	for _, n := range names {
		if n == metaPath || n == m.DataPath {
			t.Errorf("gc left %s", n)
		}
	}
	if len(names) != listed-2 {
		t.Errorf("%d objects left of %d, want all but the crashed cycle's 2", len(names), listed)
	}
	e.checkRestores(t, base)
	raw, err := os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`flowlog_op_objects\{command="gc",flow="default/f"\} 2`,
		`flowlog_op_bytes\{command="gc",flow="default/f"\} [1-9]`,
		`flowlog_op_duration_seconds\{command="gc"\} `,
		`flowlog_storage_log_bytes\{flow="default/f"\} [1-9]`,
		`flowlog_storage_snapshot_bytes\{flow="default/f"\} 0`,
	} {
		if !regexp.MustCompile(re).Match(raw) {
			t.Errorf("metrics file lacks %s:\n%s", re, raw)
		}
	}
}
