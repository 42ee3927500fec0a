package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
)

// decodeOne decodes out as exactly one JSON document: --json prints that
// and nothing else on stdout.
func decodeOne(t *testing.T, what, out string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	var doc any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: stdout is not JSON: %v\n%s", what, err, out)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		t.Fatalf("%s: more than one JSON document on stdout:\n%s", what, out)
	}
	return doc
}

// jsonKeys are the object keys of doc, at every depth, except the keys of
// maps keyed by data (gc's flows, truncate's kept reasons).
func jsonKeys(doc any, skip map[string]bool, keys map[string]bool) {
	switch v := doc.(type) {
	case map[string]any:
		for k, e := range v {
			keys[k] = true
			if skip[k] {
				if m, ok := e.(map[string]any); ok {
					for _, inner := range m {
						jsonKeys(inner, skip, keys)
					}
				}
				continue
			}
			jsonKeys(e, skip, keys)
		}
	case []any:
		for _, e := range v {
			jsonKeys(e, skip, keys)
		}
	}
}

// documentedKeys are the backticked names of the "### consumer <cmd>
// --json" section of docs/SCRIPTING.md and of the section's preamble (the
// shapes every document shares).
func documentedKeys(t *testing.T, cmd string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile("../../docs/SCRIPTING.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "## JSON output")
	sec := strings.Index(doc, "### consumer "+cmd+" --json")
	if start < 0 || sec < 0 {
		t.Fatalf("docs/SCRIPTING.md has no section for consumer %s --json", cmd)
	}
	upto := func(from int) string { // from from to the next subsection
		if end := strings.Index(doc[from+1:], "\n### "); end >= 0 {
			return doc[from : from+1+end]
		}
		return doc[from:]
	}
	text := upto(start) + upto(sec)
	keys := map[string]bool{}
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(text, -1) {
		for _, f := range regexp.MustCompile(`[a-z_]+`).FindAllString(m[1], -1) {
			keys[f] = true
		}
	}
	return keys
}

// TestJSONOutputs runs every command that reports with --json and checks
// that stdout is one JSON document whose values are the command's result,
// and that every field it has is documented in docs/SCRIPTING.md, "JSON
// output".
func TestJSONOutputs(t *testing.T) {
	e := backuptest.NewTimed(t)
	ckpt, snapTS := e.TS(50*time.Minute), e.TS(50*time.Minute)
	run := func(cmd string, args ...string) map[string]any {
		t.Helper()
		conn := e.Conn
		if cmd == "version" {
			conn = nil
		}
		out, err := runIn(t, conn, cmd, append(args, "--json")...)
		if err != nil {
			t.Fatalf("%s --json: %v\n%s", cmd, err, out)
		}
		doc := decodeOne(t, cmd, out)
		keys := map[string]bool{}
		jsonKeys(doc, map[string]bool{"flows": cmd == "gc", "kept_below_snapshot": true}, keys)
		documented := documentedKeys(t, cmd)
		for k := range keys {
			if !documented[k] {
				t.Errorf("consumer %s --json has field %q, which docs/SCRIPTING.md does not name", cmd, k)
			}
		}
		m, _ := doc.(map[string]any)
		return m
	}
	num := func(v any) uint64 { f, _ := v.(float64); return uint64(f) }
	get := func(doc map[string]any, path ...string) any {
		var v any = doc
		for _, p := range path {
			m, _ := v.(map[string]any)
			v = m[p]
		}
		return v
	}

	out := t.TempDir()
	r := run("restore", "--flow", "f", "--out", out, "--force", "--temp-dir", t.TempDir())
	if get(r, "flow", "name") != "f" || num(get(r, "flow", "id")) != 1 || num(get(r, "as_of", "ts")) != ckpt ||
		get(r, "as_of", "time") != tsTime(ckpt) || get(r, "out") != out || num(r["tables"]) != 2 || num(r["keys"]) != 2 {
		t.Errorf("restore --json: %v", r)
	}
	if l, ok := r["left_out"].([]any); !ok || len(l) != 0 {
		t.Errorf("restore --json: left_out %v, want []", r["left_out"])
	}
	if sel := fmt.Sprint(r["selection"]); sel != "map[end_key: start_key: tables:[]]" {
		t.Errorf("restore --json: selection %s, want every table and key", sel)
	}
	r = run("restore", "--flow", "f", "--out", t.TempDir(), "--temp-dir", t.TempDir(), "--tables", "2,1", "--start-key", backuptest.RowHex(1, 2))
	if sel := fmt.Sprint(r["selection"]); num(r["tables"]) != 2 || num(r["keys"]) != 1 || sel != "map[end_key: start_key:"+backuptest.RowHex(1, 2)+" tables:[1 2]]" {
		t.Errorf("restore --json of tables 2,1 from row (1,2): %v", r)
	}

	s := run("snapshot", "--flow", "f", "--temp-dir", t.TempDir())
	wantPath := fmt.Sprintf("pre/default/f/v1/snapshot/%020d-1/snapshot.meta", snapTS)
	if get(s, "meta_path") != wantPath || num(get(s, "as_of", "ts")) != snapTS || num(s["objects"]) != 3 || num(s["tables"]) != 2 {
		t.Errorf("snapshot --json: %v", s)
	}

	tr := run("truncate", "--flow", "f", "--until", fmt.Sprint(snapTS), "--dry-run")
	if get(tr, "dry_run") != true || num(get(tr, "snapshot", "ts")) != snapTS || num(tr["deleted"]) != 0 {
		t.Errorf("truncate --dry-run --json: %v", tr)
	}
	for _, o := range tr["objects"].([]any) {
		if num(get(o.(map[string]any), "size")) == 0 {
			t.Errorf("truncate plan lists an object of 0 bytes: %v", o)
		}
	}

	g := run("gc", "--grace", "0s", "--dry-run")
	if get(g, "dry_run") != true || num(g["listed_objects"]) == 0 || get(g, "bucket") != testenv.Bucket || get(g, "flows", "default/f") == nil {
		t.Errorf("gc --dry-run --json: %v", g)
	}

	v := run("verify", "--flow", "f")
	if get(v, "ok") != true || num(v["redis_checkpoint_ts"]) != ckpt {
		t.Errorf("verify --json: %v", v)
	}
	run("version")

	// flows is a list: its elements' fields.
	fout, err := runIn(t, e.Conn, "flows", "--json")
	if err != nil {
		t.Fatal(err)
	}
	keys, documented := map[string]bool{}, documentedKeys(t, "flows")
	jsonKeys(decodeOne(t, "flows", fout), nil, keys)
	for k := range keys {
		if !documented[k] {
			t.Errorf("consumer flows --json has field %q, which docs/SCRIPTING.md does not name", k)
		}
	}
	if !bytes.Contains([]byte(fout), []byte(`"checkpoint_ts": `+fmt.Sprint(ckpt))) {
		t.Errorf("flows --json lacks the checkpoint:\n%s", fout)
	}
}
