package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestRunRefusesPrefixOfAnotherGroup: `consumer run` under a Redis prefix
// another consumer group owns exits at once with one line naming that group
// and --redis-prefix, and leaves the owner as it was.
func TestRunRefusesPrefixOfAnotherGroup(t *testing.T) {
	r := testenv.StartRedis(t)
	rdb := r.Client(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, "shared:{flowlog}:owner", "payments", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Kafka and GCS are unreachable: the check must come before either is used.
	args := []string{"--redis-url", r.URL, "--redis-prefix", "shared", "--group", "orders",
		"--brokers", "127.0.0.1:1", "--gcs-bucket", "b", "--gcs-endpoint", "http://127.0.0.1:1",
		"--temp-dir", t.TempDir(), "--http-addr", "", "--log-format", "text"}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err := runRun(rctx, args)
	if err == nil {
		t.Fatal("consumer run started under another group's prefix")
	}
	msg := err.Error()
	for _, want := range []string{`"payments"`, "--redis-prefix", `"shared"`, `"orders"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %s", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error %q is not one line", msg)
	}
	if rctx.Err() != nil {
		t.Errorf("consumer run took until the deadline to refuse")
	}
	if got, _ := rdb.Get(ctx, "shared:{flowlog}:owner").Result(); got != "payments" {
		t.Errorf("owner = %q, want payments", got)
	}
}
