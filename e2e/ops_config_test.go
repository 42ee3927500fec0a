package e2e

import (
	"strings"
	"testing"
)

// TestOpsConfig checks that invalid config fails at start with exit 2 and
// one line per problem, naming the flag (command line or environment), and
// -h groups the flags with their defaults, on stdout.
func TestOpsConfig(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		env   []string
		lines []string // each must start a line of stderr
	}{
		{"three flags", []string{"--flush-size", "lots", "--start-offset", "middle", "--compression", "lz4"}, nil,
			[]string{`--flush-size: invalid value "lots"`, `--start-offset: "middle"`, `--compression: "lz4"`}},
		{"environment", nil, []string{"FLOWLOG_FLUSH_SIZE=12XB", "FLOWLOG_LOG_FORMAT=xml", "FLOWLOG_REDACT_LOGS=maybe"},
			[]string{`--flush-size: invalid value "12XB"`, `--redact-logs: invalid value "maybe"`, `--log-format: "xml"`}},
		{"relations", []string{"--flush-size", "2GiB", "--max-temp-bytes", "1GiB", "--fatal-after", "0"}, nil,
			[]string{"--max-temp-bytes (1073741824) must be at least --flush-size", "--fatal-after: must be at least 1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := opsRunConsumer(t, tc.env, append([]string{"run"}, tc.args...)...)
			if code != 2 || stdout != "" {
				t.Fatalf("exit %d, stdout %q, want 2 and nothing", code, stdout)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if len(lines) != len(tc.lines)+1 || lines[0] != "consumer run: invalid configuration:" {
				t.Fatalf("stderr has %d lines, want a heading and %d problems:\n%s", len(lines), len(tc.lines), stderr)
			}
			for i, want := range tc.lines {
				if !strings.HasPrefix(lines[i+1], want) {
					t.Errorf("line %d = %q, want it to start %q", i+1, lines[i+1], want)
				}
			}
		})
	}

	t.Run("help", func(t *testing.T) {
		code, help, _ := opsRunConsumer(t, nil, "run", "-h")
		if code != 0 {
			t.Fatalf("run -h: exit %d\n%s", code, help)
		}
		sections := []string{"\nKafka:\n", "\nRedis:\n", "\nGCS:\n", "\nPipeline:\n", "\nHTTP and logs:\n"}
		at := -1
		for _, s := range sections {
			i := strings.Index(help, s)
			if i <= at {
				t.Fatalf("section %q missing or out of order in:\n%s", strings.TrimSpace(s), help)
			}
			at = i
		}
		if strings.Contains(help, "\nOther:\n") {
			t.Errorf("flags outside the five sections:\n%s", help[strings.Index(help, "\nOther:\n"):])
		}
		section := func(flag string) string { // the section a flag is listed in
			i := strings.Index(help, "\n  --"+flag+" ")
			if i < 0 {
				i = strings.Index(help, "\n  --"+flag+"\n")
			}
			if i < 0 {
				return ""
			}
			s := help[:i+1]
			j := strings.LastIndex(s, ":\n")
			return s[strings.LastIndex(s[:j], "\n")+1 : j]
		}
		for flag, want := range map[string]string{
			"brokers": "Kafka", "kafka-tls": "Kafka", "redis-url": "Redis", "gcs-bucket": "GCS", "flush-size": "Pipeline",
			"max-value-size": "Pipeline", "http-addr": "HTTP and logs", "redact-logs": "HTTP and logs",
		} {
			if got := section(flag); got != want {
				t.Errorf("--%s listed under %q, want %q", flag, got, want)
			}
		}
		for _, d := range []string{`(default "127.0.0.1:9092", env FLOWLOG_BROKERS)`, "(default 128MiB, env FLOWLOG_FLUSH_SIZE)",
			"(default 1m0s, env FLOWLOG_FLUSH_INTERVAL)", "(default true, env FLOWLOG_REDACT_LOGS)", "(default 30, env FLOWLOG_FATAL_AFTER)"} {
			if !strings.Contains(help, d) {
				t.Errorf("help lacks %q", d)
			}
		}
	})
}

// opsRunConsumer runs the consumer binary with args and extra environment
// to completion and returns its exit code, stdout and stderr.
func opsRunConsumer(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	return cliRun(t, binary(t, "consumer"), env, args...)
}
