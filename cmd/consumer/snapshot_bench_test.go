package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
)

var (
	benchSnapMiB  = flag.Int("snapbench-mib", 64, "MiB of log BenchmarkSnapshotRestore backs up (the issue's figure is 1024)")
	benchSnapKeys = flag.Int("snapbench-keys", 20_000, "rows per table (3 tables) BenchmarkSnapshotRestore updates over and over")
)

// BenchmarkSnapshotRestore measures what a snapshot saves a restore (docs/FORMAT.md,
// "Snapshot rule": the same output, faster) on a flow with
// -snapbench-mib of log (3 tables of -snapbench-keys rows, updated over and
// over: short values inline, 30% 1 KiB values through the default CF, 10%
// deletes), through the real consumer process against fake-gcs-server and
// Redis: `consumer snapshot` at 90% of the history, then restores at the
// checkpoint from the log alone (--snapshots=false) and from the snapshot,
// twice each, alternating. It reports the faster run of each restore, their
// peak RSS (VmHWM), the speedup, and the snapshot's throughput in MiB/s of
// log read, and checks that both restores wrote the same bytes.
func BenchmarkSnapshotRestore(b *testing.B) {
	ctx := context.Background()
	sb := newSnapBench(b)
	rd, cycleTS, conn := sb.redis, sb.cycleTS, sb.conn
	ckpt := cycleTS[len(cycleTS)-1]
	snapTS := cycleTS[len(cycleTS)*9/10-1]
	run := func(args ...string) (procResult, float64) {
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		cmd := consumerCmd(ctx, "", nil, append(args, conn...)...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		// ru_maxrss would count the test process's memory too (the child
		// shares it until exec): poll the child's VmHWM instead, the peak
		// RSS of its own address space.
		stop, peak := make(chan struct{}), make(chan float64)
		go func() { peak <- pollHWM(cmd.Process.Pid, stop) }()
		err := cmd.Wait()
		close(stop)
		r := procResult{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
		if err != nil {
			b.Fatalf("consumer %v: %v\n%s\n%s", args, err, r.stdout, r.stderr)
		}
		return r, <-peak
	}
	for b.Loop() {
		logOut, snapOut := b.TempDir(), b.TempDir()
		snapRun, snapRSS := run("snapshot", "--flow", "f", "--ts", fmt.Sprint(snapTS), "--temp-dir", b.TempDir())
		// Each restore twice, alternating, keeping the faster run: the
		// machine these run on is shared and noisy.
		var logRun, withRun procResult
		var logRSS, withRSS float64
		for range 2 {
			r, rss := run("restore", "--flow", "f", "--snapshots=false", "--out", logOut, "--force", "--temp-dir", b.TempDir())
			if logRun.took == 0 || r.took < logRun.took {
				logRun = r
			}
			logRSS = max(logRSS, rss)
			r, rss = run("restore", "--flow", "f", "--out", snapOut, "--force", "--temp-dir", b.TempDir())
			if withRun.took == 0 || r.took < withRun.took {
				withRun = r
			}
			withRSS = max(withRSS, rss)
		}
		if !strings.Contains(withRun.stdout, "started from the snapshot at "+fmt.Sprint(snapTS)) || !strings.Contains(withRun.stdout, fmt.Sprint(ckpt)) {
			b.Fatalf("restore with snapshot:\n%s", withRun.stdout)
		}
		if a, c := dirSum(b, logOut), dirSum(b, snapOut); a != c {
			b.Fatalf("the restores differ: %s from the log, %s with the snapshot", a, c)
		}
		m := regexp.MustCompile(`read ([0-9.]+) MiB of log .* in ([0-9.]+)s`).FindStringSubmatch(snapRun.stdout)
		if m == nil {
			b.Fatalf("snapshot output:\n%s", snapRun.stdout)
		}
		logMiB, _ := strconv.ParseFloat(m[1], 64)
		secs, _ := strconv.ParseFloat(m[2], 64)
		written := regexp.MustCompile(`([0-9.]+) MiB written`).FindStringSubmatch(snapRun.stdout)
		b.ReportMetric(logRun.took.Seconds(), "log-restore-s")
		b.ReportMetric(withRun.took.Seconds(), "snap-restore-s")
		b.ReportMetric(logRun.took.Seconds()/withRun.took.Seconds(), "speedup-x")
		b.ReportMetric(logRSS, "log-restore-rss-MiB")
		b.ReportMetric(withRSS, "snap-restore-rss-MiB")
		b.ReportMetric(logMiB/secs, "snapshot-log-MiB/s")
		b.ReportMetric(snapRun.took.Seconds(), "snapshot-s")
		b.ReportMetric(snapRSS, "snapshot-rss-MiB")
		if written != nil {
			v, _ := strconv.ParseFloat(written[1], 64)
			b.ReportMetric(v, "snapshot-stored-MiB")
		}
		b.Logf("log alone:\n%s\nsnapshot:\n%s\nwith snapshot:\n%s", logRun.stdout, snapRun.stdout, withRun.stdout)
		// The next iteration takes its own snapshot.
		if err := rd.Client(b).Del(ctx, meta.NewKeys("flowlog").Snapshots(1)).Err(); err != nil {
			b.Fatal(err)
		}
		snapTS-- // a fresh snapshot path
	}
}

// snapBench is a flow with -snapbench-mib of log, as the snapshot
// benchmarks back it up (see writeSnapBenchLog).
type snapBench struct {
	redis   *testenv.Redis
	store   *meta.Store
	bucket  sink.Bucket
	cycleTS []uint64 // the cycles' resolved ts
	conn    []string // the consumer's connection flags
}

func newSnapBench(b *testing.B) *snapBench {
	ctx := context.Background()
	rd, g := testenv.StartRedis(b), testenv.StartGCS(b)
	store := meta.NewStore(rd.Client(b), "flowlog", nil)
	info := meta.FlowInfo{CatalogName: "default", FlowName: "f", SourceTableIDs: []uint32{1, 2, 3},
		SinkTableName: meta.TableName{CatalogName: "default", SchemaName: "public", TableName: "out"}, FlownodeIDs: map[uint32]uint64{0: 1}}
	if err := store.CreateFlow(ctx, 1, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		b.Fatal(err)
	}
	bkt, err := gcs.New(ctx, gcs.Config{Bucket: testenv.Bucket, Endpoint: g.Endpoint()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bkt.Close() })
	lease, err := store.AcquireLease(ctx, "flowlog.apply", 0, "member-1")
	if err != nil {
		b.Fatal(err)
	}
	backuptest.OpenWindows(b, store, lease)
	base := event.ComposeTS(time.Now().Add(-24*time.Hour).UnixMilli(), 0)
	return &snapBench{redis: rd, store: store, bucket: bkt, cycleTS: writeSnapBenchLog(b, store, bkt, lease, base),
		conn: []string{"--redis-url", rd.URL, "--gcs-endpoint", g.Endpoint(), "--gcs-bucket", testenv.Bucket, "--group", "g1"}}
}

// writeSnapBenchLog backs up about -snapbench-mib of log in cycles of
// 16 MiB, commits them and advances the checkpoint; it returns the cycles'
// resolved ts.
func writeSnapBenchLog(b *testing.B, store *meta.Store, bkt sink.Bucket, lease meta.Lease, base uint64) []uint64 {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	pool := make([]byte, 1<<20)
	for i := range pool {
		pool[i] = byte('a' + r.IntN(26))
	}
	value := func(n int) []byte { o := r.IntN(len(pool) - n); return pool[o : o+n] }
	ts := base
	var out []uint64
	for cycle, total := 0, 0; total < *benchSnapMiB<<20; cycle++ {
		var es []sinktest.Entry
		for size := 0; size < 16<<20; {
			table, handle := int64(1+r.IntN(3)), int64(r.IntN(*benchSnapKeys))
			start, commit := ts+1, ts+2
			ts += 2
			switch x := r.IntN(10); {
			case x == 0:
				es = append(es, sinktest.WriteRecord(table, handle, commit, event.Write{Type: event.WriteDelete, StartTS: start}))
				size += 40
			case x < 7:
				v := value(64 + r.IntN(64))
				es = append(es, sinktest.WritePut(table, handle, start, commit, v, true))
				size += 40 + len(v)
			default:
				v := value(1024)
				es = append(es, sinktest.DefaultPut(table, handle, start, v), sinktest.WritePut(table, handle, start, commit, v, false))
				size += 80 + len(v)
			}
		}
		_, path := sinktest.WriteCycle(b, bkt, sinktest.Cycle{Catalog: "default", Flow: "f", FlowID: 1, CycleID: fmt.Sprint(cycle),
			Compression: sink.CompressionZstd, ResolvedTS: ts, Entries: es,
			Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: int64(cycle), To: int64(cycle + 1)}}})
		err := store.Commit(ctx, meta.Commit{Leases: []meta.Lease{lease},
			Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: int64(cycle + 1), Checkpoint: ts, HasCheckpoint: true}},
			Metas:      []meta.MetaRef{{FlowID: 1, Path: path, MinResolvedTS: ts}}, Flows: []meta.FlowID{1}, LastFlushTS: ts})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := store.AdvanceCheckpoint(ctx, 1, ts); err != nil {
			b.Fatal(err)
		}
		out = append(out, ts)
		total += 16 << 20
	}
	return out
}

// pollHWM returns the last VmHWM (peak resident set, MiB) of process pid
// read every 20ms until stop is closed.
func pollHWM(pid int, stop <-chan struct{}) float64 {
	var hwm float64
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if st, err := testenv.ProcStatus(pid, "VmHWM"); err == nil {
			hwm = max(hwm, float64(st["VmHWM"])/(1<<20))
		}
		select {
		case <-stop:
			return hwm
		case <-t.C:
		}
	}
}

// dirSum is a digest of the files of dir, names and bytes.
func dirSum(b *testing.B, dir string) string {
	h := sha256.New()
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", e.Name(), len(data))
		h.Write(data)
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:16]
}
