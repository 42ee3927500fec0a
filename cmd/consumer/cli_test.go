package main

import (
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestCommandLineErrors checks that a typo or a bad value is one line naming
// the problem and the command's -h, not the whole flag list; a problem from
// the environment names the variable.
func TestCommandLineErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		env   []string
		code  int
		lines []string // each must be contained in its line of stderr, in order
	}{
		{"typo in run", []string{"run", "--flsh-size", "1"}, nil, 2,
			[]string{"consumer run: flag provided but not defined: -flsh-size (run 'consumer run -h' for help)"}},
		{"typo, run implied", []string{"--brokrs", "x"}, nil, 2,
			[]string{"consumer run: flag provided but not defined: -brokrs (run 'consumer run -h' for help)"}},
		{"typo in flows", []string{"flows", "--jsn"}, nil, 2,
			[]string{"consumer flows: flag provided but not defined: -jsn (run 'consumer flows -h' for help)"}},
		{"typo in status", []string{"status", "--x"}, nil, 2, []string{"(run 'consumer status -h' for help)"}},
		{"typo in restore", []string{"restore", "--x"}, nil, 2, []string{"(run 'consumer restore -h' for help)"}},
		{"typo in verify", []string{"verify", "--x"}, nil, 2, []string{"(run 'consumer verify -h' for help)"}},
		{"bad value", []string{"flows", "--json=maybe"}, nil, 2,
			[]string{`consumer flows: invalid boolean value "maybe" for -json: parse error (run 'consumer flows -h' for help)`}},
		{"stray argument", []string{"flows", "extra"}, nil, 2, []string{`unexpected arguments ["extra"] (run 'consumer flows -h' for help)`}},
		{"stray argument to restore", []string{"restore", "--flow", "f", "--out", "o", "extra"}, nil, 2,
			[]string{`unexpected arguments ["extra"] (run 'consumer restore -h' for help)`}},
		{"a flag the command does not use", []string{"restore", "--brokers", "k:9092"}, nil, 2,
			[]string{"consumer restore: flag provided but not defined: -brokers (run 'consumer restore -h' for help)"}},
		{"unknown command", []string{"flow"}, nil, 2, []string{`consumer: unknown command "flow" (run 'consumer help' for the list)`}},
		{"bad environment", []string{"flows"}, []string{"FLOWLOG_JSON=maybe"}, 2,
			[]string{`consumer flows: invalid environment: FLOWLOG_JSON="maybe": invalid value for --json: parse error`}},
		{"validation from the environment", []string{"run"},
			[]string{"FLOWLOG_LOG_FORMAT=xml", "FLOWLOG_REDIS_PREFIX=a b", "FLOWLOG_FLUSH_SIZE=lots"}, 2, []string{
				"consumer run: invalid configuration:",
				`--flush-size: invalid value "lots"`,
				`redis-prefix "a b": must not contain braces or whitespace (from FLOWLOG_REDIS_PREFIX)`,
				`--log-format: "xml" is not json, text or auto (from FLOWLOG_LOG_FORMAT)`,
			}},
		{"group with a slash", []string{"restore", "--group", "a/b", "--flow", "f", "--out", "o"}, nil, 2, []string{
			"consumer restore: invalid configuration:", `--group "a/b": must be 1 to 128 characters of [A-Za-z0-9._-] (it becomes part of object names)`}},
		{"flush size too small", []string{"run", "--flush-size", "1"}, nil, 2, []string{
			"consumer run: invalid configuration:", "--flush-size: 1 bytes is below the minimum of 64KiB"}},
		{"no GCS", nil, []string{"HOME=" + t.TempDir(), "CLOUDSDK_CONFIG=" + t.TempDir()}, 1, []string{
			"consumer run: no GCS configured: set --gcs-endpoint (or STORAGE_EMULATOR_HOST) for an emulator, " +
				"or Google credentials (GOOGLE_APPLICATION_CREDENTIALS) for GCS; 'consumer dev' runs everything locally"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runConsumer(t, 30*time.Second, tc.env, tc.args...)
			if r.code != tc.code || r.stdout != "" {
				t.Fatalf("exit %d, stdout %q; want exit %d and nothing on stdout; stderr:\n%s", r.code, r.stdout, tc.code, r.stderr)
			}
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if len(lines) != len(tc.lines) {
				t.Fatalf("stderr has %d lines, want %d:\n%s", len(lines), len(tc.lines), r.stderr)
			}
			for i, want := range tc.lines {
				if !strings.Contains(lines[i], want) {
					t.Errorf("stderr line %d = %q, want it to contain %q", i+1, lines[i], want)
				}
			}
			if strings.Contains(r.stderr, "FLOWLOG_FLUSH_SIZE") != strings.Contains(strings.Join(tc.env, " "), "FLOWLOG_FLUSH_SIZE") {
				t.Errorf("the line of a bad FLOWLOG_FLUSH_SIZE does not name it:\n%s", r.stderr)
			}
		})
	}
}

// TestHelp: -h, --help and help list the commands; help C is C -h.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		r := runConsumer(t, 10*time.Second, nil, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "commands:\n  run ") || !strings.Contains(r.stdout, "\n  status ") {
			t.Errorf("consumer %v: exit %d, stdout:\n%s", args, r.code, r.stdout)
		}
	}
	r := runConsumer(t, 10*time.Second, nil, "help", "status")
	if r.code != 0 || !strings.Contains(r.stdout, "--http-addr") || strings.Contains(r.stdout+r.stderr, "commands:") || r.stderr != "" {
		t.Errorf("consumer help status: exit %d, stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestSharedFlags: a command takes the connection flags it uses from the
// command line and the environment, the same names for every command.
func TestSharedFlags(t *testing.T) {
	rd := testenv.StartRedis(t)
	env := []string{"FLOWLOG_REDIS_URL=" + rd.URL, "FLOWLOG_GCS_ENDPOINT=127.0.0.1:1", "FLOWLOG_BROKERS=127.0.0.1:1"}
	r := runConsumer(t, 30*time.Second, env, "flows", "--group", "g", "--gcs-bucket", "b")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "ID") {
		t.Fatalf("flows with shared flags: exit %d, stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
	}
}
