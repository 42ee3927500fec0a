package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
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

// timedEnv is flow "default/f" (id 1) with cycles at real TSOs around base,
// an hour ago: a put of row (1,1) = "early" at base+5m and (2,9) = "nine" at
// base+6m, then (1,1) = "late" at base+48m, checkpointed at base+50m.
type timedEnv struct {
	base   time.Time
	redis  *testenv.Redis
	gcs    *testenv.GCS
	store  *meta.Store
	bucket sink.Bucket
	lease  meta.Lease
	conn   []string
	cycles int
}

func newTimedEnv(t *testing.T) *timedEnv {
	ctx := context.Background()
	e := &timedEnv{base: time.Now().Add(-time.Hour).Truncate(time.Millisecond), redis: testenv.StartRedis(t), gcs: testenv.StartGCS(t)}
	e.store = meta.NewStore(e.redis.Client(t), "flowlog", nil)
	e.conn = []string{"--redis-url", e.redis.URL, "--gcs-endpoint", e.gcs.Endpoint(), "--gcs-bucket", testenv.Bucket,
		"--gcs-prefix", "pre", "--group", "g1"}
	info := meta.FlowInfo{CatalogName: "default", FlowName: "f", SourceTableIDs: []uint32{1, 2},
		SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "out"}, FlownodeIDs: map[uint32]uint64{0: 1}}
	if err := e.store.CreateFlow(ctx, 1, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	b, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: e.gcs.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	e.bucket = b
	if e.lease, err = e.store.AcquireLease(ctx, "flowlog.apply", 0, "member-1"); err != nil {
		t.Fatal(err)
	}
	openWindows(t, e.store, e.lease)
	e.commit(t, 10*time.Minute, sinktest.WritePut(1, 1, e.ts(4*time.Minute), e.ts(5*time.Minute), []byte("early"), true),
		sinktest.WritePut(2, 9, e.ts(5*time.Minute), e.ts(6*time.Minute), []byte("nine"), true))
	e.commit(t, 50*time.Minute, sinktest.WritePut(1, 1, e.ts(47*time.Minute), e.ts(48*time.Minute), []byte("late"), true))
	return e
}

// ts is the TSO of base+d.
func (e *timedEnv) ts(d time.Duration) uint64 { return event.ComposeTS(e.base.Add(d).UnixMilli(), 0) }

// commit writes and commits a cycle of entries resolved at base+resolved and
// advances the flow's checkpoint there, as the consumer does.
func (e *timedEnv) commit(t *testing.T, resolved time.Duration, entries ...sinktest.Entry) {
	t.Helper()
	ctx := context.Background()
	rts := e.ts(resolved)
	off := int64(e.cycles)
	e.cycles++
	c := sinktest.Cycle{Prefix: "pre", Catalog: "default", Flow: "f", FlowID: 1, CycleID: fmt.Sprintf("c%d", e.cycles), ResolvedTS: rts,
		Entries: entries, Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: off, To: off + 1}}}
	_, path := sinktest.WriteCycle(t, e.bucket, c)
	err := e.store.Commit(ctx, meta.Commit{
		Leases:     []meta.Lease{e.lease},
		Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: off + 1, Checkpoint: rts, HasCheckpoint: true}},
		Metas:      []meta.MetaRef{{FlowID: 1, Path: path, MinResolvedTS: rts}},
		Flows:      []meta.FlowID{1}, LastFlushTS: rts,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.AdvanceCheckpoint(ctx, 1, rts); err != nil {
		t.Fatal(err)
	}
	cp := sink.EncodeCheckpoint(rts)
	e.gcs.CreateObject(fakeObject(sink.CheckpointPath("pre", "default", "f", "g1", 1), cp))
}

func (e *timedEnv) args(extra ...string) []string {
	return append(append([]string{}, e.conn...), extra...)
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

func TestRestoreTSForms(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	rfc := func(d time.Duration) string { return e.base.Add(d).UTC().Format(time.RFC3339Nano) }
	lastOf := func(d time.Duration) uint64 { return e.ts(d) | (1<<18 - 1) }
	early := []string{rowHex(1, 1) + "=early@" + fmt.Sprint(e.ts(5*time.Minute))}
	nine := []string{rowHex(2, 9) + "=nine@" + fmt.Sprint(e.ts(6*time.Minute))}
	late := []string{rowHex(1, 1) + "=late@" + fmt.Sprint(e.ts(48*time.Minute))}
	for _, tc := range []struct {
		name   string
		ts     string
		asOf   uint64 // 0: not checked
		told   bool   // prints "--ts X is TSO N"
		tables map[string][]string
		errSub string
	}{
		{"default checkpoint", "", e.ts(50 * time.Minute), false, map[string][]string{"1": late, "2": nine}, ""},
		{"tso", fmt.Sprint(e.ts(6 * time.Minute)), e.ts(6 * time.Minute), false, map[string][]string{"1": early, "2": nine}, ""},
		{"rfc 3339", rfc(20 * time.Minute), lastOf(20 * time.Minute), true, map[string][]string{"1": early, "2": nine}, ""},
		{"duration ago", "-15m", 0, true, map[string][]string{"1": early, "2": nine}, ""},
		{"tso before data", fmt.Sprint(e.ts(time.Minute)), 0, false, nil,
			fmt.Sprintf("is before the first backed-up write record of flow default/f at %d (%s): nothing to restore", e.ts(5*time.Minute), tsTime(e.ts(5*time.Minute)))},
		{"time before data", rfc(-time.Minute), 0, false, nil, "is before the first backed-up write record of flow default/f"},
		{"duration before data", "-3h", 0, false, nil, "is before the first backed-up write record of flow default/f"},
		{"tables before data", fmt.Sprint(e.ts(5 * time.Minute)), 0, false, nil, "is before the first backed-up write record of tables 2 of flow default/f at " + fmt.Sprint(e.ts(6*time.Minute))},
		{"past checkpoint", "-1m", 0, false, nil, "is past the flow's checkpoint " + fmt.Sprint(e.ts(50*time.Minute))},
		{"positive duration", "15m", 0, false, nil, "want a TSO"},
		{"garbage", "noon", 0, false, nil, "an RFC 3339 time (2026-12-01T10:00:00Z) or a negative duration (-15m)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			args := e.args("--flow", "f", "--out", out, "--temp-dir", t.TempDir())
			if tc.ts != "" {
				args = append(args, "--ts", tc.ts)
			}
			if tc.name == "tables before data" {
				args = append(args, "--tables", "2")
			}
			stdout, err := capture(t, func() error { return runRestore(ctx, args) })
			if tc.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("restore = %v, want error containing %q\n%s", err, tc.errSub, stdout)
				}
				if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("failed restore created --out (%v)", err)
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
			if told := fmt.Sprintf("--ts %s is TSO %d (", tc.ts, asOf); tc.told != strings.Contains(stdout, told) {
				t.Errorf("output mentions %q: %v, want %v:\n%s", told, !tc.told, tc.told, stdout)
			}
			for table, want := range tc.tables {
				if got := readJSONL(t, filepath.Join(out, table+".jsonl")); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("table %s: got %v, want %v", table, got, want)
				}
			}
		})
	}
}

// commitBetween is the flow store with fn (a commit that also advances the
// checkpoint) run right after the first read of either the checkpoint or
// the metas list.
type commitBetween struct {
	*meta.Store
	once sync.Once
	fn   func()
}

func (c *commitBetween) FlowState(ctx context.Context, id meta.FlowID) (meta.FlowState, error) {
	s, err := c.Store.FlowState(ctx, id)
	c.once.Do(c.fn)
	return s, err
}

func (c *commitBetween) Metas(ctx context.Context, id meta.FlowID) ([]meta.MetaRef, error) {
	r, err := c.Store.Metas(ctx, id)
	c.once.Do(c.fn)
	return r, err
}

// TestRestoreReadsCheckpointFirst commits a cycle and advances the
// checkpoint between restore's reads of the checkpoint and of the metas: the
// restore must be the state as of the TSO it names, whichever it is, so it
// must not use the new checkpoint with the old list of metas.
func TestRestoreReadsCheckpointFirst(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	st := &commitBetween{Store: e.store, fn: func() {
		e.commit(t, 58*time.Minute, sinktest.WritePut(1, 1, e.ts(54*time.Minute), e.ts(55*time.Minute), []byte("newest"), true))
	}}
	out := t.TempDir()
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	var cfg restoreConfig
	cfg.RegisterFlags(fs)
	if err := cli.Parse(fs, e.args("--flow", "f", "--out", out, "--temp-dir", t.TempDir())); err != nil {
		t.Fatal(err)
	}
	stdout, err := capture(t, func() error { return restore(ctx, &cfg, st, e.bucket) })
	if err != nil {
		t.Fatalf("restore: %v\n%s", err, stdout)
	}
	asOf := restoredAsOf(t, stdout)
	want := rowHex(1, 1) + "=late@" + fmt.Sprint(e.ts(48*time.Minute))
	if asOf >= e.ts(55*time.Minute) {
		want = rowHex(1, 1) + "=newest@" + fmt.Sprint(e.ts(55*time.Minute))
	}
	if got := readJSONL(t, filepath.Join(out, "1.jsonl")); fmt.Sprint(got) != fmt.Sprint([]string{want}) {
		t.Fatalf("restore as of %d (checkpoint was %d, then %d) has table 1 = %v, want [%s]",
			asOf, e.ts(50*time.Minute), e.ts(58*time.Minute), got, want)
	}
}

// TestRestoreOutDirFlag checks --out and --force on the command line: a
// non-empty directory is refused with a hint, and with --force a planted
// link to a victim file is replaced, not written through.
func TestRestoreOutDirFlag(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	out, victim := t.TempDir(), filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(out, "1.jsonl")); err != nil {
		t.Fatal(err)
	}
	args := e.args("--flow", "f", "--out", out, "--temp-dir", t.TempDir())
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
	if got := readJSONL(t, filepath.Join(out, "1.jsonl")); len(got) != 1 || !strings.Contains(got[0], "=late@") {
		t.Fatalf("table 1: %v", got)
	}
}

// TestRestoreVerifyForeignObjects plants a meta whose data_path is another
// flow's data object and a chunk whose zstd frame declares a 512 MiB
// window: restore fails naming them, and verify reports them as faults.
func TestRestoreVerifyForeignObjects(t *testing.T) {
	e := newTimedEnv(t)
	ctx := context.Background()
	// Another flow's cycle, listed as if it were f's.
	m, _ := sinktest.WriteCycle(t, e.bucket, sinktest.Cycle{Prefix: "pre", Catalog: "default", Flow: "g", FlowID: 1, CycleID: "g1",
		ResolvedTS: e.ts(30 * time.Minute), Entries: []sinktest.Entry{sinktest.WritePut(1, 5, e.ts(29*time.Minute), e.ts(30*time.Minute), []byte("not f's"), true)}})
	m.Flow = "f"
	foreign := sink.MetaPath("pre", "default", "f", 1, e.ts(30*time.Minute), "foreign")
	e.gcs.CreateObject(fakeObject(foreign, mustJSON(t, m)))
	// A chunk declaring a 512 MiB window.
	raw := event.AppendEntry(nil, event.AppendDataKey(nil, event.RowKey(1, 6), e.ts(31*time.Minute)), []byte("x"))
	frame := append([]byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 19 << 3, byte(1 | len(raw)<<3), byte(len(raw) >> 5), 0}, raw...)
	data := sink.DataPath("pre", "default", "f", 1, e.ts(31*time.Minute), "window")
	e.gcs.CreateObject(fakeObject(data, frame))
	sum := sha256.Sum256(raw)
	wm := sink.Meta{Version: 1, Flow: "f", FlowID: 1, CycleID: "window", DataPath: data, MinTS: e.ts(31 * time.Minute), MaxTS: e.ts(31 * time.Minute),
		Files: []sink.FileMeta{{Length: int64(len(frame)), RawLength: int64(len(raw)), Compression: "zstd", SHA256: hex.EncodeToString(sum[:]),
			NumberOfEntries: 1, MinTS: e.ts(31 * time.Minute), MaxTS: e.ts(31 * time.Minute), TableID: 1, CF: "write", Op: "put"}}}
	window := sink.MetaPath("pre", "default", "f", 1, e.ts(31*time.Minute), "window")
	e.gcs.CreateObject(fakeObject(window, mustJSON(t, wm)))

	for _, tc := range []struct {
		meta string
		want []string
	}{
		{foreign, []string{"meta " + foreign, `data_path "pre/default/g/v1/`, "lies outside the flow's directory pre/default/f/v1/"}},
		{window, []string{data, "window over the 8 MiB limit"}},
	} {
		t.Run(filepath.Base(tc.meta), func(t *testing.T) {
			rdb := e.redis.Client(t)
			key := e.store.Keys().Metas(1)
			if err := rdb.ZAdd(ctx, key, redis.Z{Score: float64(e.ts(30 * time.Minute)), Member: tc.meta}).Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rdb.ZRem(ctx, key, tc.meta) })
			_, err := capture(t, func() error {
				return runRestore(ctx, e.args("--flow", "f", "--out", t.TempDir(), "--temp-dir", t.TempDir(), "--max-memory", "64MiB"))
			})
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("restore = %v, want an error containing %q", err, w)
				}
			}
			stdout, err := capture(t, func() error { return runVerify(ctx, e.args("--flow", "f")) })
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
	e := newTimedEnv(t)
	ctx := context.Background()
	stdout, err := capture(t, func() error { return runVerify(ctx, e.args("--flow", "f")) })
	if err != nil || strings.Contains(stdout, "unreferenced") {
		t.Fatalf("verify of a clean backup = %v:\n%s", err, stdout)
	}

	// A fenced cycle's leftovers: a data object and a meta never listed.
	e.gcs.CreateObject(fakeObject(sink.DataPath("pre", "default", "f", 1, e.ts(51*time.Minute), "fenced"), make([]byte, 3<<20)))
	e.gcs.CreateObject(fakeObject(sink.MetaPath("pre", "default", "f", 1, e.ts(51*time.Minute), "fenced"), []byte("{}")))
	stdout, err = capture(t, func() error { return runVerify(ctx, e.args("--flow", "f")) })
	if err != nil {
		t.Fatalf("verify with leftovers = %v, want success:\n%s", err, stdout)
	}
	if !strings.Contains(stdout, "unreferenced: 2 objects (3.0 MiB) under pre/default/f/v1/") || !strings.Contains(stdout, "consumer gc removes them") {
		t.Errorf("verify does not report the leftovers:\n%s", stdout)
	}

	stdout, err = capture(t, func() error { return runVerify(ctx, e.args("--flow", "f", "--group", "other")) })
	var exit exitError
	if !errors.As(err, &exit) || exit.code != 1 {
		t.Fatalf("verify --group other = %v, want exit 1\n%s", err, stdout)
	}
	want := "checkpoint object pre/default/f/v1/global_checkpoint/other-1.ts is missing (Redis has " + fmt.Sprint(e.ts(50*time.Minute)) +
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

// fakeObject is an object to put into the emulator as is (overwriting).
func fakeObject(name string, content []byte) fakestorage.Object {
	return fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: testenv.Bucket, Name: name}, Content: content}
}
