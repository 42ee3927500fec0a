package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runMainEnv makes the test binary run main instead of the tests, so that
// the tests can run the consumer as a process and see its exit code.
const runMainEnv = "FLOWLOG_CONSUMER_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// procResult is how a consumer process ended.
type procResult struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// consumerCmd is a consumer process to be started, in dir (if not empty),
// with the environment cleared of FLOWLOG_* and GCS settings except env.
func consumerCmd(ctx context.Context, dir string, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLOWLOG_") && !strings.HasPrefix(kv, "STORAGE_EMULATOR_HOST=") &&
			!strings.HasPrefix(kv, "GOOGLE_APPLICATION_CREDENTIALS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, runMainEnv+"=1"), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	return cmd
}

// runConsumer runs the consumer with args to completion, killing it and
// failing the test after limit.
func runConsumer(t testing.TB, limit time.Duration, env []string, args ...string) procResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := consumerCmd(ctx, "", env, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	return procEnd(t, ctx, err, args, procResult{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)})
}

// procEnd fills r.code from err, the end of a process run under ctx.
func procEnd(t testing.TB, ctx context.Context, err error, args []string, r procResult) procResult {
	t.Helper()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("consumer %v did not end in time; stdout:\n%s\nstderr:\n%s", args, r.stdout, r.stderr)
	case err == nil:
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	default:
		t.Fatalf("consumer %v: %v", args, err)
	}
	return r
}
