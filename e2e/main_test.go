// Package e2e runs flowlog's real binaries as processes against real
// services: a private redis-server, an Apache Kafka broker (or a kfake
// broker process: FLOWLOG_TEST_KAFKA=kfake) and a fake-gcs-server process,
// each of which a test can kill, stop, restart or freeze independently.
//
// TestMain builds the binaries once per run into a temporary directory.
// Set FLOWLOG_E2E_RACE=1 to build them with the race detector.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/flowlog/flowlog/internal/testenv"
)

// binaries are the commands TestMain builds, by name.
var binaries = map[string]string{
	"consumer":    "./cmd/consumer",
	"producer":    "./cmd/producer",
	"kfakebroker": "./internal/tools/kfakebroker",
	"fakegcs":     "./internal/tools/fakegcs",
}

var (
	binDir    string
	buildErrs = map[string]error{} // a binary that failed to build fails only the tests that need it
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "flowlog-e2e-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: temp dir: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	root, err := filepath.Abs("..")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: module root: %v\n", err)
		return 1
	}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for name, pkg := range binaries {
		wg.Go(func() {
			args := []string{"build", "-o", filepath.Join(dir, name)}
			if os.Getenv("FLOWLOG_E2E_RACE") == "1" {
				args = append(args, "-race")
			}
			cmd := exec.Command("go", append(args, pkg)...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				mu.Lock()
				buildErrs[name] = fmt.Errorf("go build %s: %w\n%s", pkg, err, strings.TrimSpace(string(out)))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for name, err := range buildErrs {
		fmt.Fprintf(os.Stderr, "e2e: warning: %s did not build; tests that run it will fail:\n%v\n", name, err)
	}
	if kind, err := testenv.KafkaKind(); err == nil && kind == "apache" {
		// Each test's broker is started while the test before it runs.
		testenv.PrestartApacheKafka()
		defer testenv.StopApacheKafkaSpare()
	}
	return m.Run()
}

// binary returns the path of a built binary, failing the test if it did not
// build.
func binary(t testing.TB, name string) string {
	t.Helper()
	if _, ok := binaries[name]; !ok {
		t.Fatalf("unknown binary %q", name)
	}
	if err := buildErrs[name]; err != nil {
		t.Fatalf("binary %s unavailable: %v", name, err)
	}
	return filepath.Join(binDir, name)
}
