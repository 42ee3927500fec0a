package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
)

// TestTruncateCrash kills truncate at points spread over its run, before
// and after its Redis transaction, and checks that whatever it left,
// a restore at ts at or above the snapshot writes what it wrote
// before the truncate (and below it is refused once the truncation point
// is recorded), that gc then removes what the killed run left behind, and
// that a new run completes the truncate.
func TestTruncateCrash(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	const rounds = 6
	var deletes time.Duration // how long round 0 took from its MULTI to its end
	for round := range rounds {
		h := backuptest.NewHistory(t, rd, g, fmt.Sprintf("c%d", round), uint64(round), 30, 12)
		s := h.MS(30*50*7/10, 0)
		h.Snapshot(t, s)
		base := h.Baseline(t, h.RestoreTSs(s)...)
		truncate := []string{"--flow", "f", "--until", fmt.Sprint(s), "--parallel", "1"}
		args := append(append([]string{"truncate"}, h.Conn...), truncate...)
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
		tb, truncated, err := h.Store.TruncatedBefore(context.Background(), 1)
		if err != nil || (truncated && tb != s) || (after != "" && !truncated) {
			t.Fatalf("round %d: truncated_before = %d, %v, %v", round, tb, truncated, err)
		}
		t.Logf("round %d: killed %v after %v past %q; truncated_before recorded: %v", round, killed, delay, after, truncated)
		h.CheckRestores(t, base)
		if round == 0 {
			continue
		}

		// gc removes what the killed run left, and nothing listed.
		if out, err := runIn(t, h.Conn, "gc", "--grace", "0s"); err != nil {
			t.Fatalf("round %d: gc: %v, stdout:\n%s", round, err, out)
		}
		h.CheckRestores(t, base)
		plan, err := sink.PlanGC(context.Background(), h.Bucket, sink.GCOptions{Prefix: h.Prefix, Refs: backup.GCRefs(h.Store)})
		if err != nil || len(plan.Delete)+plan.Young > 0 {
			t.Errorf("round %d: after gc, unreferenced objects remain: %+v, %v", round, plan.Delete, err)
		}
		// A new run completes the truncate.
		if out, err := runIn(t, h.Conn, "truncate", truncate...); err != nil {
			t.Fatalf("round %d: truncate after the kill: %v, stdout:\n%s", round, err, out)
		}
		h.CheckRestores(t, base)
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
