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

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestSnapshotCommand: `consumer snapshot` says what it snapshots and
// lists, writes its metrics, and says so when a snapshot at the ts is
// listed already; restore says it started from it; verify shows it and the
// truncation point; a restore below that point is refused in words.
func TestSnapshotCommand(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	snapTS := e.TS(50 * time.Minute)
	metricsFile := filepath.Join(t.TempDir(), "snapshot.prom")
	stdout, err := runIn(t, e.Conn, "snapshot", "--flow", "f", "--temp-dir", t.TempDir(), "--metrics-file", metricsFile)
	if err != nil {
		t.Fatalf("snapshot: %v\n%s", err, stdout)
	}
	wantPath := fmt.Sprintf("pre/default/f/v1/snapshot/%020d-1/snapshot.meta", snapTS)
	for _, want := range []string{
		fmt.Sprintf("snapshot of flow default/f (id 1) as of %d (%s): 2 tables, from 2 metas\n", snapTS, tsTime(snapTS)),
		"listed snapshot " + wantPath + "\n",
		"2 tables, 2 keys, 3 objects, ",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("snapshot output lacks %q:\n%s", want, stdout)
		}
	}
	prom, err := os.ReadFile(metricsFile)
	if err != nil || !strings.Contains(string(prom), `flowlog_op_objects{command="snapshot",flow="default/f"} 3`) ||
		!strings.Contains(string(prom), `flowlog_op_last_success_timestamp_seconds{command="snapshot"}`) ||
		!regexp.MustCompile(`flowlog_op_log_read_bytes\{command="snapshot",flow="default/f"\} [1-9]`).Match(prom) {
		t.Errorf("metrics file: %v\n%s", err, prom)
	}
	stdout, err = runIn(t, e.Conn, "snapshot", "--flow", "f", "--temp-dir", t.TempDir())
	if want := fmt.Sprintf("flow default/f (id 1) has a snapshot as of %d (%s) already: %s\n", snapTS, tsTime(snapTS), wantPath); err != nil || stdout != want {
		t.Fatalf("second snapshot at the same ts: %v\n%s\nwant\n%s", err, stdout, want)
	}

	e.Commit(t, e.TS(58*time.Minute), sinktest.WritePut(1, 2, e.TS(54*time.Minute), e.TS(55*time.Minute), []byte("after"), true))
	stdout, err = runIn(t, e.Conn, "restore", "--flow", "f", "--out", t.TempDir(), "--temp-dir", t.TempDir())
	if want := fmt.Sprintf("2 tables started from the snapshot at %d (%s); only the log after it was read", snapTS, tsTime(snapTS)); err != nil || !strings.Contains(stdout, want) {
		t.Fatalf("restore = %v, does not say %q:\n%s", err, want, stdout)
	}
	stdout, err = runIn(t, e.Conn, "verify", "--flow", "f")
	if err != nil || !strings.Contains(stdout, "snapshots 1 (2 tables, 2 chunks") || !strings.Contains(stdout, "truncation point: none") {
		t.Fatalf("verify: %v\n%s", err, stdout)
	}

	if err := e.Redis.Client(t).Set(ctx, meta.NewKeys("flowlog").TruncatedBefore(1), fmt.Sprint(snapTS), 0).Err(); err != nil {
		t.Fatal(err)
	}
	below := e.TS(20 * time.Minute)
	_, err = runIn(t, e.Conn, "restore", "--flow", "f", "--ts", fmt.Sprint(below), "--out", t.TempDir(), "--force", "--temp-dir", t.TempDir())
	if want := fmt.Sprintf("--ts %d (%s) is before the truncation point of flow default/f (id 1): the log before it was removed; the oldest restorable ts is %d (%s)",
		below, tsTime(below), snapTS, tsTime(snapTS)); err == nil || err.Error() != want {
		t.Fatalf("restore below the truncation point = %v, want %q", err, want)
	}
	stdout, err = runIn(t, e.Conn, "verify", "--flow", "f")
	if err != nil || !strings.Contains(stdout, fmt.Sprintf("truncation point: %d", snapTS)) {
		t.Fatalf("verify: %v\n%s", err, stdout)
	}
}
