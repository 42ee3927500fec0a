package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// openWindows makes the pending coverage windows of every flow final as
// the consumer does when the one apply partition with records (lease's)
// reports them: a table added before any record has since 0.
func openWindows(t testing.TB, st *meta.Store, lease meta.Lease) {
	t.Helper()
	ctx := context.Background()
	pending, err := st.PendingCoverage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reps []meta.CoverageReport
	for _, pf := range pending {
		for _, e := range pf.Entries {
			reps = append(reps, meta.CoverageReport{FlowID: pf.ID, Seq: e.Seq, Topic: lease.Topic, Partition: lease.Partition})
		}
	}
	if err := st.Commit(ctx, meta.Commit{Leases: []meta.Lease{lease}, Coverage: reps}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.FinalizeCoverage(ctx, lease.Topic, []int32{lease.Partition}); err != nil {
		t.Fatal(err)
	}
}

// captureStderr runs fn with os.Stderr sent to a pipe and returns what it
// printed there, its stdout, and its error.
func captureStderr(t *testing.T, fn func() error) (stderr, stdout string, err error) {
	t.Helper()
	stderr, err = captureFile(t, &os.Stderr, func() error {
		var ferr error
		stdout, ferr = capture(t, fn)
		return ferr
	})
	return stderr, stdout, err
}

// Restore reads each table only inside the coverage window that holds --ts
// and names every table it leaves out (DESIGN 7; issue 9, defect 5).
func TestRestoreWithinCoverageWindows(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	rdb := e.redis.Client(t)
	// Table 1 was added at 5m (its put at exactly 5m is before the window);
	// table 2 was removed at 5m30s, before its put at 6m.
	windows := map[string]string{
		"1": fmt.Sprintf(`{"since":%d,"until":null}`, e.ts(5*time.Minute)),
		"2": fmt.Sprintf(`{"since":0,"until":%d}`, e.ts(5*time.Minute+30*time.Second)),
	}
	if err := rdb.HSet(ctx, "flowlog:{flowlog}:coverage:1", windows).Err(); err != nil {
		t.Fatal(err)
	}
	run := func(ts uint64) (string, string, string, error) {
		out := filepath.Join(t.TempDir(), "out")
		stderr, stdout, err := captureStderr(t, func() error {
			return runRestore(ctx, e.args("--flow", "f", "--out", out, "--temp-dir", t.TempDir(), "--ts", fmt.Sprint(ts)))
		})
		return out, stderr, stdout, err
	}

	out, stderr, stdout, err := run(e.ts(30 * time.Minute))
	if err != nil {
		t.Fatalf("restore at 30m: %v\n%s%s", err, stdout, stderr)
	}
	if !strings.Contains(stderr, "left out table 2: no coverage window holds") {
		t.Errorf("stderr does not name table 2 as left out:\n%s", stderr)
	}
	if got := readJSONL(t, filepath.Join(out, "1.jsonl")); len(got) != 0 {
		t.Errorf("table 1 at 30m = %v, want empty: its only put before 30m is not inside its window", got)
	}
	if _, err := os.Stat(filepath.Join(out, "2.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("table 2 restored although its window ended before 30m (stat: %v)", err)
	}

	out, _, stdout, err = run(e.ts(50 * time.Minute))
	if err != nil {
		t.Fatalf("restore at the checkpoint: %v\n%s", err, stdout)
	}
	late := []string{rowHex(1, 1) + "=late@" + fmt.Sprint(e.ts(48*time.Minute))}
	if got := readJSONL(t, filepath.Join(out, "1.jsonl")); fmt.Sprint(got) != fmt.Sprint(late) {
		t.Errorf("table 1 at the checkpoint = %v, want %v", got, late)
	}

	vout, err := capture(t, func() error { return runVerify(ctx, e.args("--flow", "f")) })
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, vout)
	}
	for _, want := range []string{
		fmt.Sprintf("table 1: coverage window [%d, now]", e.ts(5*time.Minute)),
		fmt.Sprintf("table 2: coverage window [0, %d]", e.ts(5*time.Minute+30*time.Second)),
	} {
		if !strings.Contains(vout, want) {
			t.Errorf("verify does not show %q:\n%s", want, vout)
		}
	}

	fout, err := capture(t, func() error { return runFlows(ctx, e.args()) })
	if want := fmt.Sprintf("1:[%d, now]", e.ts(5*time.Minute)); err != nil || !strings.Contains(fout, want) {
		t.Errorf("flows = %v, does not show %q:\n%s", err, want, fout)
	}

	// Close table 1's window too: at 30m nothing is restorable, and the
	// restore says so and fails.
	if err := rdb.HSet(ctx, "flowlog:{flowlog}:coverage:1", "1", fmt.Sprintf(`{"since":%d,"until":%d}`, e.ts(5*time.Minute), e.ts(10*time.Minute))).Err(); err != nil {
		t.Fatal(err)
	}
	_, stderr, _, err = run(e.ts(30 * time.Minute))
	if err == nil || !strings.Contains(err.Error(), "every table left out") || !strings.Contains(stderr, "left out table 1") {
		t.Fatalf("restore with every table outside its window = %v\n%s", err, stderr)
	}
}

// A dropped flow whose global_checkpoint object stopped before its coverage
// windows began (dropped before a checkpoint advance passed their since)
// is restorable up to its windows' ends: final windows need every apply
// partition's report, and each report is committed with the data before
// its boundary. With the object missing it is restorable the same way;
// while a window is still open the restore fails and says why.
func TestRestoreDroppedFlowCheckpointBeforeWindows(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	rdb := e.redis.Client(t)
	info, _, err := e.store.FlowInfo(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.DestroyFlow(ctx, 1, info); err != nil {
		t.Fatal(err)
	}
	ckptPath := sink.CheckpointPath("pre", "default", "f", "g1", 1)
	e.gcs.CreateObject(fakeObject(ckptPath, sink.EncodeCheckpoint(e.ts(3*time.Minute))))
	setWindows := func(until2 string) {
		t.Helper()
		w := map[string]string{
			"1": fmt.Sprintf(`{"since":%d,"until":%d}`, e.ts(4*time.Minute), e.ts(50*time.Minute)),
			"2": fmt.Sprintf(`{"since":%d,"until":%s}`, e.ts(4*time.Minute), until2),
		}
		if err := rdb.HSet(ctx, "flowlog:{flowlog}:coverage:1", w).Err(); err != nil {
			t.Fatal(err)
		}
	}
	run := func() (string, string, string, error) {
		out := filepath.Join(t.TempDir(), "out")
		stderr, stdout, err := captureStderr(t, func() error {
			return runRestore(ctx, e.args("--flow-id", "1", "--out", out, "--temp-dir", t.TempDir()))
		})
		return out, stderr, stdout, err
	}
	late := []string{rowHex(1, 1) + "=late@" + fmt.Sprint(e.ts(48*time.Minute))}
	nine := []string{rowHex(2, 9) + "=nine@" + fmt.Sprint(e.ts(6*time.Minute))}
	check := func(name string) {
		t.Helper()
		out, stderr, stdout, err := run()
		if err != nil {
			t.Fatalf("%s: restore: %v\n%s%s", name, err, stdout, stderr)
		}
		if got := restoredAsOf(t, stdout); got != e.ts(50*time.Minute) {
			t.Errorf("%s: restored as of %d, want the windows' end %d", name, got, e.ts(50*time.Minute))
		}
		if got := readJSONL(t, filepath.Join(out, "1.jsonl")); fmt.Sprint(got) != fmt.Sprint(late) {
			t.Errorf("%s: table 1 = %v, want %v", name, got, late)
		}
		if got := readJSONL(t, filepath.Join(out, "2.jsonl")); fmt.Sprint(got) != fmt.Sprint(nine) {
			t.Errorf("%s: table 2 = %v, want %v", name, got, nine)
		}
	}

	setWindows(fmt.Sprint(e.ts(50 * time.Minute)))
	check("checkpoint object before the windows")
	if err := e.bucket.Delete(ctx, ckptPath); err != nil {
		t.Fatal(err)
	}
	check("checkpoint object missing")

	setWindows("null") // table 2's window is not final yet
	e.gcs.CreateObject(fakeObject(ckptPath, sink.EncodeCheckpoint(e.ts(3*time.Minute))))
	out, stderr, stdout, err := run()
	if err == nil || !strings.Contains(err.Error(), "every table left out") || !strings.Contains(stderr, "left out table 1") {
		t.Fatalf("restore with an open window and the checkpoint before every window = %v\n%s%s", err, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "1.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed restore wrote table 1 (stat: %v)", err)
	}
}
