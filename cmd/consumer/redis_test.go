package main

import (
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestRedisUnavailable: a Redis that refuses or never answers is one line
// naming its address, password redacted, with no go-redis log lines before
// it, so that the operator sees which Redis to fix and no secret.
func TestRedisUnavailable(t *testing.T) {
	refused, silent := testenv.ClosedAddr(t), testenv.SilentAddr(t)
	gcs := []string{"--gcs-endpoint", "127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"flows, refused", []string{"flows", "--redis-url", "redis://:s3cret@" + refused + "/0"},
			"consumer flows: redis at redis://:xxxxx@" + refused + "/0: dial tcp " + refused + ": connect: connection refused"},
		{"status, silent", []string{"status", "--redis-url", "redis://u:s3cret@" + silent + "/1"},
			"consumer status: redis at redis://u:xxxxx@" + silent + "/1 did not answer within 5s: "},
		{"run, refused", append([]string{"run", "--redis-url", "redis://:s3cret@" + refused + "/0"}, gcs...),
			"consumer run: redis at redis://:xxxxx@" + refused + "/0: dial tcp"},
		{"run, silent", append([]string{"run", "--redis-url", "redis://" + silent + "/0"}, gcs...),
			"consumer run: redis at redis://" + silent + "/0 did not answer within 5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runConsumer(t, 30*time.Second, nil, tc.args...)
			if r.code != 1 || r.stdout != "" {
				t.Fatalf("exit %d, stdout %q; want 1 and nothing; stderr:\n%s", r.code, r.stdout, r.stderr)
			}
			if r.took > 15*time.Second {
				t.Errorf("took %v", r.took)
			}
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, tc.want) {
				t.Errorf("error %q, want it to start %q", last, tc.want)
			}
			for _, l := range lines {
				if strings.HasPrefix(l, "redis: ") || strings.Contains(l, "pool.go") {
					t.Errorf("go-redis log line on stderr: %q", l)
				}
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Errorf("stderr leaks the password:\n%s", r.stderr)
			}
		})
	}
}
