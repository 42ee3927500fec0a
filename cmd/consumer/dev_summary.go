//go:build !nodev

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
)

// devEnvFile is the file, in the data directory, that holds the addresses
// of a dev run's services as FLOWLOG_* variables.
const devEnvFile = "env"

// writeDevEnv writes DataDir/env: `export` lines of every FLOWLOG_*
// variable the consumer's commands and the producer need to reach this dev
// run's services, and STORAGE_EMULATOR_HOST for other GCS clients. It is
// private to the user (the Redis URL may hold a password).
func writeDevEnv(cfg devConfig) (string, error) {
	c := cfg.run.conn
	gcsHost := strings.TrimSuffix(strings.TrimPrefix(c.GCS.Endpoint, "http://"), "/")
	vars := []struct{ name, value string }{
		{cli.EnvName("brokers"), c.Kafka.Brokers},
		{cli.EnvName("apply-topic"), c.Kafka.ApplyTopic},
		{cli.EnvName("ddl-topic"), c.Kafka.DDLTopic},
		{cli.EnvName("dlq-topic"), c.Kafka.DLQTopic},
		{cli.EnvName("group"), c.Group},
		{cli.EnvName("redis-url"), c.Redis.URL},
		{cli.EnvName("redis-prefix"), c.Redis.Prefix},
		{cli.EnvName("gcs-endpoint"), c.GCS.Endpoint},
		{cli.EnvName("gcs-bucket"), c.GCS.Bucket},
		{cli.EnvName("gcs-prefix"), c.GCS.Prefix},
		{cli.EnvName("http-addr"), c.HTTPAddr},
		{"STORAGE_EMULATOR_HOST", gcsHost},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by 'consumer dev' at %s: the addresses of its services,\n", time.Now().UTC().Format(time.RFC3339))
	b.WriteString("# valid while it runs. `source` this file, then run consumer status, flows,\n# restore, verify and producer without connection flags.\n")
	for _, v := range vars {
		fmt.Fprintf(&b, "export %s=%s\n", v.name, shellQuote(v.value))
	}
	path := filepath.Join(cfg.DataDir, devEnvFile)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// readDevEnv reads the variables of an earlier run's env file; nil if
// there is none.
func readDevEnv(path string) map[string]string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok && !strings.HasPrefix(name, "#") {
			vars[name] = strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(v, "'"), "'"), `'\''`, "'")
		}
	}
	return vars
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// portFree reports whether 127.0.0.1:port can be listened on.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// selfCommand is how the operator runs the consumer and the producer:
// `go run ./cmd/...` under `go run`, else the consumer's own path and the
// producer beside it (or on PATH).
func selfCommand() (consumer, producer string) {
	exe := os.Args[0]
	if strings.Contains(filepath.ToSlash(exe), "/go-build") {
		return "go run ./cmd/consumer", "go run ./cmd/producer"
	}
	producer = "producer"
	if i := strings.LastIndexByte(exe, os.PathSeparator); i >= 0 {
		if _, err := os.Stat(exe[:i+1] + "producer"); err == nil {
			producer = exe[:i+1] + "producer" // "./producer" stays relative
		}
	}
	return exe, producer
}

// devSummary prints what the dev run backed up and where, and the commands
// to look at it. While dev still runs (running), the commands work now;
// after it stopped they need a dev run with --keep-running.
func devSummary(ctx context.Context, w io.Writer, cfg devConfig, store *meta.Store, gen *loadgen.Generator, envFile string, running bool) error {
	ck, id, err := demoCheckpoint(ctx, store)
	if err != nil {
		return fmt.Errorf("read the demo flow: %w", err)
	}
	metas, err := store.Metas(ctx, id)
	if err != nil {
		return err
	}
	gcs := cfg.run.conn.GCS
	root := filepath.Join(cfg.DataDir, "gcs", gcs.Bucket)
	var objects, bytes int64
	_ = filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			objects++
			bytes += fi.Size()
		}
		return nil
	})
	title := "flowlog dev run complete"
	if running {
		title = "flowlog dev: demo load backed up, still running"
	}
	fmt.Fprintf(w, `
%s
  demo load:      %d row mutations (%d events) on tables 1,2,3 over %d regions
  flow:           default/demo (id %d) on tables 1,2
  checkpoint:     %d (%s)
  meta objects:   %d referenced in Redis (%s)
  GCS objects:    %d files, %d bytes under %s
                  (fake-gcs-server's filesystem backend; layout v2 under %s/v2/, catalogs under <catalog>/<flow>/v1/catalog/; docs/FORMAT.md)
`, title, gen.Transactions(), gen.Events(), devRegions, id, ck, tsTime(ck),
		len(metas), store.Keys().Metas(id), objects, bytes, root, orDefault(gcs.Prefix, "<no prefix>"))
	if len(metas) > 0 {
		fmt.Fprintf(w, "  first meta:     gs://%s/%s\n", gcs.Bucket, metas[0].Path)
	}
	fmt.Fprintf(w, "  redis:          %s\n  environment:    %s\n", cli.RedactURL(cfg.run.conn.Redis.URL), envFile)
	consumer, producer := selfCommand()
	if running {
		fmt.Fprint(w, "\nnext, in another shell while this runs (Ctrl-C here stops it):\n")
	} else {
		fmt.Fprint(w, "\nnext: run it again with --keep-running (the same addresses are reused when free), then in another shell:\n")
	}
	brokers := cfg.run.conn.Kafka.Brokers
	for _, line := range []string{
		"source " + envFile,
		consumer + " status",
		consumer + " restore --flow demo --out ./demo-restore",
		consumer + " verify --flow demo",
		producer + " load --events 10000 --tables 1,2,3 --regions " + strconv.Itoa(devRegions) + " --heartbeat-every 4",
		"kcat -b " + brokers + " -L",
		"kcat -b " + brokers + " -C -t " + cfg.run.conn.Kafka.DDLTopic + " -e",
	} {
		fmt.Fprintf(w, "  %s\n", line)
	}
	return nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
