package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestRestoreVerifyForeignObjects plants a meta whose data_path is another
// flow's data object and a chunk whose zstd frame declares a 512 MiB
// window: restore fails naming them, and verify reports them as faults.
func TestRestoreVerifyForeignObjects(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	// Another flow's cycle, listed as if it were f's.
	m, _ := sinktest.WriteCycle(t, e.Bucket, sinktest.Cycle{Prefix: "pre", Catalog: "default", Flow: "g", FlowID: 1, CycleID: "g1",
		ResolvedTS: e.TS(30 * time.Minute), Entries: []sinktest.Entry{sinktest.WritePut(1, 5, e.TS(29*time.Minute), e.TS(30*time.Minute), []byte("not f's"), true)}})
	m.Flow = "f"
	foreign := sink.MetaPath("pre", "default", "f", 1, e.TS(30*time.Minute), "foreign")
	e.PutObject(foreign, mustJSON(t, m))
	// A chunk declaring a 512 MiB window.
	raw := event.AppendEntry(nil, event.AppendDataKey(nil, event.RowKey(1, 6), e.TS(31*time.Minute)), []byte("x"))
	frame := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 19 << 3, byte(1 | len(raw)<<3), byte(len(raw) >> 5), 0}, raw...)
	data := sink.DataPath("pre", "default", "f", 1, e.TS(31*time.Minute), "window")
	e.PutObject(data, frame)
	sum := sha256.Sum256(raw)
	wm := sink.Meta{Version: 1, Flow: "f", FlowID: 1, CycleID: "window", DataPath: data, MinTS: e.TS(31 * time.Minute), MaxTS: e.TS(31 * time.Minute),
		Files: []sink.FileMeta{{Length: int64(len(frame)), RawLength: int64(len(raw)), Compression: "zstd", SHA256: hex.EncodeToString(sum[:]),
			NumberOfEntries: 1, MinTS: e.TS(31 * time.Minute), MaxTS: e.TS(31 * time.Minute), TableID: 1, CF: "write", Op: "put"}}}
	window := sink.MetaPath("pre", "default", "f", 1, e.TS(31*time.Minute), "window")
	e.PutObject(window, mustJSON(t, wm))

	for _, tc := range []struct {
		meta string
		want []string
	}{
		{foreign, []string{"meta " + foreign, `data_path "pre/default/g/v1/`, "lies outside the flow's directory pre/default/f/v1/"}},
		{window, []string{data, "window over the 8 MiB limit"}},
	} {
		t.Run(filepath.Base(tc.meta), func(t *testing.T) {
			rdb := e.Redis.Client(t)
			key := e.Store.Keys().Metas(1)
			if err := rdb.ZAdd(ctx, key, redis.Z{Score: float64(e.TS(30 * time.Minute)), Member: tc.meta}).Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.ZRem(ctx, key, tc.meta) })
			_, err := capture(t, func() error {
				return runRestore(ctx, e.Args("--flow", "f", "--out", t.TempDir(), "--temp-dir", t.TempDir(), "--max-memory", "64MiB"))
			})
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("restore = %v, want an error containing %q", err, w)
				}
			}
			stdout, err := capture(t, func() error { return runVerify(ctx, e.Args("--flow", "f")) })
			var exit exitError
			if !errors.As(err, &exit) || exit.code != 1 {
				t.Fatalf("verify = %v, want exit 1\n%s", err, stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, "FAULT: ") || !strings.Contains(stdout, w) {
					t.Errorf("verify output lacks a fault containing %q:\n%s", w, stdout)
				}
			}
		})
	}
}

// TestVerifyGroupAndLeftovers checks verify's view of the objects around
// the backup: with a --group whose checkpoint object does not exist it
// names the ones that do, and it counts unreferenced objects, naming
// consumer gc as the remedy.
func TestVerifyGroupAndLeftovers(t *testing.T) {
	e := backuptest.NewTimed(t)
	ctx := context.Background()
	stdout, err := capture(t, func() error { return runVerify(ctx, e.Args("--flow", "f")) })
	if err != nil || strings.Contains(stdout, "unreferenced") {
		t.Fatalf("verify of a clean backup = %v:\n%s", err, stdout)
	}

	// A fenced cycle's leftovers: a data object and a meta never listed.
	e.PutObject(sink.DataPath("pre", "default", "f", 1, e.TS(51*time.Minute), "fenced"), make([]byte, 3<<20))
	e.PutObject(sink.MetaPath("pre", "default", "f", 1, e.TS(51*time.Minute), "fenced"), []byte("{}"))
	stdout, err = capture(t, func() error { return runVerify(ctx, e.Args("--flow", "f")) })
	if err != nil {
		t.Fatalf("verify with leftovers = %v, want success:\n%s", err, stdout)
	}
	if !strings.Contains(stdout, "unreferenced: 2 objects (3.0 MiB) under pre/default/f/v1/") || !strings.Contains(stdout, "consumer gc removes them") {
		t.Errorf("verify does not report the leftovers:\n%s", stdout)
	}

	stdout, err = capture(t, func() error { return runVerify(ctx, e.Args("--flow", "f", "--group", "other")) })
	var exit exitError
	if !errors.As(err, &exit) || exit.code != 1 {
		t.Fatalf("verify --group other = %v, want exit 1\n%s", err, stdout)
	}
	want := "checkpoint object pre/default/f/v1/global_checkpoint/other-1.ts is missing (Redis has " + fmt.Sprint(e.TS(50*time.Minute)) +
		"), but global_checkpoint/ holds pre/default/f/v1/global_checkpoint/g1-1.ts: is --group the consumer's group?"
	if !strings.Contains(stdout, want) {
		t.Errorf("verify --group other does not name g1's checkpoint object:\n%s", stdout)
	}
}

// mustJSON is m as a meta object, unvalidated.
func mustJSON(t *testing.T, m sink.Meta) []byte {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
