package sink_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// TestRestoreOutDir checks how Restore treats OutDir: a new one is 0700 with
// 0600 files; a non-empty one is refused without Force; with Force, a
// <table_id>.jsonl that is a symbolic link is replaced, never written
// through, and other entries stay.
func TestRestoreOutDir(t *testing.T) {
	ctx := context.Background()
	b := sink.NewMemBucket()
	metas := []string{writeBackup(t, b, "c1", "none", []kv{wput(1, 1, 10, 9, "a"), wput(2, 1, 11, 10, "b")})}
	restore := func(out string, force bool) error {
		_, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: 100, OutDir: out, Force: force, TempDir: t.TempDir()})
		return err
	}
	want := map[string][]string{"1": {"1=a@10"}, "2": {"1=b@11"}}
	checkOut := func(t *testing.T, out string) {
		t.Helper()
		for _, table := range []string{"1", "2"} {
			fi, err := os.Lstat(filepath.Join(out, table+".jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s.jsonl: mode %v, want a regular file of mode 0600", table, fi.Mode())
			}
		}
		if got := readTables(t, out); len(got) != 2 || got["1"][0] != want["1"][0] || got["2"][0] != want["2"][0] {
			t.Errorf("restored %v, want %v", got, want)
		}
	}

	t.Run("new dir", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "a", "out")
		if err := restore(out, false); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("out dir mode %v, want 0700", fi.Mode().Perm())
		}
		checkOut(t, out)
	})

	// victim is a file a link in out points at; it must stay as it is.
	setup := func(t *testing.T) (out, victim string) {
		out, victim = t.TempDir(), filepath.Join(t.TempDir(), "victim")
		if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, filepath.Join(out, "1.jsonl")); err != nil {
			t.Fatal(err)
		}
		// A dangling link: following it would create its target.
		if err := os.Symlink(filepath.Join(filepath.Dir(victim), "created"), filepath.Join(out, "2.jsonl")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, "notes.txt"), []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		return out, victim
	}
	checkVictim := func(t *testing.T, victim string) {
		t.Helper()
		if b, err := os.ReadFile(victim); err != nil || string(b) != "precious" {
			t.Errorf("victim is now %q (%v)", b, err)
		}
		if _, err := os.Lstat(filepath.Join(filepath.Dir(victim), "created")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dangling link's target was created (%v)", err)
		}
	}

	t.Run("non-empty without force", func(t *testing.T) {
		out, victim := setup(t)
		if err := restore(out, false); !errors.Is(err, sink.ErrOutDirNotEmpty) {
			t.Fatalf("restore into a non-empty dir = %v, want ErrOutDirNotEmpty", err)
		}
		checkVictim(t, victim)
		if fi, err := os.Lstat(filepath.Join(out, "1.jsonl")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("1.jsonl is no longer the link (%v, %v)", fi, err)
		}
	})

	t.Run("non-empty with force", func(t *testing.T) {
		out, victim := setup(t)
		if err := restore(out, true); err != nil {
			t.Fatal(err)
		}
		checkVictim(t, victim)
		checkOut(t, out)
		if b, err := os.ReadFile(filepath.Join(out, "notes.txt")); err != nil || string(b) != "keep" {
			t.Errorf("notes.txt: %q, %v", b, err)
		}
	})

	t.Run("stale table files with force", func(t *testing.T) {
		out := t.TempDir()
		if err := os.WriteFile(filepath.Join(out, "7.jsonl"), []byte("old restore\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := restore(out, true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(filepath.Join(out, "7.jsonl")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("7.jsonl of an earlier restore stayed (%v)", err)
		}
		checkOut(t, out)
	})
}

// TestRestoreInterruptedLeavesOutDir checks that a restore whose context
// ends mid-way (an operator's Ctrl-C) leaves OutDir as it was before the
// run: a directory it created is removed, and with Force the earlier
// restore's files (one of which this run would replace) stay as they were,
// with no staging directory left behind; the sort files go with the temp
// dir.
func TestRestoreInterruptedLeavesOutDir(t *testing.T) {
	b := sink.NewMemBucket()
	var metas []string
	for i := range 4 {
		metas = append(metas, writeBackup(t, b, fmt.Sprintf("c%d", i), "none",
			[]kv{wput(1, int64(i), uint64(10+i), uint64(9+i), "a"), wput(2, int64(i), uint64(20+i), uint64(19+i), "b")}))
	}
	restore := func(t *testing.T, out string, force bool) error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		tmp := t.TempDir()
		_, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: b, Flow: testFlow, MetaPaths: metas, TS: 100, OutDir: out, Force: force,
			TempDir: tmp, Parallel: 1, Progress: func(sink.RestoreProgress) { cancel() }})
		if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
			t.Errorf("temp dir holds %d entries after the restore (%s, ...)", len(ents), ents[0].Name())
		}
		return err
	}
	t.Run("new dir", func(t *testing.T) {
		parent := t.TempDir()
		out := filepath.Join(parent, "a", "out")
		if err := restore(t, out, false); !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted restore = %v, want context.Canceled", err)
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 0 {
			t.Errorf("the restore left %s/%s behind", parent, ents[0].Name())
		}
	})
	t.Run("force", func(t *testing.T) {
		out := t.TempDir()
		old := map[string]string{"1.jsonl": "earlier restore\n", "9.jsonl": "earlier restore of table 9\n", "notes.txt": "keep"}
		for name, body := range old {
			if err := os.WriteFile(filepath.Join(out, name), []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := restore(t, out, true); !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted restore = %v, want context.Canceled", err)
		}
		ents, _ := os.ReadDir(out)
		if len(ents) != len(old) {
			t.Errorf("--out holds %d entries after the interrupted restore, want the %d it had", len(ents), len(old))
		}
		for name, body := range old {
			if got, err := os.ReadFile(filepath.Join(out, name)); err != nil || string(got) != body {
				t.Errorf("%s is %q (%v), want it unchanged: %q", name, got, err, body)
			}
		}
	})
}
