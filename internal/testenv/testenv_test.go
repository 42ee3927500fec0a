package testenv_test

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/api/option"

	"github.com/flowlog/flowlog/internal/testenv"
)

func TestServices(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("redis", func(t *testing.T) {
		r := testenv.StartRedis(t)
		cl := r.Client(t)
		if err := cl.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		r.Restart(t)
		if n, err := cl.Exists(ctx, "k").Result(); err != nil || n != 0 {
			t.Fatalf("after restart: exists=%d err=%v, want 0 <nil>", n, err)
		}
	})

	t.Run("kafka", func(t *testing.T) {
		k := testenv.StartKafka(t, 4)
		cl := k.Client(t, kgo.ConsumeTopics(testenv.DDLTopic))
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: testenv.DDLTopic, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		fs := cl.PollFetches(ctx)
		if errs := fs.Errors(); len(errs) > 0 {
			t.Fatal(errs)
		}
		if got := fs.NumRecords(); got != 1 {
			t.Fatalf("fetched %d records, want 1", got)
		}
	})

	t.Run("gcs", func(t *testing.T) {
		g := testenv.StartGCS(t)
		cl, err := storage.NewClient(ctx, option.WithEndpoint("http://"+g.Endpoint()+"/storage/v1/"), option.WithoutAuthentication(), storage.WithJSONReads())
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		w := cl.Bucket(testenv.Bucket).Object("a/b").NewWriter(ctx)
		if _, err := w.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		r, err := cl.Bucket(testenv.Bucket).Object("a/b").NewRangeReader(ctx, 1, 3)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		r.Close()
		if string(b) != "ell" {
			t.Fatalf("range read = %q, want %q", b, "ell")
		}
	})
}

// TestProcStatus reads this process's resident set from /proc in bytes,
// and refuses a field /proc does not have: a memory bound checked against
// a field that silently read 0 would always hold.
func TestProcStatus(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	st, err := testenv.ProcStatus(os.Getpid(), "VmRSS", "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	if st["VmRSS"] < 1<<20 || st["VmHWM"] < st["VmRSS"] {
		t.Errorf("VmRSS %d, VmHWM %d bytes: want at least 1 MiB, peak at least the current", st["VmRSS"], st["VmHWM"])
	}
	if st, err := testenv.ProcStatus(os.Getpid(), "VmRSS", "NoSuchField"); err == nil || st != nil {
		t.Errorf("a missing field: %v, %v; want an error and no map", st, err)
	}
}
