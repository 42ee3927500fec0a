package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// peakRSSEnv makes the test binary run as runPeakRSS's helper: it runs the
// command of its arguments, writes the command's peak resident set in
// bytes to the file the variable names, and exits with its status.
//
// Why a helper: Go starts a child with vfork, so the kernel's maxrss of the
// child (its VmHWM at exit) starts at the parent's own peak, and a test
// binary that built large objects would mask the child's. The helper is a
// fresh process of a few MiB, so what it measures of its child is the
// child's.
const peakRSSEnv = "FLOWLOG_E2E_PEAKRSS"

func peakRSSHelper(out string, args []string) int {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		fmt.Fprintf(os.Stderr, "peak rss helper: %v\n", err)
		return 125
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		fmt.Fprintln(os.Stderr, "peak rss helper: no rusage")
		return 125
	}
	if err := os.WriteFile(out, []byte(strconv.FormatInt(ru.Maxrss<<10, 10)), 0o600); err != nil { // kB on Linux
		fmt.Fprintf(os.Stderr, "peak rss helper: %v\n", err)
		return 125
	}
	return cmd.ProcessState.ExitCode()
}

// peakCommand is exec.CommandContext of bin with args, run through the
// peak RSS helper; peak returns bin's peak resident set in bytes once the
// command has run. The command's rusage (ProcessState.SysUsage) is the
// helper's and bin's together: their CPU, and the helper's maxrss, which
// is not bin's.
func peakCommand(ctx context.Context, t testing.TB, bin string, args ...string) (cmd *exec.Cmd, peak func() (int64, error)) {
	t.Helper()
	file := t.TempDir() + "/peak"
	cmd = exec.CommandContext(ctx, os.Args[0], append([]string{bin}, args...)...)
	cmd.Env = append(os.Environ(), peakRSSEnv+"="+file)
	return cmd, func() (int64, error) {
		raw, err := os.ReadFile(file)
		if err != nil {
			return 0, fmt.Errorf("no peak RSS measured: %w", err)
		}
		return strconv.ParseInt(string(raw), 10, 64)
	}
}

// runPeakRSS runs bin with args to completion (within timeout) and returns
// its combined output, its peak resident set in bytes and its exit error.
func runPeakRSS(t testing.TB, timeout time.Duration, bin string, args ...string) (string, int64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd, peak := peakCommand(ctx, t, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s did not end within %v:\n%s", bin, strings.Join(args, " "), timeout, out.String())
	}
	n, perr := peak()
	if perr != nil {
		t.Fatalf("%s: %v (exit: %v)\n%s", bin, perr, err, out.String())
	}
	return out.String(), n, err
}

// The helper measures its child's peak, not the test binary's: a child
// that holds 100 MiB shows more than that, and one that holds nothing
// shows little, however much the test binary holds.
func TestPeakRSSHelper(t *testing.T) {
	ballast := make([]byte, 300<<20)
	for i := range ballast {
		ballast[i] = 1
	}
	defer func() { _ = ballast[len(ballast)-1] }()
	// Linux carries a process's peak from before its exec into the child's
	// maxrss: the floor is the helper's own pages when it starts the child,
	// about 10 MiB, about 70 MiB in a race-detector build. Either is far
	// below the 300 MiB this test binary holds, which the helper must not
	// measure.
	_, small, err := runPeakRSS(t, time.Minute, "/bin/true")
	if err != nil || small > 150<<20 {
		t.Errorf("/bin/true: peak %d MiB, %v; want the helper's floor, far below the 300 MiB the test holds", small>>20, err)
	}
	_, big, err := runPeakRSS(t, time.Minute, "/bin/sh", "-c", `x=$(head -c 80000000 /dev/zero | tr '\0' a); echo ${#x}`)
	t.Logf("/bin/true peaked at %.1f MiB, the shell at %.1f MiB", float64(small)/(1<<20), float64(big)/(1<<20))
	if err != nil || big < 76<<20 {
		t.Errorf("a shell holding an 80 MB string: peak %d MiB, %v; want at least 76 MiB", big>>20, err)
	}
}
