//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
)

// clearLine starts every redraw of a progress line and ends the last one.
const clearLine = "\r\033[K"

// runOnTerminal runs the consumer with args, its stderr a terminal (a
// pty), and returns its exit code, stdout and what the terminal showed.
func runOnTerminal(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	master, slave := testenv.OpenPTY(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := consumerCmd(ctx, "", nil, args...)
	var stdout, term bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close() // the child holds it; reads end when it exits
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&term, master); close(copied) }()
	r := procEnd(t, ctx, cmd.Wait(), args, procResult{})
	<-copied // the master reads EIO once the last slave is closed
	return r.code, stdout.String(), term.String()
}

// TestProgressLines: restore, snapshot, truncate, gc and replay draw a progress
// line on a terminal (redrawn in place, cleared when the work ends) and
// never on a pipe; stdout, what a script reads, never holds one.
func TestProgressLines(t *testing.T) {
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "t1", 7, 40, 10)
	snap := fmt.Sprint(h.MS(40*50*6/10+17, 0))
	restoreArgs := append([]string{"restore"}, h.Args("--flow", "f", "--out", filepath.Join(t.TempDir(), "out"), "--temp-dir", t.TempDir())...)
	for _, tc := range []struct {
		name string
		args []string
		line string // the start of the progress line
	}{
		{"restore", restoreArgs, "read "},
		{"snapshot", append([]string{"snapshot"}, h.Args("--flow", "f", "--ts", snap, "--temp-dir", t.TempDir())...), "read "},
		{"replay", append([]string{"replay"}, h.Args(append(replayKafka(t), "--flow", "f")...)...), "replayed "},
		{"truncate", append([]string{"truncate"}, h.Args("--flow", "f", "--until", snap)...), "planning the truncate of flow default/f: "},
		{"gc", append([]string{"gc"}, h.Conn...), "gc: listed "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, term := runOnTerminal(t, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d; terminal:\n%q", code, term)
			}
			if !strings.Contains(term, clearLine+tc.line) {
				t.Errorf("no progress line %q on the terminal:\n%q", tc.line, term)
			}
			if last := strings.LastIndex(term, clearLine); last >= 0 && strings.Contains(term[last+len(clearLine):], tc.line) {
				t.Errorf("the last progress line stays on the terminal:\n%q", term)
			}
			if strings.Contains(stdout, "\033") || stdout == "" {
				t.Errorf("stdout holds a control sequence or nothing:\n%q", stdout)
			}
		})
	}
	// On a pipe: the work again where it is repeatable (a restore, a gc).
	for _, args := range [][]string{append(restoreArgs, "--force"), append([]string{"gc"}, h.Conn...)} {
		r := runConsumer(t, 2*time.Minute, nil, args...)
		if r.code != 0 || strings.Contains(r.stderr+r.stdout, "\033") {
			t.Errorf("%s on a pipe: exit %d, a control sequence in its output:\nstdout %q\nstderr %q", args[0], r.code, r.stdout, r.stderr)
		}
	}
}
