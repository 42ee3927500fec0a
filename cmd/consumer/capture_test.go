package main

import (
	"context"
	"io"
	"os"
	"testing"
)

// capture runs fn with os.Stdout redirected and returns what it printed.
func capture(t *testing.T, fn func() error) (string, error) {
	t.Helper()
	return captureFile(t, &os.Stdout, fn)
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

// captureFile runs fn with *f (os.Stdout or os.Stderr) sent to a pipe and
// returns what fn printed there.
func captureFile(t *testing.T, f **os.File, fn func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := *f
	*f = w
	done := make(chan string)
	go func() { b, _ := io.ReadAll(r); done <- string(b) }()
	ferr := fn()
	*f = old
	w.Close()
	return <-done, ferr
}

// runIn runs consumer command in this process with conn and args, and
// returns what it printed and its error.
func runIn(t *testing.T, conn []string, command string, args ...string) (string, error) {
	t.Helper()
	return capture(t, func() error {
		return commands[command].run(context.Background(), append(append([]string{}, conn...), args...))
	})
}
