package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestSnapshotCommand takes a snapshot with `consumer snapshot`, checks that
// it is listed and its objects exist, that a restore at the checkpoint
// after more commits starts from it and equals the restore of the same
// flow without it, that verify checks it, and that a restore below a
// recorded truncation point is refused naming the oldest restorable ts.
func TestSnapshotCommand(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	snapTS := e.ts(50 * time.Minute)
	metricsFile := filepath.Join(t.TempDir(), "snapshot.prom")
	stdout, err := capture(t, func() error {
		return runSnapshot(ctx, e.args("--flow", "f", "--temp-dir", t.TempDir(), "--metrics-file", metricsFile))
	})
	if err != nil {
		t.Fatalf("snapshot: %v\n%s", err, stdout)
	}
	wantPath := fmt.Sprintf("pre/default/f/v1/snapshot/%020d-1/snapshot.meta", snapTS)
	if !strings.Contains(stdout, "listed snapshot "+wantPath) || !strings.Contains(stdout, "2 tables, 2 keys, 3 objects") {
		t.Fatalf("snapshot output:\n%s", stdout)
	}
	refs, err := e.store.Snapshots(ctx, 1)
	if err != nil || len(refs) != 1 || refs[0].TS != snapTS || refs[0].Path != wantPath {
		t.Fatalf("snapshots listed = %+v, %v; want one at %d", refs, err, snapTS)
	}
	for _, name := range []string{wantPath, strings.TrimSuffix(wantPath, "snapshot.meta") + "1.snap", strings.TrimSuffix(wantPath, "snapshot.meta") + "2.snap"} {
		if _, err := e.bucket.Size(ctx, name); err != nil {
			t.Errorf("snapshot object %s: %v", name, err)
		}
	}
	prom, err := os.ReadFile(metricsFile)
	if err != nil || !strings.Contains(string(prom), `flowlog_op_objects{command="snapshot",flow="default/f"} 3`) ||
		!strings.Contains(string(prom), `flowlog_op_last_success_timestamp_seconds{command="snapshot"}`) ||
		!regexp.MustCompile(`flowlog_op_log_read_bytes\{command="snapshot",flow="default/f"\} [1-9]`).Match(prom) {
		t.Errorf("metrics file: %v\n%s", err, prom)
	}
	// Again at the same ts: nothing to do.
	stdout, err = capture(t, func() error { return runSnapshot(ctx, e.args("--flow", "f", "--temp-dir", t.TempDir())) })
	if err != nil || !strings.Contains(stdout, "has a snapshot as of") {
		t.Fatalf("second snapshot at the same ts: %v\n%s", err, stdout)
	}

	e.commit(t, 58*time.Minute, sinktest.WritePut(1, 2, e.ts(54*time.Minute), e.ts(55*time.Minute), []byte("after"), true))
	withSnap := filepath.Join(t.TempDir(), "with")
	stdout, err = capture(t, func() error {
		return runRestore(ctx, e.args("--flow", "f", "--out", withSnap, "--temp-dir", t.TempDir()))
	})
	if err != nil {
		t.Fatalf("restore: %v\n%s", err, stdout)
	}
	if !strings.Contains(stdout, fmt.Sprintf("2 tables started from the snapshot at %d", snapTS)) {
		t.Fatalf("restore did not use the snapshot:\n%s", stdout)
	}
	got := readJSONL(t, filepath.Join(withSnap, "1.jsonl"))
	want := []string{rowHex(1, 1) + "=late@" + fmt.Sprint(e.ts(48*time.Minute)), rowHex(1, 2) + "=after@" + fmt.Sprint(e.ts(55*time.Minute))}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table 1 = %v, want %v", got, want)
	}

	logOnly := filepath.Join(t.TempDir(), "log")
	stdout, err = capture(t, func() error {
		return runRestore(ctx, e.args("--flow", "f", "--out", logOnly, "--snapshots=false", "--temp-dir", t.TempDir()))
	})
	if err != nil || strings.Contains(stdout, "started from the snapshot") {
		t.Fatalf("restore --snapshots=false: %v\n%s", err, stdout)
	}
	for _, f := range []string{"1.jsonl", "2.jsonl"} {
		a, _ := os.ReadFile(filepath.Join(withSnap, f))
		b, _ := os.ReadFile(filepath.Join(logOnly, f))
		if string(a) != string(b) || len(a) == 0 {
			t.Fatalf("%s: %q with the snapshot, %q from the log alone", f, a, b)
		}
	}

	stdout, err = capture(t, func() error { return runVerify(ctx, e.args("--flow", "f")) })
	if err != nil || !strings.Contains(stdout, "snapshots 1 (2 tables, 2 chunks") || !strings.Contains(stdout, "truncation point: none") {
		t.Fatalf("verify: %v\n%s", err, stdout)
	}

	// A truncation point as truncate records it: restores below it are
	// refused, naming the oldest restorable ts.
	if err := e.redis.Client(t).Set(ctx, meta.NewKeys("flowlog").TruncatedBefore(1), fmt.Sprint(snapTS), 0).Err(); err != nil {
		t.Fatal(err)
	}
	stdout, err = capture(t, func() error {
		return runRestore(ctx, e.args("--flow", "f", "--ts", fmt.Sprint(e.ts(20*time.Minute)), "--out", t.TempDir(), "--force", "--temp-dir", t.TempDir()))
	})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the oldest restorable ts is %d", snapTS)) {
		t.Fatalf("restore below the truncation point = %v\n%s", err, stdout)
	}
	stdout, err = capture(t, func() error { return runVerify(ctx, e.args("--flow", "f")) })
	if err != nil || !strings.Contains(stdout, fmt.Sprintf("truncation point: %d", snapTS)) {
		t.Fatalf("verify: %v\n%s", err, stdout)
	}
}
