package sink

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/flowlog/flowlog/event"
)

// TestAppendRaw checks appendRaw against event.DecodeBytes for raw keys of
// every length around the group size, including zero bytes that look like
// padding.
func TestAppendRaw(t *testing.T) {
	for n := range 26 {
		for _, fill := range []byte{0, 0xff, 'a'} {
			t.Run(fmt.Sprintf("%d-%x", n, fill), func(t *testing.T) {
				raw := bytes.Repeat([]byte{fill}, n)
				enc := event.EncodeBytes(nil, raw)
				want, _, err := event.DecodeBytes(enc)
				if err != nil {
					t.Fatal(err)
				}
				if got := appendRaw([]byte("x"), enc); !bytes.Equal(got, append([]byte("x"), want...)) {
					t.Fatalf("appendRaw = %x, want x%x", got, want)
				}
			})
		}
	}
}

// TestCreateOutRefusesLinks checks that a table file is never created
// through a symbolic link that appears after the output directory was
// prepared, whether it points at a file or nowhere.
func TestCreateOutRefusesLinks(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	victim := filepath.Join(other, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	for id, target := range map[int64]string{1: victim, 2: filepath.Join(other, "created")} {
		if err := os.Symlink(target, filepath.Join(dir, fmt.Sprintf("%d.jsonl", id))); err != nil {
			t.Fatal(err)
		}
		if f, err := createOut(dir, id); err == nil {
			f.Close()
			t.Fatalf("createOut of table %d through a link to %s succeeded", id, target)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("victim is now %q", b)
	}
	if _, err := os.Lstat(filepath.Join(other, "created")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dangling link's target was created (%v)", err)
	}
}
