package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"

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

// TestRunRefusesEmptyRedisOverABackup: `consumer run` on a Redis with no
// state under its prefix (no owner key) refuses to start when the bucket
// prefix already holds a backup, a layout v2 tree or a v1 flow directory,
// with one line naming `consumer recover` and the object it found, and
// writes nothing to Redis. A bucket prefix that holds no backup (empty, or
// foreign objects, or a backup under another prefix) starts as before and
// claims the prefix.
func TestRunRefusesEmptyRedisOverABackup(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		objects []string
		found   string // the object the refusal names; "" to start
	}{
		{"empty bucket", nil, ""},
		{"foreign objects and another prefix's backup", []string{"pre/README", "pre/default/f/v2/x", "pre/v2/other/y",
			"other/v2/meta/00000000000000000100-s-c.meta", "other/default/f/v1/backupmeta/x.meta"}, ""},
		{"layout v2 meta", []string{"pre/README", "pre/v2/meta/00000000000000000100-s-1-0-ab.meta"}, "pre/v2/meta/00000000000000000100-s-1-0-ab.meta"},
		{"layout v2 checkpoint alone", []string{"pre/v2/global_checkpoint/g1.ts"}, "pre/v2/global_checkpoint/g1.ts"},
		{"layout v1 flow", []string{"pre/default/f/v1/backupmeta/00000000000000000100-1-c.meta"}, "pre/default/f/v1/backupmeta/00000000000000000100-1-c.meta"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, g, k := testenv.StartRedis(t), testenv.StartGCS(t), testenv.StartKafka(t, 1)
			for _, name := range tc.objects {
				g.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: testenv.Bucket, Name: name}, Content: []byte("x")})
			}
			rdb := r.Client(t)
			args := []string{"--redis-url", r.URL, "--redis-prefix", "p", "--group", "g1", "--brokers", k.Brokers(),
				"--gcs-bucket", testenv.Bucket, "--gcs-endpoint", g.Endpoint(), "--gcs-prefix", "pre",
				"--temp-dir", t.TempDir(), "--http-addr", "", "--log-format", "text", "--ddl-topic", testenv.DDLTopic,
				"--apply-topic", testenv.ApplyTopic, "--dlq-topic", testenv.DLQTopic}
			rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- runRun(rctx, args) }()
			if tc.found == "" {
				deadline := time.Now().Add(60 * time.Second)
				// Started: it claimed the prefix and took its partition's
				// lease (canceling earlier could end its start-up with
				// context.Canceled).
				for {
					owner, _ := rdb.Get(ctx, "p:{flowlog}:owner").Result()
					if n, _ := rdb.Exists(ctx, "p:{flowlog}:lease:"+testenv.ApplyTopic+":0").Result(); owner == "g1" && n == 1 {
						break
					}
					select {
					case err := <-done:
						t.Fatalf("consumer run ended before claiming the prefix: %v", err)
					case <-time.After(50 * time.Millisecond):
					}
					if time.Now().After(deadline) {
						t.Fatal("consumer run did not claim the prefix and its partition within 60s")
					}
				}
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("consumer run: %v", err)
				}
				return
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("consumer run did not refuse within 30s")
			}
			if err == nil {
				t.Fatal("consumer run started on an empty Redis over a backup")
			}
			msg := err.Error()
			for _, want := range []string{"consumer recover", tc.found, `"p"`, `"pre"`} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not name %s", msg, want)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q is not one line", msg)
			}
			if ks, err := rdb.Keys(ctx, "*").Result(); err != nil || len(ks) != 0 {
				t.Errorf("keys in Redis after the refusal: %v, %v; want none", ks, err)
			}
		})
	}
}
