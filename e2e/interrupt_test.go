package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
)

// TestRestoreInterrupt interrupts the built `consumer restore` the way an
// operator's Ctrl-C does (SIGINT) once it is mid-way, with sort files
// spilled to --temp-dir, and checks what it leaves: exit 130, a line that
// says what was interrupted and what was removed, no file under --temp-dir,
// and --out as it was before the run (a new directory removed; with
// --force, the earlier restore's files unchanged and nothing added). GCS
// answers through a proxy that
// delays every request, so that the restore is still reading when the
// signal comes, whatever the machine's speed.
func TestRestoreInterrupt(t *testing.T) {
	c := startCluster(t, 2)
	cfg := loadgen.Config{Events: 30_000, Tables: []int64{1, 2}, Regions: 4, ValueSize: 300, Seed: 2301,
		StartTime: time.Date(2026, 3, 4, 9, 0, 0, 0, time.UTC)}
	stats := expectLoad(cfg)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "big", "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--flush-size", "256KiB")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFlowCheckpoint(ctx, t, store, "big", stats.maxResolved, 90*time.Second)
	if err := cons.Stop(); err != nil {
		t.Fatalf("consumer exit after SIGTERM: %v", err)
	}
	proxy := startFaultProxy(t, c.GCS.Addr)
	proxy.setLatency(20 * time.Millisecond)

	// start starts a restore of the whole flow into out that spills sorted
	// runs early (a small --max-memory) and reads one chunk at a time, and
	// waits until its sort files are on disk.
	start := func(t *testing.T, temp, out string, extra ...string) *proc {
		args := []string{"restore", "--redis-url", c.Redis.URL, "--gcs-bucket", c.GCS.Bucket, "--gcs-endpoint", proxy.Addr,
			"--flow", "big", "--out", out, "--temp-dir", temp, "--max-memory", "4MiB", "--parallel", "1"}
		p := newProc(t, "restore", binary(t, "consumer"), append(args, extra...)...)
		p.Start()
		waitForOrStop(t, 2*time.Minute, func() (bool, string, error) {
			runs, _ := filepath.Glob(filepath.Join(temp, "flowlog-restore-*", "*.run"))
			if len(runs) > 0 {
				return true, "", nil
			}
			if p.hasExited() {
				return false, "", fmt.Errorf("restore exited before it spilled a sorted run (the backup is too small to interrupt): %v\n%s", p.Wait(), p.Log())
			}
			return false, "no sorted run under " + temp + " yet", nil
		})
		return p
	}
	exitCode := func(t *testing.T, p *proc) int {
		err := p.Wait()
		if err == nil {
			return 0
		}
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			return ee.ExitCode()
		}
		t.Fatalf("restore: %v", err)
		return -1
	}
	checkTempEmpty := func(t *testing.T, temp string) {
		t.Helper()
		if ents, _ := os.ReadDir(temp); len(ents) != 0 {
			t.Errorf("--temp-dir holds %d entries after the interrupt (%s, ...)", len(ents), ents[0].Name())
		}
	}

	t.Run("new out dir", func(t *testing.T) {
		temp, parent := t.TempDir(), t.TempDir()
		out := filepath.Join(parent, "restored")
		p := start(t, temp, out)
		p.Signal(syscall.SIGINT)
		if code := exitCode(t, p); code != 130 {
			t.Fatalf("exit %d after SIGINT, want 130:\n%s", code, p.Log())
		}
		log := p.Log()
		for _, want := range []string{"consumer restore: interrupt: stopping and cleaning up",
			"consumer restore: interrupted: restore of flow default/big (id 1) as of ",
			"removed its sort files from --temp-dir and the tables it wrote; --out " + out + ", which this run created, was removed"} {
			if !strings.Contains(log, want) {
				t.Errorf("output lacks %q:\n%s", want, log)
			}
		}
		checkTempEmpty(t, temp)
		if ents, _ := os.ReadDir(parent); len(ents) != 0 {
			t.Errorf("the interrupted restore left %s in --out's parent", ents[0].Name())
		}
	})

	t.Run("force keeps the earlier files", func(t *testing.T) {
		temp, out := t.TempDir(), t.TempDir()
		old := map[string]string{"1.jsonl": "an earlier restore of table 1\n", "7.jsonl": "an earlier restore of table 7\n", "notes": "mine"}
		for name, body := range old {
			if err := os.WriteFile(filepath.Join(out, name), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		p := start(t, temp, out, "--force")
		p.Signal(syscall.SIGINT)
		if code := exitCode(t, p); code != 130 {
			t.Fatalf("exit %d after SIGINT, want 130:\n%s", code, p.Log())
		}
		if !strings.Contains(p.Log(), "--out "+out+" is as it was before the run") {
			t.Errorf("output does not say --out is as it was:\n%s", p.Log())
		}
		checkTempEmpty(t, temp)
		ents, _ := os.ReadDir(out)
		if len(ents) != len(old) {
			names := make([]string, len(ents))
			for i, e := range ents {
				names[i] = e.Name()
			}
			t.Errorf("--out holds %v after the interrupt, want only the %d entries it had", names, len(old))
		}
		for name, body := range old {
			if got, err := os.ReadFile(filepath.Join(out, name)); err != nil || string(got) != body {
				t.Errorf("%s is %q (%v), want it unchanged", name, got, err)
			}
		}
	})
}
