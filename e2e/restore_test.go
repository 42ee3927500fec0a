package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

var restoreBench = flag.Bool("restore-bench", false, "run TestRestoreThroughput: a 200k-event backup restored under /usr/bin/time")

// TestRestoreMatchesSeed is the end-to-end restore check, on processes only:
// a flow on tables 1 and 2, two seeded loads over tables 1, 2 and 3 (short
// values, then a later one of 300-byte values that go to the default CF and
// overwrite many rows of the first), and `consumer restore` at the checkpoint
// and at two earlier commit ts must give, line by line, the table contents
// loadgen.Expected computes from the seeds alone. Table 3 is not covered and
// must not be restored; `consumer verify` must find no fault.
func TestRestoreMatchesSeed(t *testing.T) {
	c := startCluster(t, 4)
	short := loadgen.Config{
		Events: 20_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 64, Seed: 4101, HeartbeatEvery: 5,
		StartTime: time.Date(2026, 3, 2, 10, 59, 58, 0, time.UTC), // crosses an hour
	}
	shortStats := expectLoad(short)
	large := loadgen.Config{
		Events: 10_000, Tables: []int64{1, 2, 3}, Regions: 8, ValueSize: 300, Seed: 4102,
		StartTime: restoreTSTime(shortStats.maxResolved).Add(time.Second), // every ts after the first load's
	}
	largeStats := expectLoad(large)
	muts := append(loadgen.Mutations(short), loadgen.Mutations(large)...)

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f12", "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--flush-size", "512KiB") // several cycles: versions of a key in different objects
	for _, cfg := range []loadgen.Config{short, large} {
		runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFlowCheckpoint(ctx, t, store, "f12", largeStats.maxResolved, 60*time.Second)

	commits := make([]uint64, len(muts))
	for i, m := range muts {
		commits[i] = m.CommitTS
	}
	slices.Sort(commits)
	cases := []struct {
		name string
		ts   uint64 // 0: the checkpoint
	}{
		{"checkpoint", 0},
		{"one third", commits[len(commits)/3]},    // inside the short-value load
		{"two thirds", commits[2*len(commits)/3]}, // inside the large-value load
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			args := []string{"--flow", "f12", "--out", out, "--temp-dir", t.TempDir()}
			if tc.ts != 0 {
				args = append(args, "--ts", strconv.FormatUint(tc.ts, 10))
			}
			res := restoreRun(t, c, "restore", args...)
			if res.code != 0 {
				t.Fatalf("restore exited %d:\n%s", res.code, res.out)
			}
			ts := restoreOutputTS(t, res.out)
			if tc.ts != 0 && ts != tc.ts {
				t.Fatalf("restore says as of %d, asked for %d", ts, tc.ts)
			}
			if tc.ts == 0 && ts < largeStats.maxResolved {
				t.Fatalf("restore at the checkpoint is as of %d, below the loads' max resolved ts %d", ts, largeStats.maxResolved)
			}
			want := loadgen.Expected(muts, ts)
			delete(want, 3) // not covered by the flow
			if len(want[1]) == 0 || len(want[2]) == 0 {
				t.Fatalf("expected state at %d has %d/%d rows in tables 1/2: pick a later ts", ts, len(want[1]), len(want[2]))
			}
			n := restoreCompare(t, out, want)
			t.Logf("as of %d: %d rows match; %s", ts, n, restoreLastLine(res.out))
		})
	}

	t.Run("verify", func(t *testing.T) {
		res := restoreRun(t, c, "verify", "--flow", "f12")
		if res.code != 0 || !strings.Contains(res.out, "OK") {
			t.Fatalf("verify exited %d:\n%s", res.code, res.out)
		}
	})
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}

// TestCorruptChunkFailsLoudly flips one byte of one chunk of a backed-up
// data object in GCS and expects `consumer restore` and `consumer verify`
// to exit non-zero naming the object and the chunk, for both chunk
// encodings.
func TestCorruptChunkFailsLoudly(t *testing.T) {
	for _, compression := range []string{"zstd", "none"} {
		t.Run(compression, func(t *testing.T) {
			c := startCluster(t, 2)
			cfg := loadgen.Config{Events: 3000, Tables: []int64{1, 2}, Regions: 4, ValueSize: 300, Seed: 4201,
				StartTime: time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)}
			stats := expectLoad(cfg)
			runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "fc", "--tables", "1,2")
			cons := c.startConsumer(t, "consumer-1", "--compression", compression)
			runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
			id := waitFlowCheckpoint(ctx, t, store, "fc", stats.maxResolved, 45*time.Second)
			if err := cons.Stop(); err != nil { // nothing writes the bucket from here on
				t.Fatalf("consumer exit after SIGTERM: %v", err)
			}
			if res := restoreRun(t, c, "restore", "--flow", "fc", "--out", t.TempDir(), "--temp-dir", t.TempDir()); res.code != 0 {
				t.Fatalf("restore before the corruption exited %d:\n%s", res.code, res.out)
			}

			object, chunk := restoreCorruptChunk(ctx, t, c.GCS, store, id, compression)
			t.Logf("flipped one byte of chunk %d of %s", chunk, object)
			want := fmt.Sprintf("chunk %d ", chunk)
			for _, cmd := range [][]string{
				{"restore", "--flow", "fc", "--out", t.TempDir(), "--temp-dir", t.TempDir()},
				{"verify", "--flow", "fc"},
				{"verify", "--flow", "fc", "--json"},
			} {
				res := restoreRun(t, c, cmd[0], cmd[1:]...)
				if res.code == 0 {
					t.Errorf("%s exited 0 after the corruption:\n%s", strings.Join(cmd, " "), res.out)
					continue
				}
				if !strings.Contains(res.out, object) || !strings.Contains(res.out, want) || !strings.Contains(res.out, "corrupt") {
					t.Errorf("%s exited %d without naming %q and %q as corrupt:\n%s", strings.Join(cmd, " "), res.code, want, object, res.out)
				}
			}
		})
	}
}

// TestRestoreThroughput backs up a 200k-event load (value size 200) and
// restores it under /usr/bin/time -v, logging the restore's MiB/s of log
// data and its peak RSS. It checks the restored rows but asserts no speed.
// Run it with -restore-bench.
func TestRestoreThroughput(t *testing.T) {
	if !*restoreBench {
		t.Skip("a benchmark: run with -restore-bench")
	}
	timeBin, err := exec.LookPath("/usr/bin/time")
	if err != nil {
		t.Skipf("no /usr/bin/time: %v", err)
	}
	events := 200_000
	if s := os.Getenv("FLOWLOG_RESTORE_BENCH_EVENTS"); s != "" {
		if events, err = strconv.Atoi(s); err != nil {
			t.Fatalf("FLOWLOG_RESTORE_BENCH_EVENTS: %v", err)
		}
	}
	c := startCluster(t, 4)
	cfg := loadgen.Config{Events: events, Tables: []int64{1, 2}, Regions: 16, ValueSize: 200, Seed: 4301,
		StartTime: time.Date(2026, 3, 2, 14, 0, 0, 0, time.UTC)}
	stats := expectLoad(cfg)
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "fb", "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--flush-interval", "5s", "--flush-size", "32MiB")
	start := time.Now()
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	waitFlowCheckpoint(ctx, t, store, "fb", stats.maxResolved, 5*time.Minute)
	t.Logf("load of %d events backed up in %v", events, time.Since(start).Round(time.Millisecond))
	if err := cons.Stop(); err != nil {
		t.Fatalf("consumer exit after SIGTERM: %v", err)
	}
	want := loadgen.Expected(loadgen.Mutations(cfg), stats.maxResolved)
	for _, mem := range []string{"16MiB", "256MiB", "16MiB", "256MiB"} { // twice each: the first run warms the page cache
		t.Run("max-memory "+mem, func(t *testing.T) {
			out := t.TempDir()
			args := append([]string{"-v", binary(t, "consumer"), "restore"}, restoreConnArgs(c)...)
			args = append(args, "--flow", "fb", "--out", out, "--temp-dir", t.TempDir(), "--max-memory", mem)
			cmd := exec.CommandContext(ctx, timeBin, args...)
			var buf bytes.Buffer
			cmd.Stdout, cmd.Stderr = &buf, &buf
			gcsCPU := restoreProcCPU(c.GCS.proc)
			wall := time.Now()
			if err := cmd.Run(); err != nil {
				t.Fatalf("restore: %v\n%s", err, buf.String())
			}
			elapsed := time.Since(wall)
			rss := regexp.MustCompile(`Maximum resident set size \(kbytes\): (\d+)`).FindStringSubmatch(buf.String())
			if rss == nil {
				t.Fatalf("no peak RSS in the output of time -v:\n%s", buf.String())
			}
			kb, _ := strconv.Atoi(rss[1])
			speed := regexp.MustCompile(`(?m)^.*MiB of log in .*$`).FindString(buf.String())
			cpu := regexp.MustCompile(`(?m)^\s*(User time \(seconds\): \S+|System time \(seconds\): \S+|Percent of CPU this job got: \S+)$`).FindAllStringSubmatch(buf.String(), -1)
			var cpus []string
			for _, m := range cpu {
				cpus = append(cpus, m[1])
			}
			t.Logf("restore (--max-memory %s): %s; wall %v; peak RSS %.1f MiB; %s; fake-gcs-server CPU meanwhile %.2fs",
				mem, speed, elapsed.Round(time.Millisecond), float64(kb)/1024, strings.Join(cpus, ", "), restoreProcCPU(c.GCS.proc)-gcsCPU)
			restoreCompare(t, out, want)
		})
	}
}

// restoreProcCPU is the user+system CPU seconds p's process has used so
// far, from /proc (0 if unknown); the clock tick is assumed to be 100 Hz.
func restoreProcCPU(p *proc) float64 {
	p.mu.Lock()
	pid := 0
	if p.cmd != nil && p.cmd.Process != nil {
		pid = p.cmd.Process.Pid
	}
	p.mu.Unlock()
	return pidCPU(pid)
}

// pidCPU is the user + system CPU seconds of process pid so far (0 if it
// cannot be read).
func pidCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

// restoreResult is the outcome of a consumer subcommand.
type restoreResult struct {
	out  string // stdout and stderr
	code int    // exit status
}

// restoreConnArgs are the connection flags of the consumer's operator
// commands that read the backup (no Kafka) for c.
func restoreConnArgs(c *cluster) []string {
	return []string{"--redis-url", c.Redis.URL, "--gcs-bucket", c.GCS.Bucket,
		"--gcs-endpoint", c.GCS.Addr, "--group", "flowlog"}
}

// restoreRun runs `consumer <sub> <connection flags> args...` to
// completion (within 2 minutes) and returns its output and exit status.
func restoreRun(t testing.TB, c *cluster, sub string, args ...string) restoreResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t, "consumer"), append(append([]string{sub}, restoreConnArgs(c)...), args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return restoreResult{out.String(), 0}
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return restoreResult{out.String(), exit.ExitCode()}
	default:
		t.Fatalf("consumer %s: %v\n%s", sub, err, out.String())
		return restoreResult{}
	}
}

var restoreOutputRE = regexp.MustCompile(`(?m)^restored flow \S+ \(id \d+\) as of (\d+) `)

// restoreOutputTS is the ts a restore's output says it restored at.
func restoreOutputTS(t testing.TB, out string) uint64 {
	t.Helper()
	m := restoreOutputRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q line in the restore output:\n%s", restoreOutputRE, out)
	}
	ts, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// restoreTSTime is the wall time of a TSO's physical part.
func restoreTSTime(ts uint64) time.Time { return time.UnixMilli(int64(ts >> 18)).UTC() }

// restoreLine is one line of a restored <table_id>.jsonl (docs/FORMAT.md,
// "Local files").
type restoreLine struct {
	Key      string `json:"key"`
	Value    string `json:"value"`
	CommitTS uint64 `json:"commit_ts"`
}

// restoreCompare checks that dir holds exactly one <table>.jsonl per table
// of want and that each equals, line by line, want's rows sorted by raw
// key: key as lowercase hex, value as standard base64, commit ts. It
// returns the number of rows compared.
func restoreCompare(t testing.TB, dir string, want map[int64]map[string]loadgen.Row) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read restore dir: %v", err)
	}
	var got, wantFiles []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	for table := range want {
		wantFiles = append(wantFiles, fmt.Sprintf("%d.jsonl", table))
	}
	slices.Sort(got)
	slices.Sort(wantFiles)
	if !slices.Equal(got, wantFiles) {
		t.Errorf("restore wrote %v, want %v", got, wantFiles)
	}
	total := 0
	for table, rows := range want {
		keys := make([]string, 0, len(rows))
		for k := range rows {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		total += restoreCompareTable(t, filepath.Join(dir, fmt.Sprintf("%d.jsonl", table)), keys, rows)
	}
	return total
}

// restoreCompareTable compares one restored file with the sorted keys of rows.
func restoreCompareTable(t testing.TB, path string, keys []string, rows map[string]loadgen.Row) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Errorf("restored table: %v", err)
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	bad, n := 0, 0
	report := func(format string, args ...any) {
		if bad++; bad <= 5 {
			t.Errorf("%s line %d: %s", filepath.Base(path), n, fmt.Sprintf(format, args...))
		}
	}
	for ; sc.Scan(); n++ {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var l restoreLine
		if err := dec.Decode(&l); err != nil {
			report("%v: %q", err, sc.Text())
			continue
		}
		if n >= len(keys) {
			report("extra row with key %s", l.Key)
			continue
		}
		k := keys[n]
		w := restoreLine{hex.EncodeToString([]byte(k)), base64.StdEncoding.EncodeToString(rows[k].Value), rows[k].CommitTS}
		switch {
		case l.Key != w.Key:
			report("key %s, want %s", l.Key, w.Key)
		case l.Value != w.Value:
			report("key %s: value %.40s... (%d base64 chars), want %.40s... (%d)", l.Key, l.Value, len(l.Value), w.Value, len(w.Value))
		case l.CommitTS != w.CommitTS:
			report("key %s: commit_ts %d, want %d", l.Key, l.CommitTS, w.CommitTS)
		}
	}
	if err := sc.Err(); err != nil {
		t.Errorf("read %s: %v", path, err)
	}
	if n < len(keys) {
		report("file ends after %d rows, want %d (next key %x)", n, len(keys), keys[n])
	}
	if bad > 0 {
		t.Errorf("%s: %d bad lines of %d (want %d rows)", filepath.Base(path), bad, n, len(keys))
	}
	return n
}

// restoreCorruptChunk flips one byte in the middle of a chunk of table 1 in the
// data object of the flow's first meta, by deleting the object and writing
// it back modified, and returns the object and the chunk's index.
func restoreCorruptChunk(ctx context.Context, t testing.TB, g *gcsProc, store *meta.Store, id meta.FlowID, compression string) (string, int) {
	t.Helper()
	refs, err := store.Metas(ctx, id)
	if err != nil || len(refs) == 0 {
		t.Fatalf("metas of flow %d: %d, %v", id, len(refs), err)
	}
	bkt := g.Client.Bucket(g.Bucket)
	for _, ref := range refs {
		m, err := sink.DecodeMeta(restoreReadObject(ctx, t, g, ref.Path))
		if err != nil {
			t.Fatalf("decode meta %s: %v", ref.Path, err)
		}
		for i, f := range m.Files {
			if f.TableID != 1 || f.Length < 16 || !m.Holds(id, &f) {
				continue
			}
			if f.Compression != compression {
				t.Fatalf("chunk %d of %s has compression %q, consumer ran with %q", i, m.DataPath, f.Compression, compression)
			}
			data := restoreReadObject(ctx, t, g, m.DataPath)
			data[f.Offset+f.Length/2] ^= 0x01
			if err := bkt.Object(m.DataPath).Delete(ctx); err != nil {
				t.Fatalf("delete %s: %v", m.DataPath, err)
			}
			w := bkt.Object(m.DataPath).NewWriter(ctx)
			if _, err := w.Write(data); err != nil {
				t.Fatalf("rewrite %s: %v", m.DataPath, err)
			}
			if err := w.Close(); err != nil {
				t.Fatalf("rewrite %s: %v", m.DataPath, err)
			}
			if back := restoreReadObject(ctx, t, g, m.DataPath); !bytes.Equal(back, data) {
				t.Fatalf("%s reads back %d bytes, not the %d corrupted ones", m.DataPath, len(back), len(data))
			}
			return m.DataPath, i
		}
	}
	t.Fatalf("no chunk of table 1 in the %d metas of flow %d", len(refs), id)
	return "", 0
}

// restoreReadObject reads a whole object of g's bucket.
func restoreReadObject(ctx context.Context, t testing.TB, g *gcsProc, name string) []byte {
	t.Helper()
	r, err := g.Client.Bucket(g.Bucket).Object(name).NewReader(ctx)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return b
}

// restoreLastLine is the last non-empty line of s.
func restoreLastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
