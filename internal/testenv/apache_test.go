package testenv_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/testenv"
)

// TestApacheKafka starts a real broker, checks the compose topics exist
// with their partitions and retention, round-trips a record, and checks
// that Stop and Start keep the data on the same address.
func TestApacheKafka(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := testenv.StartApacheKafka(t, testenv.ApacheKafkaConfig{ApplyPartitions: 3})
	if k.PID() == 0 {
		t.Fatal("broker not running after StartApacheKafka")
	}
	if err := testenv.VerifyTopics(ctx, k.Addr, testenv.ComposeTopics(3)); err != nil {
		t.Fatal(err)
	}

	roundTrip := func(t *testing.T, want int) {
		t.Helper()
		cl := k.Client(t, kgo.ConsumeTopics(testenv.DDLTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		n := 0
		for n < want {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				t.Fatalf("read %d of %d records: %v", n, want, err)
			}
			n += fs.NumRecords()
		}
		if n != want {
			t.Fatalf("read %d records, want %d", n, want)
		}
	}
	if err := k.Client(t).ProduceSync(ctx, &kgo.Record{Topic: testenv.DDLTopic, Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, 1)

	addr, pid := k.Addr, k.PID()
	if err := k.Stop(); err != nil {
		t.Fatalf("broker exit after SIGTERM: %v", err)
	}
	if alive(pid) {
		t.Fatalf("broker pid %d still alive after Stop", pid)
	}
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	if k.Addr != addr {
		t.Fatalf("restarted on %s, was %s", k.Addr, addr)
	}
	roundTrip(t, 1)
}

// TestApacheKafkaDiesWithTheTestBinary runs a test binary that starts a
// broker and panics, and checks that the broker's JVM does not outlive it.
func TestApacheKafkaDiesWithTheTestBinary(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestApacheKafkaPanicChild$", "-test.v")
	cmd.Env = append(os.Environ(), "TESTENV_PANIC_CHILD="+pidFile)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("child test binary exited 0, want a panic:\n%s", out)
	}
	b, rerr := os.ReadFile(pidFile)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if rerr != nil || perr != nil || pid <= 0 {
		t.Fatalf("child wrote no broker pid (%v %v):\n%s", rerr, perr, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("broker pid %d alive 30s after its test binary panicked", pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestApacheKafkaPanicChild is the child of
// TestApacheKafkaDiesWithTheTestBinary; it does nothing on its own.
func TestApacheKafkaPanicChild(t *testing.T) {
	pidFile := os.Getenv("TESTENV_PANIC_CHILD")
	if pidFile == "" {
		t.Skip("only run as the child of TestApacheKafkaDiesWithTheTestBinary")
	}
	k := testenv.StartApacheKafka(t, testenv.ApacheKafkaConfig{Topics: []testenv.TopicSpec{}})
	if err := os.WriteFile(pidFile, []byte(fmt.Sprint(k.PID())), 0o644); err != nil {
		t.Fatal(err)
	}
	// A panic from another goroutine: no test cleanup runs, only the
	// parent-death signal can stop the JVM.
	done := make(chan struct{})
	go func() { panic("child test binary dies with a broker running") }()
	<-done
}

// alive reports whether pid is a live process (not gone, not a zombie).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(after, "Z")
}
