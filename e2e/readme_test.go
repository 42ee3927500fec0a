package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// readmeKcat is the README's kcat example: the shell lines of its indented
// block, the restored line it promises, and the ts its text names.
type readmeKcat struct {
	shell, restored string
	commit, start   uint64
}

func readReadmeKcat(t *testing.T) readmeKcat {
	t.Helper()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var r readmeKcat
	lines := strings.Split(string(raw), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "      kcat -P ") && i > 0 && strings.HasPrefix(lines[i-1], "    echo '") {
			r.shell = strings.TrimSpace(lines[i-1]) + "\n" + strings.TrimSpace(l)
		}
		if strings.HasPrefix(l, `    {"key":"`) {
			r.restored = strings.TrimSpace(l)
		}
	}
	text := strings.Join(strings.Fields(string(raw)), " ")
	num := func(re string) uint64 {
		m := regexp.MustCompile(re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("README does not say %q", re)
		}
		n, _ := strconv.ParseUint(m[1], 10, 64)
		return n
	}
	r.commit, r.start = num(`inverted commit ts (\d+)`), num(`the start ts (\d+)`)
	if r.shell == "" || r.restored == "" {
		t.Fatalf("README has no kcat example block (echo ... | kcat -P ...) or no restored line")
	}
	return r
}

// TestReadmeKcatExample runs the README's kcat lines as written (only the
// broker address replaced) against a real broker and a consumer with a
// flow on table 1, and checks what the README says of them: the record
// decodes as a put of row 1 of table 1 at the commit and start ts the text
// names, nothing goes to the DLQ, and a restore holds exactly the line the
// README shows.
func TestReadmeKcatExample(t *testing.T) {
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatalf("kcat not found (%v): install the Debian package kcat (.ci/run does)", err)
	}
	ex := readReadmeKcat(t)

	// What the record says, decoded by flowlog's own decoder.
	js := ex.shell[strings.Index(ex.shell, "'")+1 : strings.LastIndex(ex.shell, "'")]
	var b event.Batch
	if err := event.DecodeBatch(&b, []byte(js), "application/json"); err != nil || len(b.Events) != 1 {
		t.Fatalf("the README's record does not decode: %v (%d events)", err, len(b.Events))
	}
	raw, ts, err := event.DecodeDataKey(b.Events[0].Key)
	if err != nil || string(raw) != string(event.RowKey(1, 1)) || ts != ex.commit {
		t.Errorf("key: raw %x at ts %d (%v), want row 1 of table 1 at %d", raw, ts, err, ex.commit)
	}
	w, err := event.DecodeWrite(b.Events[0].Value)
	if err != nil || w.Type != event.WritePut || w.StartTS != ex.start || string(w.ShortValue) != "hello" {
		t.Errorf("value: %+v (%v), want a put started at %d of %q", w, err, ex.start, "hello")
	}
	if b.ResolvedTS <= ex.commit {
		t.Errorf("resolved ts %d is not after the commit ts %d", b.ResolvedTS, ex.commit)
	}

	// Run as written.
	c := startCluster(t, 2)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "k", "--tables", "1")
	cons := c.startConsumer(t, "consumer-1")
	shell := strings.ReplaceAll(ex.shell, "127.0.0.1:9092", c.Broker.Addr)
	shell = strings.Replace(shell, "kcat -P", kcat+" -P", 1)
	if out, err := exec.Command("sh", "-c", shell).CombinedOutput(); err != nil {
		t.Fatalf("the README's kcat lines: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFlowCheckpoint(ctx, t, meta.NewStore(c.Redis.Client(t), "flowlog", nil), "k", b.ResolvedTS, 45*time.Second)
	metrics, err := httpGet("http://" + cons.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^flowlog_events_total\{[^}]*result="dlq"[^}]*\} [1-9]`).FindString(metrics); m != "" {
		t.Errorf("the record went to the DLQ: %s", m)
	}
	out := t.TempDir()
	if r := restoreRun(t, c, "restore", "--flow", "k", "--out", out, "--force", "--temp-dir", t.TempDir()); r.code != 0 {
		t.Fatalf("restore: exit %d:\n%s", r.code, r.out)
	}
	got, err := os.ReadFile(filepath.Join(out, "1.jsonl"))
	if err != nil || strings.TrimSpace(string(got)) != ex.restored {
		t.Errorf("1.jsonl is %q (%v), the README promises %q", got, err, ex.restored)
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}
