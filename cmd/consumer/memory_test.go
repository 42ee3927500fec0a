package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestMaxMemorySetsGoMemoryLimit: `consumer run` makes --max-memory (or
// FLOWLOG_MAX_MEMORY) the Go soft memory limit, unless GOMEMLIMIT is set,
// which then stays: without a limit the heap grows past the budget the
// operator sized the machine for. The start log reports the limit the
// runtime has. A refused Redis ends each run right after.
func TestMaxMemorySetsGoMemoryLimit(t *testing.T) {
	refused := "redis://" + testenv.ClosedAddr(t) + "/0"
	args := []string{"run", "--redis-url", refused, "--gcs-endpoint", "127.0.0.1:1"}
	for _, tc := range []struct {
		name   string
		args   []string
		env    []string
		limit  int64
		source string
	}{
		{"default", nil, []string{"GOMEMLIMIT="}, 96 << 20, "--max-memory"},
		{"flag", []string{"--max-memory", "64MiB"}, []string{"GOMEMLIMIT="}, 32 << 20, "--max-memory"},
		{"environment", nil, []string{"GOMEMLIMIT=", "FLOWLOG_MAX_MEMORY=48MiB"}, 24 << 20, "--max-memory"},
		{"large", []string{"--max-memory", "1GiB"}, []string{"GOMEMLIMIT="}, 992 << 20, "--max-memory"},
		{"GOMEMLIMIT wins", []string{"--max-memory", "64MiB"}, []string{"GOMEMLIMIT=300MiB"}, 300 << 20, "GOMEMLIMIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runConsumer(t, 30*time.Second, tc.env, append(append([]string{}, args...), tc.args...)...)
			if r.code != 1 {
				t.Fatalf("exit %d, want 1 (Redis refused); stderr:\n%s", r.code, r.stderr)
			}
			var found bool
			for _, l := range strings.Split(r.stderr, "\n") {
				var rec struct {
					Msg    string `json:"msg"`
					Limit  int64  `json:"memory_limit"`
					Source string `json:"source"`
				}
				if json.Unmarshal([]byte(l), &rec) != nil || rec.Msg != "go memory limit" {
					continue
				}
				found = true
				if rec.Limit != tc.limit || rec.Source != tc.source {
					t.Errorf("memory limit %d from %s, want %d from %s", rec.Limit, rec.Source, tc.limit, tc.source)
				}
			}
			if !found {
				t.Errorf("no \"go memory limit\" log line; stderr:\n%s", r.stderr)
			}
		})
	}
}
