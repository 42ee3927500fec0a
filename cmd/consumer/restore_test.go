package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

func TestParseTS(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 15, 0, 0, time.UTC)
	last := func(t time.Time) uint64 { return event.ComposeTS(t.UnixMilli(), 1<<18-1) }
	for _, tc := range []struct {
		in     string
		want   uint64
		form   string
		errSub string
	}{
		{"431656320867237891", 431656320867237891, "", ""},
		{"2026-12-01T10:00:00Z", last(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)), "time", ""},
		{"2026-12-01T11:00:00.250+01:00", last(time.Date(2026, 12, 1, 10, 0, 0, 250e6, time.UTC)), "time", ""},
		{"-15m", last(now.Add(-15 * time.Minute)), "duration", ""},
		{"-1h30m", last(now.Add(-90 * time.Minute)), "duration", ""},
		{"15m", 0, "", "want a TSO"},
		{"+15m", 0, "", "must be negative"},
		{"0", 0, "", "not a TSO"},
		{"18446744073709551616", 0, "", "not a TSO"},
		{"yesterday", 0, "", "an RFC 3339 time (2026-12-01T10:00:00Z) or a negative duration (-15m)"},
		{"2026-12-01 10:00", 0, "", "want a TSO"},
		{"1960-01-01T00:00:00Z", 0, "", "outside the range of a TSO"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			ts, form, err := parseTS(tc.in, now)
			if tc.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("parseTS(%q) = %d, %v; want error containing %q", tc.in, ts, err, tc.errSub)
				}
				return
			}
			if err != nil || ts != tc.want || form != tc.form {
				t.Fatalf("parseTS(%q) = %d, %q, %v; want %d, %q", tc.in, ts, form, err, tc.want, tc.form)
			}
		})
	}
}

var asOfRE = regexp.MustCompile(`(?m)^restored flow default/f \(id 1\) as of (\d+) `)

// restoredAsOf returns the TSO the restore output says it used.
func restoredAsOf(t *testing.T, stdout string) uint64 {
	t.Helper()
	m := asOfRE.FindStringSubmatch(stdout)
	if m == nil {
		t.Fatalf("no %q line in:\n%s", asOfRE, stdout)
	}
	ts, _ := strconv.ParseUint(m[1], 10, 64)
	return ts
}

// TestRestoreCommand: `consumer restore` takes --ts as a TSO, a time or a
// duration ago and says which TSO a time became, prints what it restored,
// names on stderr each table it leaves out, and words a refusal with the
// flags that change it.
func TestRestoreCommand(t *testing.T) {
	e := backuptest.NewTimed(t)
	rfc := func(d time.Duration) string { return e.Base.Add(d).UTC().Format(time.RFC3339Nano) }
	lastOf := func(d time.Duration) uint64 { return e.TS(d) | (1<<18 - 1) }
	early := []string{backuptest.Row(1, 1, "early", e.TS(5*time.Minute))}
	nine := []string{backuptest.Row(2, 9, "nine", e.TS(6*time.Minute))}
	late := []string{backuptest.Row(1, 1, "late", e.TS(48*time.Minute))}
	for _, tc := range []struct {
		name   string
		args   []string
		asOf   uint64 // 0: not checked
		told   bool   // prints "--ts X is TSO N"
		tables map[string][]string
		errSub string
	}{
		{"default checkpoint", nil, e.TS(50 * time.Minute), false, map[string][]string{"1": late, "2": nine}, ""},
		{"tso", []string{"--ts", fmt.Sprint(e.TS(6 * time.Minute))}, e.TS(6 * time.Minute), false, map[string][]string{"1": early, "2": nine}, ""},
		{"rfc 3339", []string{"--ts", rfc(20 * time.Minute)}, lastOf(20 * time.Minute), true, map[string][]string{"1": early, "2": nine}, ""},
		{"duration ago", []string{"--ts", "-15m"}, 0, true, map[string][]string{"1": early, "2": nine}, ""},
		{"time before data", []string{"--ts", rfc(-time.Minute)}, 0, false, nil,
			fmt.Sprintf("is before the first backed-up write record of flow default/f at %d (%s): nothing to restore", e.TS(5*time.Minute), tsTime(e.TS(5*time.Minute)))},
		{"tables before data", []string{"--ts", fmt.Sprint(e.TS(5 * time.Minute)), "--tables", "2"}, 0, false, nil,
			"is before the first backed-up write record of tables 2 of flow default/f at " + fmt.Sprint(e.TS(6*time.Minute))},
		{"past checkpoint", []string{"--ts", "-1m"}, 0, false, nil, "is past the flow's checkpoint " + fmt.Sprint(e.TS(50*time.Minute))},
		{"positive duration", []string{"--ts", "15m"}, 0, false, nil, "want a TSO"},
		{"unknown flow", []string{"--flow", "nope"}, 0, false, nil, "no flow default/nope (use --flow-id for a dropped flow)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := []string{"--out", out, "--temp-dir", t.TempDir()}
			if !slices.Contains(tc.args, "--flow") {
				args = append(args, "--flow", "f")
			}
			stdout, err := runIn(t, e.Conn, "restore", append(args, tc.args...)...)
			if tc.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("restore = %v, want error containing %q\n%s", err, tc.errSub, stdout)
				}
				return
			}
			if err != nil {
				t.Fatalf("restore: %v\n%s", err, stdout)
			}
			asOf := restoredAsOf(t, stdout)
			if tc.asOf != 0 && asOf != tc.asOf {
				t.Errorf("restored as of %d, want %d", asOf, tc.asOf)
			}
			if !strings.Contains(stdout, "2 tables, 2 keys, ") || !strings.Contains(stdout, " MiB/s)") {
				t.Errorf("no summary line:\n%s", stdout)
			}
			var tsArg string
			if i := slices.Index(tc.args, "--ts"); i >= 0 {
				tsArg = tc.args[i+1]
			}
			if told := fmt.Sprintf("--ts %s is TSO %d (", tsArg, asOf); tc.told != strings.Contains(stdout, "--ts ") || tc.told && !strings.Contains(stdout, told) {
				t.Errorf("output mentions %q: %v, want %v:\n%s", told, !tc.told, tc.told, stdout)
			}
			for table, want := range tc.tables {
				if got := backuptest.ReadTable(t, filepath.Join(out, table+".jsonl")); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("table %s: got %v, want %v", table, got, want)
				}
			}
		})
	}

	// Table 2's window ended at 5m30s: left out at 30m, named on stderr, as
	// verify and flows show its window.
	until2 := e.TS(5*time.Minute + 30*time.Second)
	if err := e.Redis.Client(t).HSet(context.Background(), meta.NewKeys("flowlog").Coverage(1), "2", fmt.Sprintf(`{"since":0,"until":%d}`, until2)).Err(); err != nil {
		t.Fatal(err)
	}
	stderr, stdout, err := captureStderr(t, func() error {
		return runRestore(context.Background(), e.Args("--flow", "f", "--out", t.TempDir(), "--temp-dir", t.TempDir(), "--ts", fmt.Sprint(e.TS(30*time.Minute))))
	})
	want := fmt.Sprintf("left out table 2: no coverage window holds %s; its windows are [0, %s]\n", tsText(e.TS(30*time.Minute)), tsText(until2))
	if err != nil || stderr != want {
		t.Errorf("restore at 30m = %v, stderr %q, want %q\n%s", err, stderr, want, stdout)
	}
	vout, err := runIn(t, e.Conn, "verify", "--flow", "f")
	if want := fmt.Sprintf("table 2: coverage window [0, %d (%s)]", until2, tsTime(until2)); err != nil || !strings.Contains(vout, want) {
		t.Errorf("verify = %v, does not show %q:\n%s", err, want, vout)
	}
	fout, err := runIn(t, e.Conn, "flows")
	if want := fmt.Sprintf("1:[0, now] 2:[0, %d (%s)]", until2, tsTime(until2)); err != nil || !strings.Contains(fout, want) {
		t.Errorf("flows = %v, does not show %q:\n%s", err, want, fout)
	}
}

// TestRestoreOutDirFlag checks --out and --force on the command line: a
// non-empty directory is refused with a hint, and with --force a planted
// link to a victim file is replaced, not written through.
func TestRestoreOutDirFlag(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	out, victim := t.TempDir(), filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(out, "1.jsonl")); err != nil {
		t.Fatal(err)
	}
	args := e.Args("--flow", "f", "--out", out, "--temp-dir", t.TempDir())
	_, err := capture(t, func() error { return runRestore(ctx, args) })
	if err == nil || !strings.Contains(err.Error(), "--out "+out+" is not empty: pass --force") {
		t.Fatalf("restore into a non-empty --out = %v", err)
	}
	if stdout, err := capture(t, func() error { return runRestore(ctx, append(args, "--force")) }); err != nil {
		t.Fatalf("restore --force: %v\n%s", err, stdout)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the link's target is now %q", b)
	}
	fi, err := os.Lstat(filepath.Join(out, "1.jsonl"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("1.jsonl: %v, %v; want a regular file of mode 0600", fi, err)
	}
	if got := backuptest.ReadTable(t, filepath.Join(out, "1.jsonl")); len(got) != 1 || !strings.Contains(got[0], "=late@") {
		t.Fatalf("table 1: %v", got)
	}
}

// TestRestoreSelectionFlags: a key range that is not hex, or that holds no
// key, is a usage error (exit 2) named by its flag, before anything is read.
func TestRestoreSelectionFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--start-key", "7x"}, `--start-key: "7x" is not a hex raw key`},
		{[]string{"--end-key", "748"}, `--end-key: "748" is not a hex raw key`},
		{[]string{"--start-key", "7480", "--end-key", "7480"}, "--start-key 7480 is not before --end-key 7480"},
		{[]string{"--start-key", "7481", "--end-key", "7480"}, "--start-key 7481 is not before --end-key 7480"},
		{[]string{"--tables", "1", "--start-key", backuptest.RowHex(2, 0)}, "table 1 has no key in"},
	} {
		args := append([]string{"restore", "--flow", "f", "--out", t.TempDir()}, tc.args...)
		r := runConsumer(t, time.Minute, nil, args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
