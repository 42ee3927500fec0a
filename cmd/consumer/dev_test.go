//go:build !nodev

package main

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// waitFor polls cond every 100ms until it holds or limit passes.
func waitFor(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// envFile reads the export lines of a dev env file as KEY=VALUE.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	vars := readDevEnv(path)
	if len(vars) == 0 {
		t.Fatalf("%s: no variables", path)
	}
	return vars
}

func environ(vars map[string]string) []string {
	var out []string
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	return out
}

// TestDevKeepRunning checks that dev with --keep-running writes an env file
// the other commands run with, keeps the checkpoint moving with heartbeats,
// stops cleanly on SIGTERM and SIGINT (exit 0, summary), saves its private
// Redis, and a rerun continues from it on the same addresses.
func TestDevKeepRunning(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	redisURL := "redis://127.0.0.1:" + strconv.Itoa(port) + "/0" // nothing there: dev starts a private redis-server on it
	args := []string{"dev", "--data-dir", data, "--events", "500", "--redis-url", redisURL}

	var firstMetas int
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := consumerCmd(ctx, dir, nil, append(args, "--keep-running", "--heartbeat-interval", "200ms")...)
		var stdout, stderr testenv.SyncBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		ended := func() bool { return len(exited) > 0 }
		if !waitFor(2*time.Minute, func() bool { return strings.Contains(stdout.String(), "still running") || ended() }) || ended() {
			cmd.Process.Kill()
			t.Fatalf("run %d: no 'still running' summary; stdout:\n%s\nstderr:\n%s", i, stdout.String(), stderr.String())
		}
		vars := envFile(t, filepath.Join(data, "env"))
		for _, name := range []string{"FLOWLOG_BROKERS", "FLOWLOG_REDIS_URL", "FLOWLOG_GCS_ENDPOINT", "FLOWLOG_GCS_BUCKET", "FLOWLOG_HTTP_ADDR", "STORAGE_EMULATOR_HOST"} {
			if vars[name] == "" {
				t.Errorf("env file lacks %s: %v", name, vars)
			}
		}
		if vars["FLOWLOG_REDIS_URL"] != redisURL {
			t.Errorf("private redis at %s, want it on --redis-url's port %s", vars["FLOWLOG_REDIS_URL"], redisURL)
		}
		// The summary is written line by line after "still running": its
		// next steps may not all be there yet, which is "not yet".
		wants := []string{"source " + filepath.Join(data, "env"), " status\n", " restore --flow demo --out ", " verify --flow demo\n",
			" load --events ", "kcat -b " + vars["FLOWLOG_BROKERS"] + " -L"}
		missing := func() []string {
			var out []string
			for _, want := range wants {
				if !strings.Contains(stdout.String(), want) {
					out = append(out, want)
				}
			}
			return out
		}
		waitFor(30*time.Second, func() bool { return len(missing()) == 0 || ended() })
		for _, want := range missing() {
			t.Errorf("next steps lack %q:\n%s", want, stdout.String())
		}

		// The printed commands work with the env file alone. verify reads
		// Redis's checkpoint before the global_checkpoint object, so a
		// heartbeat-driven commit in between makes it report the object
		// ahead (a known race of verify against a running consumer): a
		// verify that fails only so is "not yet", and is run again.
		for _, c := range [][]string{{"status"}, {"verify", "--flow", "demo"}, {"restore", "--flow", "demo", "--out", t.TempDir()}} {
			var r procResult
			for try := 0; try < 5; try++ {
				r = runConsumer(t, time.Minute, environ(vars), c...)
				if r.code == 0 || c[0] != "verify" || strings.Count(r.stdout, "FAULT") != 1 || !strings.Contains(r.stdout, "ahead of Redis") {
					break
				}
			}
			if r.code != 0 {
				t.Errorf("%v with the env file: exit %d\n%s%s", c, r.code, r.stdout, r.stderr)
			}
		}

		// Heartbeats move the checkpoint past the load's while no data comes.
		rdb := meta.Config{URL: vars["FLOWLOG_REDIS_URL"], Prefix: "flowlog"}
		cl, err := rdb.NewClient()
		if err != nil {
			t.Fatal(err)
		}
		store := meta.NewStore(cl, "flowlog", nil)
		first, _, err := demoCheckpoint(ctx, store)
		if err != nil || first == 0 {
			t.Fatalf("checkpoint %d, %v", first, err)
		}
		if !waitFor(30*time.Second, func() bool { ck, _, err := demoCheckpoint(ctx, store); return err == nil && ck > first }) {
			t.Errorf("run %d: checkpoint stayed at %d with heartbeats every 200ms", i, first)
		}
		cl.Close()

		start := time.Now()
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		err = <-exited
		r := procEnd(t, ctx, err, args, procResult{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)})
		if r.code != 0 || strings.Contains(r.stderr, "context canceled") {
			t.Fatalf("run %d, %v: exit %d; stderr:\n%s", i, sig, r.code, r.stderr)
		}
		if r.took > 30*time.Second {
			t.Errorf("stop took %v", r.took)
		}
		final := r.stdout[strings.Index(r.stdout, "still running"):]
		if !strings.Contains(final, "flowlog dev run complete") {
			t.Fatalf("run %d: no final summary after %v:\n%s", i, sig, r.stdout)
		}
		metas := summaryMetas(t, final[strings.Index(final, "flowlog dev run complete"):])
		if _, err := os.Stat(filepath.Join(data, "redis", "addr")); !os.IsNotExist(err) {
			t.Errorf("private redis-server not shut down: addr file %v", err)
		}
		if conn, err := net.DialTimeout("tcp", strings.TrimPrefix(strings.TrimSuffix(redisURL, "/0"), "redis://"), time.Second); err == nil {
			conn.Close()
			t.Errorf("private redis-server still answers after dev stopped")
		}
		if i == 0 {
			firstMetas = metas
			continue
		}
		// The rerun continued from the saved Redis.
		if metas <= firstMetas {
			t.Errorf("rerun has %d metas in Redis, want more than the first run's %d", metas, firstMetas)
		}
		if again := envFile(t, filepath.Join(data, "env")); again["FLOWLOG_BROKERS"] != vars["FLOWLOG_BROKERS"] {
			t.Errorf("rerun moved the broker from %s to %s", vars["FLOWLOG_BROKERS"], again["FLOWLOG_BROKERS"])
		}
	}
}

// summaryMetas is the count of the summary's "meta objects:" line.
func summaryMetas(t *testing.T, summary string) int {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(summary))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 2 && f[0] == "meta" && f[1] == "objects:" {
			n, err := strconv.Atoi(f[2])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no meta objects line in:\n%s", summary)
	return 0
}

// TestDevFlags: dev honours --brokers, --gcs-endpoint and --temp-dir, and
// refuses what it cannot honour in one line.
func TestDevFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--brokers", "kafka.example:9092"}, `--brokers "kafka.example:9092": dev runs its own Kafka, on 127.0.0.1:PORT`},
		{[]string{"--brokers", "127.0.0.1:1,127.0.0.1:2"}, "dev runs its own Kafka"},
		{[]string{"--gcs-endpoint", "https://storage.example"}, "dev runs its own GCS emulator"},
		{[]string{"--kafka-tls"}, "dev's embedded Kafka has neither TLS nor SASL"},
		{[]string{"--heartbeat-interval", "0s"}, "--heartbeat-interval 0s: must be positive"},
	} {
		r := runConsumer(t, 20*time.Second, nil, append([]string{"dev", "--data-dir", t.TempDir()}, tc.args...)...)
		if r.code != 2 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("dev %v: exit %d, stderr %q; want exit 2 and one line with %q", tc.args, r.code, r.stderr, tc.want)
		}
	}

	free := func() string {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	data, temp, broker, gcs := t.TempDir(), filepath.Join(t.TempDir(), "temp"), free(), free()
	rd := testenv.StartRedis(t)
	r := runConsumer(t, 3*time.Minute, nil, "dev", "--data-dir", data, "--events", "300", "--redis-url", rd.URL,
		"--brokers", broker, "--gcs-endpoint", "http://"+gcs, "--temp-dir", temp)
	if r.code != 0 {
		t.Fatalf("dev: exit %d\n%s", r.code, r.stderr)
	}
	vars := envFile(t, filepath.Join(data, "env"))
	if vars["FLOWLOG_BROKERS"] != broker || vars["FLOWLOG_GCS_ENDPOINT"] != "http://"+gcs || vars["STORAGE_EMULATOR_HOST"] != gcs ||
		vars["FLOWLOG_REDIS_URL"] != rd.URL {
		t.Errorf("env file %v; want brokers %s, GCS %s, Redis %s", vars, broker, gcs, rd.URL)
	}
	if fi, err := os.Stat(temp); err != nil || !fi.IsDir() {
		t.Errorf("--temp-dir %s not used: %v", temp, err)
	}
	if _, err := os.Stat(filepath.Join(data, "temp")); !os.IsNotExist(err) {
		t.Errorf("dev made its own temp dir despite --temp-dir: %v", err)
	}
}

// TestDevRedactsRedisURL checks that dev logs the Redis URL it tried with the
// password redacted: a log is read by more people than the secret is meant
// for.
func TestDevRedactsRedisURL(t *testing.T) {
	const secret = "s3cret"
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	url := "redis://:" + secret + "@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/0"
	r := runConsumer(t, 3*time.Minute, nil, "dev", "--data-dir", t.TempDir(), "--events", "200", "--redis-url", url)
	if r.code != 0 {
		t.Fatalf("dev: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "redis://:xxxxx@127.0.0.1:"+strconv.Itoa(port)) {
		t.Errorf("dev does not log the URL it tried, redacted:\n%s", r.stderr)
	}
	if strings.Contains(r.stdout+r.stderr, secret) {
		t.Errorf("dev output leaks the Redis password:\n%s%s", r.stdout, r.stderr)
	}
}

// TestDevTypo: dev's command-line errors are one line too.
func TestDevTypo(t *testing.T) {
	r := runConsumer(t, 10*time.Second, nil, "dev", "--x")
	if r.code != 2 || r.stderr != "consumer dev: flag provided but not defined: -x (run 'consumer dev -h' for help)\n" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}
