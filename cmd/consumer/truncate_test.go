package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
)

// TestTruncate: after truncate, `consumer restore` at ts at or above the
// snapshot writes byte for byte what it wrote before (prewritten values of
// later commits included) and below it is refused; truncate refuses
// without a snapshot, says what it will do first, and a second run changes nothing.
func TestTruncate(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	e := newRetentionEnv(t, rd, g, "t1", 7, 40, 10)
	s := e.ms(40*50*6/10+17, 0) // inside a cycle, 60% into the history
	until := fmt.Sprint(s + 1000)

	if _, err := e.run(t, "truncate", "--flow", "f", "--until", until); err == nil || !strings.Contains(err.Error(), "no listed snapshot at or below --until") {
		t.Fatalf("truncate without a snapshot: %v", err)
	}
	old := e.ms(300, 0)
	e.snapshot(t, old)
	snapBytes := e.snapshot(t, s)
	base := e.baseline(t, e.restoreTSs(s)...)
	before := e.storedBytes(t)
	metas, _ := e.store.Metas(context.Background(), 1)

	out, err := e.run(t, "truncate", "--flow", "f", "--until", until, "--dry-run")
	if err != nil || !strings.Contains(out, "would remove") || e.storedBytes(t) != before {
		t.Fatalf("truncate --dry-run: %v, stored %d -> %d bytes, stdout:\n%s", err, before, e.storedBytes(t), out)
	}
	var (
		pushMu   sync.Mutex
		pushPath string
		pushBody []byte
	)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		pushMu.Lock()
		pushPath, pushBody = req.Method+" "+req.URL.Path, b
		pushMu.Unlock()
	}))
	defer gw.Close()
	r := runConsumer(t, 30*time.Second, nil, e.cmd("truncate", "--flow", "f", "--until", until, "--metrics-push-url", gw.URL)...)
	if r.code != 0 {
		t.Fatalf("truncate: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	pushMu.Lock()
	if pushPath != "PUT /metrics/job/flowlog_truncate" || !bytes.Contains(pushBody, []byte("flowlog_op_objects")) {
		t.Errorf("metrics pushed as %q (%d bytes), want a PUT for job flowlog_truncate", pushPath, len(pushBody))
	}
	pushMu.Unlock()
	t.Logf("truncate:\n%s", r.stdout)
	plan := strings.Index(r.stdout, "will remove")
	if plan < 0 || plan > strings.Index(r.stdout, "deleted") {
		t.Errorf("truncate did not print its plan before deleting:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "holds default-CF values a later write may need") {
		t.Errorf("truncate kept no meta for a prewritten value; the data should need some:\n%s", r.stdout)
	}
	after, _ := e.store.Metas(context.Background(), 1)
	if len(after) == 0 || len(after) >= len(metas) {
		t.Errorf("metas %d -> %d, want some removed and some kept", len(metas), len(after))
	}
	if tb, ok, err := e.store.TruncatedBefore(context.Background(), 1); err != nil || !ok || tb != s {
		t.Errorf("truncated_before = %d, %v, %v; want %d", tb, ok, err, s)
	}
	snaps, _ := e.store.Snapshots(context.Background(), 1)
	if len(snaps) != 1 || snaps[0].TS != s {
		t.Errorf("snapshots after truncate = %+v, want only the one at %d", snaps, s)
	}
	for _, n := range e.objectNames(t) {
		if strings.Contains(n, fmt.Sprintf("/snapshot/%020d-", old)) {
			t.Errorf("the older snapshot's object %s is still there", n)
		}
	}
	e.checkRestores(t, base)

	// What it stores now, against the snapshot plus the log after it.
	logAfter := logBytesAfter(t, e, s)
	stored := e.storedBytes(t)
	t.Logf("bytes stored: %d before truncate, %d after; snapshot %d + log after it %d = %d (ratio %.3f)",
		before, stored, snapBytes, logAfter, snapBytes+logAfter, float64(stored)/float64(snapBytes+logAfter))

	// The truncated backup still verifies.
	if out, err := e.run(t, "verify", "--flow", "f"); err != nil {
		t.Errorf("verify after truncate: %v, stdout:\n%s", err, out)
	}

	// flows shows the snapshot, the truncation point and the log after it.
	out, err = e.run(t, "flows", "--json")
	var rows []flowRow
	if jerr := json.Unmarshal([]byte(out), &rows); err != nil || jerr != nil || len(rows) != 1 {
		t.Fatalf("flows --json: %v, %v, stdout:\n%s", err, jerr, out)
	}
	if fr := rows[0]; fr.SnapshotTS != s || fr.TruncatedBefore != s || fr.LogBytesAfterSnapshot == nil || *fr.LogBytesAfterSnapshot != chunkBytesAfter(t, e, s) {
		t.Errorf("flows row: snapshot %d, truncated before %d, log bytes %v; want %d, %d, %d", fr.SnapshotTS, fr.TruncatedBefore,
			fr.LogBytesAfterSnapshot, s, s, chunkBytesAfter(t, e, s))
	}
	if out, _ = e.run(t, "flows"); !strings.Contains(out, "TRUNCATED BEFORE") || !strings.Contains(out, " KiB") {
		t.Errorf("flows table lacks the retention columns:\n%s", out)
	}

	out, err = e.run(t, "truncate", "--flow", "f", "--until", until)
	if err != nil || !strings.Contains(out, "deleted 0 objects") || e.storedBytes(t) != stored {
		t.Errorf("second truncate: %v, stdout:\n%s", err, out)
	}
	// A snapshot below the truncation point is refused; one listed there
	// anyway (as before the truncate) gives truncate nothing to do.
	if out, err := e.run(t, "snapshot", "--flow", "f", "--ts", fmt.Sprint(old), "--temp-dir", t.TempDir()); err == nil ||
		!strings.Contains(err.Error(), fmt.Sprintf("the oldest restorable ts is %d", s)) {
		t.Errorf("snapshot below the truncation point: %v, stdout:\n%s", err, out)
	}
	if err := e.store.AddSnapshot(context.Background(), 1, sink.SnapshotMetaPath(e.prefix, "default", "f", 1, old)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run(t, "truncate", "--flow", "f", "--until", fmt.Sprint(old+1)); err == nil || !strings.Contains(err.Error(), "already truncated before") {
		t.Errorf("truncate below the truncation point: %v", err)
	}
}

// chunkBytesAfter is the stored bytes of the listed chunks with an event
// after s.
func chunkBytesAfter(t *testing.T, e *retentionEnv, s uint64) int64 {
	t.Helper()
	var n int64
	for _, m := range e.listedMetas(t) {
		n += m.LogBytesAfter(s)
	}
	return n
}

// logBytesAfter is what the listed metas hold after s: the chunks with an
// event newer than s, and the meta objects that list them.
func logBytesAfter(t *testing.T, e *retentionEnv, s uint64) int64 {
	t.Helper()
	var n int64
	for _, m := range e.listedMetas(t) {
		if after := m.LogBytesAfter(s); after > 0 {
			n += after + m.Size
		}
	}
	return n
}

// TestTruncateCrash kills truncate at points spread over its run, before
// and after its Redis transaction, and checks that whatever it left,
// `consumer restore` at ts at or above the snapshot writes what it wrote
// before the truncate (and below it is refused once the truncation point
// is recorded), that gc then removes what the killed run left behind, and
// that a new run completes the truncate.
func TestTruncateCrash(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	const rounds = 6
	var deletes time.Duration // how long round 0 took from its MULTI to its end
	for round := range rounds {
		e := newRetentionEnv(t, rd, g, fmt.Sprintf("c%d", round), uint64(round), 30, 12)
		s := e.ms(30*50*7/10, 0)
		e.snapshot(t, s)
		base := e.baseline(t, e.restoreTSs(s)...)
		args := e.cmd("truncate", "--flow", "f", "--until", fmt.Sprint(s), "--parallel", "1")
		var after string
		var delay time.Duration
		switch {
		case round == 0:
			after = "recorded truncated_before" // to time the deletes
		case round <= 2:
			delay = time.Duration(round) * 20 * time.Millisecond // from the start: before the MULTI
		default:
			after = "recorded truncated_before" // printed between the MULTI and the deletes
			delay = deletes * time.Duration(round-3) / (rounds - 3)
		}
		killed, took := runKilled(t, after, delay, round > 0, args...)
		if round == 0 {
			deletes = took
		}
		tb, truncated, err := e.store.TruncatedBefore(context.Background(), 1)
		if err != nil || (truncated && tb != s) || (after != "" && !truncated) {
			t.Fatalf("round %d: truncated_before = %d, %v, %v", round, tb, truncated, err)
		}
		t.Logf("round %d: killed %v after %v past %q; truncated_before recorded: %v", round, killed, delay, after, truncated)
		e.checkRestores(t, base)
		if round == 0 {
			continue
		}

		// gc removes what the killed run left, and nothing listed.
		if out, err := e.run(t, "gc", "--grace", "0s"); err != nil {
			t.Fatalf("round %d: gc: %v, stdout:\n%s", round, err, out)
		}
		e.checkRestores(t, base)
		st := e.store
		plan, err := sink.PlanGC(context.Background(), e.bucket, sink.GCOptions{Prefix: e.prefix, Refs: backup.GCRefs(st)})
		if err != nil || len(plan.Delete)+plan.Young > 0 {
			t.Errorf("round %d: after gc, unreferenced objects remain: %+v, %v", round, plan.Delete, err)
		}
		// A new run completes the truncate.
		if out, err := e.run(t, "truncate", args[len(e.conn)+1:]...); err != nil {
			t.Fatalf("round %d: truncate after the kill: %v, stdout:\n%s", round, err, out)
		}
		e.checkRestores(t, base)
	}
}

// runKilled runs the consumer with args and, if kill, SIGKILLs it delay
// after stdout showed a line containing after (after the start if after is
// empty). It reports whether the kill hit a running process, and the time
// from that point to the process's end.
func runKilled(t *testing.T, after string, delay time.Duration, kill bool, args ...string) (bool, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := consumerCmd(ctx, "", nil, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mark time.Time
	seen := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		found := after == ""
		if found {
			close(seen)
		}
		for sc.Scan() {
			if !found && strings.Contains(sc.Text(), after) {
				found = true
				close(seen)
			}
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-seen:
		mark = time.Now()
	case err := <-done:
		t.Fatalf("consumer %v ended before printing %q: %v", args, after, err)
	}
	if kill {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("consumer %v: %v", args, err)
			}
			return false, time.Since(mark)
		case <-time.After(delay):
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	err = <-done
	took := time.Since(mark)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return false, took
	case kill && errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signaled():
		return true, took
	}
	t.Fatalf("consumer %v: %v", args, err)
	return false, took
}
