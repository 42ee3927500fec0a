package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
)

// runMainEnv makes the test binary run main instead of the tests, so that
// the tests can run the producer as a process and see its exit code.
const runMainEnv = "FLOWLOG_PRODUCER_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// result is how a producer process ended.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// runProducer runs the producer with args (and extra environment) as a
// process, killing it after limit.
func runProducer(t *testing.T, limit time.Duration, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("producer %v still running after %v; stderr:\n%s", args, limit, r.stderr)
	case err == nil:
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	default:
		t.Fatalf("producer %v: %v", args, err)
	}
	return r
}

// TestUnreachableBroker checks that a publish no broker acknowledges ends
// within --timeout with a non-zero exit that names the broker and the cause,
// after saying on stderr what it waits for: a script that publishes a flow
// must never hang, and its operator must see why it failed.
func TestUnreachableBroker(t *testing.T) {
	refused, silent := testenv.ClosedAddr(t), testenv.SilentAddr(t)
	for _, tc := range []struct {
		name   string
		broker string
		args   []string
		want   []string // in stderr, besides the broker address
	}{
		{"flow create, refused", refused, []string{"flow", "create", "--name", "f", "--tables", "1"},
			[]string{"publish create of default/f to flowlog.ddl: no acknowledgement from Kafka within 3s (--timeout)", "connection refused"}},
		{"load, refused", refused, []string{"load", "--events", "100"},
			[]string{"no acknowledgement from Kafka for 3s (--timeout)", "connection refused"}},
		{"heartbeat, refused", refused, []string{"heartbeat"}, []string{"(--timeout)", "connection refused"}},
		{"flow drop, silent broker", silent, []string{"flow", "drop", "--name", "f"},
			[]string{"no acknowledgement from Kafka within 3s (--timeout)"}},
		{"load, silent broker", silent, []string{"load", "--events", "100"}, []string{"no acknowledgement"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runProducer(t, 20*time.Second, nil, append(tc.args, "--brokers", tc.broker, "--timeout", "3s")...)
			if r.code != 1 {
				t.Fatalf("exit %d, want 1; stderr:\n%s", r.code, r.stderr)
			}
			if r.took > 12*time.Second {
				t.Errorf("took %v with --timeout 3s", r.took)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "waiting for broker "+tc.broker) {
				t.Fatalf("stderr, want a waiting line and the error:\n%s", r.stderr)
			}
			if !strings.Contains(lines[1], "broker "+tc.broker) {
				t.Errorf("error does not name broker %s: %s", tc.broker, lines[1])
			}
			for _, w := range tc.want {
				if !strings.Contains(lines[1], w) {
					t.Errorf("error lacks %q: %s", w, lines[1])
				}
			}
		})
	}
}

// TestFastBrokerIsNotAnnounced: a broker that answers gets no waiting line.
func TestFastBrokerIsNotAnnounced(t *testing.T) {
	k := testenv.StartKafka(t, 2)
	r := runProducer(t, 30*time.Second, nil, "flow", "create", "--name", "f", "--tables", "1", "--brokers", k.Brokers(), "--timeout", "10s")
	if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "published create default/f at partition 0 offset 0") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestCommandLineErrors checks that a typo or a bad value is one line with
// a pointer to the command's -h, not a usage dump that hides the problem.
func TestCommandLineErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"load", "--evnts", "3"}, nil, "producer load: flag provided but not defined: -evnts (run 'producer load -h' for help)"},
		{[]string{"load", "--events", "many"}, nil, `producer load: invalid value "many" for flag -events: parse error (run 'producer load -h' for help)`},
		{[]string{"load", "extra"}, nil, "producer load: unexpected arguments: extra (run 'producer load -h' for help)"},
		{[]string{"flow", "create", "--name", "f", "--tables", "1", "--tabels", "2"}, nil,
			"producer flow: flag provided but not defined: -tabels (run 'producer flow -h' for help)"},
		{[]string{"heartbeat", "--regions", "x"}, nil, "(run 'producer heartbeat -h' for help)"},
		{[]string{"heartbeat"}, []string{"FLOWLOG_TIMEOUT=soon"}, `producer heartbeat: invalid environment: FLOWLOG_TIMEOUT="soon": invalid value for --timeout`},
		{[]string{"lod"}, nil, `producer: unknown command "lod" (run 'producer help' for the list)`},
		{[]string{"flow", "craete", "--name", "f"}, nil,
			`producer flow: unknown operation "craete": want create, replace, drop or resume (run 'producer flow -h' for help)`},
		{[]string{"load", "--rate", "-1"}, nil, "producer load: --rate -1: must not be negative (run 'producer load -h' for help)"},
		{[]string{"heartbeat", "--regions", "0"}, nil, "producer heartbeat: --regions 0: must be at least 1"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := runProducer(t, 10*time.Second, tc.env, tc.args...)
			if r.code != 2 || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and one line containing %q", r.code, r.stdout, r.stderr, tc.want)
			}
		})
	}
	r := runProducer(t, 10*time.Second, nil, "help", "flow")
	if r.code != 0 || !strings.Contains(r.stdout, "usage: producer flow") || r.stderr != "" {
		t.Errorf("help flow: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}
