//go:build nodev

package main

import (
	"testing"
	"time"
)

// TestDevLeftOut: a nodev binary's dev says how to get it.
func TestDevLeftOut(t *testing.T) {
	r := runConsumer(t, 10*time.Second, nil, "dev", "--events", "1")
	want := "consumer dev: " + errNoDev.Error() + "\n"
	if r.code != 1 || r.stdout != "" || r.stderr != want {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 1 and %q", r.code, r.stdout, r.stderr, want)
	}
}
