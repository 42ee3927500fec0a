package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
)

// TestTruncateCommand: `consumer truncate` refuses without a snapshot
// (naming --until), prints its plan before it commits and deletes, pushes
// its metrics, changes nothing with --dry-run and nothing on a second run;
// flows shows the snapshot, the truncation point and the log after it.
func TestTruncateCommand(t *testing.T) {
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "t1", 7, 40, 10)
	s := h.MS(40*50*6/10+17, 0) // inside a cycle, 60% into the history
	until := fmt.Sprint(s + 1000)

	if _, err := runIn(t, h.Conn, "truncate", "--flow", "f", "--until", until); err == nil ||
		err.Error() != "flow default/f (id 1) has no listed snapshot at or below --until "+until+" (it has none): take one with 'consumer snapshot' first" {
		t.Fatalf("truncate without a snapshot: %v", err)
	}
	old := h.MS(300, 0)
	h.Snapshot(t, old)
	h.Snapshot(t, s)
	base := h.Baseline(t, h.RestoreTSs(s)...)
	before := h.StoredBytes(t)

	out, err := runIn(t, h.Conn, "truncate", "--flow", "f", "--until", until, "--dry-run")
	if err != nil || !strings.Contains(out, fmt.Sprintf("truncate flow default/f (id 1) before snapshot %d (%s): would remove ", s, tsTime(s))) ||
		!strings.Contains(out, "\nwould delete ") || h.StoredBytes(t) != before {
		t.Fatalf("truncate --dry-run: %v, stored %d -> %d bytes, stdout:\n%s", err, before, h.StoredBytes(t), out)
	}
	var (
		pushMu   sync.Mutex
		pushPath string
		pushBody []byte
	)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		pushMu.Lock()
		pushPath, pushBody = req.Method+" "+req.URL.Path, b
		pushMu.Unlock()
	}))
	defer gw.Close()
	r := runConsumer(t, 30*time.Second, nil, append(append([]string{"truncate"}, h.Conn...), "--flow", "f", "--until", until, "--metrics-push-url", gw.URL)...)
	if r.code != 0 {
		t.Fatalf("truncate: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	pushMu.Lock()
	if pushPath != "PUT /metrics/job/flowlog_truncate" || !bytes.Contains(pushBody, []byte("flowlog_op_objects")) {
		t.Errorf("metrics pushed as %q (%d bytes), want a PUT for job flowlog_truncate", pushPath, len(pushBody))
	}
	pushMu.Unlock()
	t.Logf("truncate:\n%s", r.stdout)
	plan, recorded := strings.Index(r.stdout, "will remove"), strings.Index(r.stdout, "recorded truncated_before = "+fmt.Sprint(s))
	if plan < 0 || recorded < plan || strings.Index(r.stdout, "deleted ") < recorded {
		t.Errorf("truncate did not print its plan, then its commit, then its deletes:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, " metas at or below the snapshot: "+sink.TruncateKeepDefault) {
		t.Errorf("truncate kept no meta for a prewritten value; the data should need some:\n%s", r.stdout)
	}
	h.CheckRestores(t, base)
	if out, err := runIn(t, h.Conn, "verify", "--flow", "f"); err != nil {
		t.Errorf("verify after truncate: %v, stdout:\n%s", err, out)
	}

	out, err = runIn(t, h.Conn, "flows", "--json")
	var rows []flowRow
	if jerr := json.Unmarshal([]byte(out), &rows); err != nil || jerr != nil || len(rows) != 1 {
		t.Fatalf("flows --json: %v, %v, stdout:\n%s", err, jerr, out)
	}
	var logAfter int64
	for _, m := range h.ListedMetas(t) {
		logAfter += backuptest.LogBytesAfter(m, s)
	}
	if fr := rows[0]; fr.SnapshotTS != s || fr.TruncatedBefore != s || fr.LogBytesAfterSnapshot == nil || *fr.LogBytesAfterSnapshot != logAfter {
		t.Errorf("flows row: snapshot %d, truncated before %d, log bytes %v; want %d, %d, %d", fr.SnapshotTS, fr.TruncatedBefore,
			fr.LogBytesAfterSnapshot, s, s, logAfter)
	}
	if out, _ = runIn(t, h.Conn, "flows"); !strings.Contains(out, "TRUNCATED BEFORE") || !strings.Contains(out, " KiB") {
		t.Errorf("flows table lacks the retention columns:\n%s", out)
	}

	stored := h.StoredBytes(t)
	out, err = runIn(t, h.Conn, "truncate", "--flow", "f", "--until", until)
	if err != nil || !strings.Contains(out, "deleted 0 objects") || h.StoredBytes(t) != stored {
		t.Errorf("second truncate: %v, stdout:\n%s", err, out)
	}
	if err := h.Store.AddSnapshot(context.Background(), 1, sink.SnapshotMetaPath(h.Prefix, "default", "f", 1, old)); err != nil {
		t.Fatal(err)
	}
	_, err = runIn(t, h.Conn, "truncate", "--flow", "f", "--until", fmt.Sprint(old+1))
	if want := fmt.Sprintf("flow default/f (id 1) is already truncated before %d (%s), past the snapshot at %d: nothing to do", s, tsTime(s), old); err == nil || err.Error() != want {
		t.Errorf("truncate below the truncation point: %v, want %q", err, want)
	}
}

// TestTruncateDryRunIsTheRun: with a snapshot.meta tampered to name objects
// of another prefix and of another flow, `truncate --dry-run` lists as
// "would delete" exactly what the run then deletes, none of those objects
// among them, and warns about the snapshot it leaves to gc.
func TestTruncateDryRunIsTheRun(t *testing.T) {
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "t2", 11, 30, 10)
	ctx := context.Background()
	old, s := h.MS(300, 0), h.MS(30*50*6/10, 0)
	h.Snapshot(t, old)
	h.Snapshot(t, s)
	// Objects the tampered snapshot.meta names: another deployment's and
	// another flow's.
	victims := []string{"elsewhere/default/f/v1/snapshot/x/1.snap", sink.SnapshotTablePath(h.Prefix, "default", "g", 2, old, 1)}
	for _, v := range victims {
		h.PutObject(v, []byte("not yours"))
	}
	oldMeta := sink.SnapshotMetaPath(h.Prefix, "default", "f", 1, old)
	raw, err := sink.EncodeSnapshotMeta(sink.SnapshotMeta{Version: 1, Flow: "default/f", FlowID: 1, TS: old,
		Tables: []sink.SnapshotTable{{TableID: 1, DataPath: victims[0], Since: 0}, {TableID: 2, DataPath: victims[1], Since: 0}}})
	if err != nil {
		t.Fatal(err)
	}
	h.PutObject(oldMeta, raw)

	until := fmt.Sprint(s)
	// Warnings go to stderr, the plan to stdout.
	stderr, out, err := captureStderr(t, func() error {
		return commands["truncate"].run(context.Background(), append(append([]string{}, h.Conn...), "--flow", "f", "--until", until, "--dry-run"))
	})
	if err != nil {
		t.Fatalf("truncate --dry-run: %v\n%s%s", err, stderr, out)
	}
	would := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(line, "would delete "); ok {
			name, _, _ = strings.Cut(name, " (")
			would[name] = true
		}
	}
	if !strings.Contains(stderr, "warning: snapshot "+oldMeta) || len(would) == 0 {
		t.Errorf("dry run names no warning about %s or nothing to delete:\n%s%s", oldMeta, stderr, out)
	}
	names := func() map[string]bool {
		got := map[string]bool{}
		if err := h.Bucket.Iter(ctx, "", func(n string) error { got[n] = true; return nil }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	before := names()
	for n := range would {
		if !before[n] {
			t.Errorf("the dry run would delete %s, which does not exist", n)
		}
	}
	if out, err = runIn(t, h.Conn, "truncate", "--flow", "f", "--until", until); err != nil {
		t.Fatalf("truncate: %v\n%s", err, out)
	}
	after := names()
	deleted := map[string]bool{}
	for n := range before {
		if !after[n] {
			deleted[n] = true
		}
	}
	if fmt.Sprint(deleted) != fmt.Sprint(would) {
		t.Errorf("the run deleted\n%v\nthe dry run said it would delete\n%v", deleted, would)
	}
	for _, v := range victims {
		if !after[v] || would[v] {
			t.Errorf("%s, named by a tampered snapshot.meta, deleted or listed as would delete", v)
		}
	}
}
