package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
)

// replaySeeds are TestReplayRoundTrip's seeds.
var replaySeeds = flag.String("replay-seeds", "", "comma-separated seeds of TestReplayRoundTrip (default: the fixed CI seeds 1, 2, 3)")

// replayRun runs `consumer replay` of src's backup with args to completion.
func replayRun(t *testing.T, src *replaySource, args ...string) oracleResult {
	t.Helper()
	return oracleRun(t, "replay", src.conn(), args...)
}

// TestReplayRoundTrip checks replay's round trip (docs/RESTORE.md, "A
// restore drill into a second flowlog") as a property, for several seeds:
// a backup made with churn (replayChurnBackup) is replayed, `--mode state
// --to A` and then `--mode log --from A --to T` (T the checkpoint, A inside
// the last load, where values prewritten before A are committed after it;
// the JSON form for even seeds), into the apply topic of a second flowlog
// (its own Redis prefix, bucket prefix, group and DDL topic) that backs up
// a flow of the same definition, created before the replay. Once the
// second backup's checkpoint reaches T, its restores at A, T and 8 random
// ts between equal the original's restores at the same ts, byte for byte.
func TestReplayRoundTrip(t *testing.T) {
	seeds := []int64{1, 2, 3}
	if *replaySeeds != "" {
		seeds = nil
		for _, s := range strings.Split(*replaySeeds, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				t.Fatalf("-replay-seeds: %v", err)
			}
			seeds = append(seeds, n)
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { replayRoundTrip(t, seed) })
	}
}

func replayRoundTrip(t *testing.T, seed int64) {
	began := time.Now()
	rc := replayChurnBackup(t, seed)
	c := rc.c
	rng := rand.New(rand.NewPCG(uint64(seed), 0xa7))
	T := rc.ckpt
	tables := rc.tablesAt(T)
	if !slices.Equal(tables, []int64{11, 12, 13, 14}) {
		t.Fatalf("seed %d: tables restorable at the checkpoint %d are %v, the DDL left 11-14 (windows%s)", seed, T, tables, rc.windowsText())
	}
	span := rc.hi - rc.lo
	A := rc.lo + span*3/10 + rng.Uint64N(span*4/10)
	if got := rc.tablesAt(A); !slices.Equal(got, tables) {
		t.Fatalf("seed %d: A=%d in the last load, yet tables %v are restorable there (windows%s)", seed, A, got, rc.windowsText())
	}
	t.Logf("seed %d: backup in %v; A=%d, T=%d", seed, time.Since(began).Round(time.Millisecond), A, T)
	rc.checkLongTxns(t, T)

	// The second flowlog, its flow created before anything is replayed.
	const apply2, ddl2, dlq2, prefix2 = "rt2.apply", "rt2.ddl", "rt2.dlq", "second"
	createTopics(t, c.Broker.Addr, 3, apply2)
	createTopics(t, c.Broker.Addr, 1, ddl2, dlq2)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--ddl-topic", ddl2, "--name", "rt", "--tables", tableList(tables))
	c.startConsumer(t, "second", "--apply-topic", apply2, "--ddl-topic", ddl2, "--dlq-topic", dlq2,
		"--redis-prefix", prefix2, "--gcs-prefix", prefix2, "--group", prefix2)
	store2 := meta.NewStore(c.Redis.Client(t), prefix2, nil)
	ctx := context.Background()
	waitFor(t, 30*time.Second, func() (bool, string) {
		_, ok, err := store2.FlowIDByName(ctx, meta.DefaultCatalog, "rt")
		return ok, fmt.Sprintf("the second flowlog has no flow rt yet (%v)", err)
	})

	// Replay: the state at A, then the log from A to T; in the JSON form
	// for even seeds.
	format := "protobuf"
	if seed%2 == 0 {
		format = "json"
	}
	replayed := time.Now()
	for _, args := range [][]string{
		{"--mode", "state", "--to", strconv.FormatUint(A, 10)},
		{"--mode", "log", "--from", strconv.FormatUint(A, 10), "--to", strconv.FormatUint(T, 10)},
	} {
		res := replayRun(t, rc.replaySource, append([]string{"--flow", "rt", "--to-topic", apply2, "--format", format}, args...)...)
		if res.code != 0 {
			t.Fatalf("seed %d: replay %s exited %d:\n%s", seed, strings.Join(args, " "), res.code, res.out)
		}
		if !strings.Contains(res.out, "left out table 15") {
			t.Errorf("seed %d: replay %s does not name table 15, outside its window at %s:\n%s", seed, strings.Join(args, " "), args[3], res.out)
		}
	}
	waitFlowCheckpointTS(ctx, t, store2, "rt", T, 90*time.Second)
	t.Logf("seed %d: replayed (%s) and backed up again in %v", seed, format, time.Since(replayed).Round(time.Millisecond))

	// Restores at A, T and 8 ts between, of both backups.
	conn2 := []string{"--redis-url", c.Redis.URL, "--redis-prefix", prefix2, "--gcs-bucket", c.GCS.Bucket,
		"--gcs-endpoint", c.GCS.Addr, "--gcs-prefix", prefix2, "--group", prefix2}
	points := []uint64{A, T}
	for len(points) < 10 {
		points = append(points, A+1+rng.Uint64N(T-A-1))
	}
	keys := 0
	for _, ts := range points {
		want := restoreAt(t, rc.c.oracleConn(), "rt", ts)
		got := restoreAt(t, conn2, "rt", ts)
		d, err := diffRestores(want, got)
		if err != nil {
			t.Fatalf("seed %d, ts %d: %v", seed, ts, err)
		}
		if d != "" {
			t.Errorf("seed %d, ts %d: the replayed backup's restore differs from the original's: %s", seed, ts, d)
		}
		keys += restoreLines(t, want)
	}
	t.Logf("seed %d: 10 restores compared (%d keys in the original's), round trip in %v", seed, keys, time.Since(began).Round(time.Millisecond))
}

// checkLongTxns checks the backup itself: the original's restore at ts
// holds every crafted transaction committed at or below ts with its
// value, so the round trip does carry values prewritten long before their
// commit, and rows of a region silent after A.
func (rc *replayChurn) checkLongTxns(t *testing.T, ts uint64) {
	t.Helper()
	dir := restoreAt(t, rc.c.oracleConn(), "rt", ts)
	rows := map[int64]map[string]loadgen.Row{}
	for _, tx := range append(slices.Clone(rc.long), rc.quiet...) {
		if tx.commit > ts {
			continue
		}
		if rows[tx.table] == nil {
			rows[tx.table] = oracleReadRestore(t, filepath.Join(dir, strconv.FormatInt(tx.table, 10)+".jsonl"))
		}
		got, ok := rows[tx.table][string(event.RowKey(tx.table, tx.handle))]
		if !ok || string(got.Value) != string(tx.value) || got.CommitTS != tx.commit {
			t.Fatalf("seed %d: the original's restore at %d lacks table %d row %d (prewritten at %d, committed at %d): %v %d",
				rc.seed, ts, tx.table, tx.handle, tx.start, tx.commit, ok, got.CommitTS)
		}
	}
}

// restoreLines counts the lines of a restore's output.
func restoreLines(t *testing.T, dir string) int {
	t.Helper()
	files, err := restoreFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		n += strings.Count(string(b), "\n")
	}
	return n
}

// TestReplayKilledFiveTimes checks that replay is exactly once across
// crashes (docs/RESTORE.md, "Interrupting and resuming"): a `--mode log`
// replay into a fresh topic is SIGKILLed five times at random points of
// its progress (records in the target topic), each time run again with
// the same arguments, until a run exits 0. The target topic then holds every record
// once, in order, and exactly what an uninterrupted run wrote into another
// fresh topic: keys, values and headers, partition by partition.
func TestReplayKilledFiveTimes(t *testing.T) {
	cfg := loadgen.Config{Events: 8000, Tables: []int64{1, 2, 3}, Regions: 24, ValueSize: 300, Seed: 77, DeleteRatio: 0.2, HeartbeatEvery: 2}
	src := replayBackup(t, "kill", []int64{1, 2, 3}, cfg.Regions, []replayPhase{{load: cfg}}, nil)
	rng := crashRNG(t, 21)
	addr := src.c.Broker.Addr
	const once, killed = "replay.once", "replay.killed"
	createTopics(t, addr, 4, once, killed)
	// A rate that makes a run last about 10 s, so that five kills land
	// at different points of it.
	rate := max(replayBytes(cfg)/10, 64<<10)
	args := []string{"--flow", "kill", "--mode", "log", "--rate", strconv.Itoa(rate)}

	start := time.Now()
	if res := replayRun(t, src, append(args, "--to-topic", once)...); res.code != 0 {
		t.Fatalf("uninterrupted replay exited %d:\n%s", res.code, res.out)
	}
	want := readReplayed(t, addr, once)
	n := replayCount(want)
	if err := checkReplayedOnce(want); err != nil {
		t.Fatalf("the uninterrupted replay: %v", err)
	}
	t.Logf("uninterrupted replay: %d records in %v at --rate %d", n, time.Since(start).Round(time.Millisecond), rate)
	if n < 20 {
		t.Fatalf("the uninterrupted replay wrote %d records: too few to kill a run five times in", n)
	}

	// Five kill points, by records in the target topic.
	var points []int
	for len(points) < 5 {
		if k := 1 + rng.IntN(n-1); !slices.Contains(points, k) {
			points = append(points, k)
		}
	}
	slices.Sort(points)
	run := append(append([]string{"replay"}, src.conn()...), append(args, "--to-topic", killed)...)
	p := newProc(t, "replay", binary(t, "consumer"), run...)
	adm := newAdmin(t, addr)
	defer adm.Close()
	ctx := context.Background()
	records := func() (int, error) {
		end, err := adm.ListEndOffsets(ctx, killed)
		if err == nil {
			err = end.Error()
		}
		if err != nil {
			return 0, err
		}
		total := 0
		end.Each(func(o kadm.ListedOffset) { total += int(o.Offset) })
		return total, nil
	}
	for i, at := range points {
		p.Start()
		var got int
		waitForOrStop(t, 60*time.Second, func() (bool, string, error) {
			var err error
			if got, err = records(); err != nil {
				return false, err.Error(), nil
			}
			if got >= at {
				return true, "", nil
			}
			if !p.Running() {
				return false, "", fmt.Errorf("run %d exited before its kill at %d records (%d there): %v", i+1, at, got, p.Wait())
			}
			return false, fmt.Sprintf("run %d: %d records, kill at %d", i+1, got, at), nil
		})
		p.Kill()
		got, _ = records()
		t.Logf("run %d SIGKILLed at %d of %d records (point %d)", i+1, got, n, at)
	}
	for i := 0; ; i++ {
		p.Start()
		err := p.Wait()
		if err == nil {
			break
		}
		t.Errorf("run %d after the kills exited: %v", 6+i, err)
		if i == 2 {
			t.FailNow()
		}
	}

	got := readReplayed(t, addr, killed)
	if err := checkReplayedOnce(got); err != nil {
		t.Errorf("the killed replay's topic: %v", err)
	}
	if d := diffTopics(want, got); d != "" {
		t.Errorf("the killed replay's topic differs from the uninterrupted one's: %s", d)
	}
	t.Logf("killed replay: %d records, %d expected", replayCount(got), n)
}

// replayBytes estimates what a log replay of cfg's load publishes: the
// keys and values of its events but the lock-CF ones.
func replayBytes(cfg loadgen.Config) int {
	g := loadgen.New(cfg)
	n := 0
	for b, ok := g.Next(); ok; b, ok = g.Next() {
		for _, e := range b.Events {
			if e.CF != event.CFLock {
				n += len(e.Key) + len(e.Value)
			}
		}
	}
	return n
}

// TestReplayCoverage checks that replay honours coverage windows as
// restore does (docs/RESTORE.md, "Replay or restore"): of a flow on tables
// 1 and 2 whose table 2 was removed between two loads, a replay at the
// checkpoint, in either mode, leaves table 2 out and names it; one of
// table 2 alone exits 1 and writes nothing; and one up to a ts inside
// table 2's window replays both.
func TestReplayCoverage(t *testing.T) {
	load := func(seed int64) loadgen.Config {
		return loadgen.Config{Events: 1500, Tables: []int64{1, 2}, Regions: 4, Seed: seed, HeartbeatEvery: 2}
	}
	src := replayBackup(t, "cov", []int64{1, 2}, 4, []replayPhase{
		{load: load(5)},
		{ddl: []string{"flow", "replace", "--name", "cov", "--tables", "1"}, load: load(6)},
	}, nil)
	w2, ok := src.cur[2]
	if !ok || w2.Until == nil {
		t.Fatalf("table 2 has no closed window: windows%s", src.windowsText())
	}
	inside := *w2.Until
	addr := src.c.Broker.Addr
	createTopics(t, addr, 2, "cov.log", "cov.state", "cov.none", "cov.inside")

	for _, tc := range []struct {
		name, topic string
		args        []string
		code        int
		leftOut     bool    // table 2 named left out
		tables      []int64 // tables of the replayed events
	}{
		{"log at the checkpoint", "cov.log", []string{"--mode", "log"}, 0, true, []int64{1}},
		{"state at the checkpoint", "cov.state", []string{"--mode", "state"}, 0, true, []int64{1}},
		{"table 2 alone", "cov.none", []string{"--tables", "2"}, 1, true, nil},
		{"inside table 2's window", "cov.inside", []string{"--to", strconv.FormatUint(inside, 10)}, 0, false, []int64{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := replayRun(t, src, append([]string{"--flow", "cov", "--to-topic", tc.topic}, tc.args...)...)
			if res.code != tc.code {
				t.Fatalf("replay %s exited %d, want %d:\n%s", strings.Join(tc.args, " "), res.code, tc.code, res.out)
			}
			if got := strings.Contains(res.out, "left out table 2"); got != tc.leftOut {
				t.Errorf("replay %s names table 2 left out: %v, want %v:\n%s", strings.Join(tc.args, " "), got, tc.leftOut, res.out)
			}
			if strings.Contains(res.out, "left out table 1") {
				t.Errorf("replay %s names table 1 left out:\n%s", strings.Join(tc.args, " "), res.out)
			}
			if got := replayedTables(t, readReplayed(t, addr, tc.topic)); !slices.Equal(got, tc.tables) {
				t.Errorf("replay %s published events of tables %v, want %v", strings.Join(tc.args, " "), got, tc.tables)
			}
		})
	}
}

// replayedTables are the tables of the events of a replayed topic, sorted.
func replayedTables(t *testing.T, rs map[int32][]replayedRecord) []int64 {
	t.Helper()
	seen := map[int64]bool{}
	for _, recs := range rs {
		for _, r := range recs {
			for _, e := range r.batch.Events {
				raw, _, err := event.DecodeDataKey(e.Key)
				if err != nil {
					t.Fatalf("replayed event key %x: %v", e.Key, err)
				}
				if tb, ok := event.TableIDOfRaw(raw); ok {
					seen[tb] = true
				}
			}
		}
	}
	var out []int64
	for tb := range seen {
		out = append(out, tb)
	}
	slices.Sort(out)
	return out
}
