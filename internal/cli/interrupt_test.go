package cli_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/testenv"
)

// interruptChild, set in a child's environment, makes TestInterrupt's
// child run: it installs Interrupt and reports what happens.
const interruptChild = "FLOWLOG_CLI_INTERRUPT_CHILD"

// TestInterrupt runs a child process that installs Interrupt, waits for its
// context to end and then hangs in its clean-up (as a restore could on a
// slow disk): the first SIGINT must cancel the context with ErrInterrupted
// after the first callback, and the second must end the process at once
// with exit 130, after the second callback, although the clean-up never
// returns.
func TestInterrupt(t *testing.T) {
	if os.Getenv(interruptChild) == "1" {
		ctx, stop := cli.Interrupt(context.Background(),
			func(s os.Signal) { fmt.Println("first:", s) },
			func() { fmt.Println("second") })
		defer stop()
		fmt.Println("ready")
		<-ctx.Done()
		fmt.Println("interrupted:", cli.Interrupted(ctx), errors.Is(context.Cause(ctx), cli.ErrInterrupted))
		select {} // a clean-up that never ends
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestInterrupt$")
	cmd.Env = append(os.Environ(), interruptChild+"=1")
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitOutput := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("child printed %q, want %q", out.String(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitOutput("ready\n")
	_ = cmd.Process.Signal(syscall.SIGINT)
	waitOutput("interrupted: true true\n")
	if !strings.Contains(out.String(), "first: interrupt\n") {
		t.Errorf("the first callback did not run before the context ended: %q", out.String())
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != cli.ExitInterrupted {
			t.Fatalf("child ended with %v, want exit %d", err, cli.ExitInterrupted)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the second SIGINT did not end the child: %q", out.String())
	}
	if !strings.HasSuffix(out.String(), "second\n") {
		t.Errorf("the second callback did not run last: %q", out.String())
	}
}
