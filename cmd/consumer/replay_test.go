package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// replayKafka is a kfake cluster with topic out of 2 partitions, and the
// flags that write to it.
func replayKafka(t *testing.T) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return []string{"--brokers", strings.Join(c.ListenAddrs(), ","), "--to-topic", "out"}
}

// TestReplayCommandJSON: `consumer replay --json` prints one document with
// the run's flow, mode, range, topic and counts; a second run with the
// same arguments writes nothing and says it resumed.
func TestReplayCommandJSON(t *testing.T) {
	e := backuptest.NewTimed(t)
	k := replayKafka(t)
	var first, second replayJSON
	prom := filepath.Join(t.TempDir(), "replay.prom")
	for i, doc := range []*replayJSON{&first, &second} {
		stdout, err := runIn(t, e.Conn, "replay", append(k, "--flow", "f", "--json", "--metrics-file", prom)...)
		if err != nil {
			t.Fatalf("replay %d: %v\n%s", i, err, stdout)
		}
		if err := json.Unmarshal([]byte(stdout), doc); err != nil {
			t.Fatalf("replay %d: %v in\n%s", i, err, stdout)
		}
	}
	want := e.TS(50 * time.Minute)
	if first.Flow.Name != "f" || first.Mode != "log" || first.To.TS != want || first.From.TS != 0 || first.Topic != "out" ||
		first.Records == 0 || first.Bytes == 0 || first.Skipped != 0 || first.Resumed || len(first.Tables) != 2 || first.RunID == "" {
		t.Errorf("first run: %+v", first)
	}
	if second.Records != 0 || second.Skipped != first.Records || !second.Resumed || second.RunID != first.RunID {
		t.Errorf("second run: %+v, first %+v", second, first)
	}
	raw, err := os.ReadFile(prom) // the second run's
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`flowlog_op_records\{command="replay",flow="default/f"\} 0`,
		`flowlog_op_bytes\{command="replay",flow="default/f"\} 0`,
		`flowlog_op_duration_seconds\{command="replay"\} `,
		`flowlog_op_last_success_timestamp_seconds\{command="replay"\} [1-9]`,
	} {
		if !regexp.MustCompile(re).Match(raw) {
			t.Errorf("metrics file lacks %s:\n%s", re, raw)
		}
	}
}

// TestReplayCommandUsage: `replay -h` prints replay's help on stdout in
// the shared style, with only the Kafka flags it uses; a bad command line
// exits 2 with a message that names the flag.
func TestReplayCommandUsage(t *testing.T) {
	h := runConsumer(t, time.Minute, nil, "replay", "-h")
	if h.code != 0 || !strings.HasPrefix(h.stdout, "usage: consumer replay --flow F --to-topic X") || !strings.Contains(h.stdout, "\nKafka:\n  --brokers") ||
		!strings.Contains(h.stdout, "--start-key") || strings.Contains(h.stdout, "--apply-topic") || h.stderr != "" {
		t.Errorf("replay -h: exit %d, stdout:\n%s\nstderr:\n%s", h.code, h.stdout, h.stderr)
	}
	for _, tc := range []struct {
		args   []string
		errSub string
	}{
		{[]string{"--flow", "f"}, "--to-topic is required"},
		{[]string{"--flow", "f", "--to-topic", "x", "--mode", "nope"}, `--mode "nope"`},
		{[]string{"--flow", "f", "--to-topic", "x", "--format", "xml"}, `--format "xml"`},
		{[]string{"--flow", "f", "--to-topic", "x", "--compression", "brotli"}, `--compression "brotli": want none, gzip, snappy, lz4 or zstd`},
		{[]string{"--flow", "f", "--to-topic", "x", "--mode", "state", "--from", "5"}, "--from applies to --mode log only"},
		{[]string{"--flow", "f", "--to-topic", "x", "--from", "9", "--to", "5"}, "is not before --to"},
	} {
		r := runConsumer(t, time.Minute, nil, append([]string{"replay"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.errSub) {
			t.Errorf("replay %q: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.errSub)
		}
	}
}

// TestReplayCommandLeftOut: a table that is not restorable at --to is
// left out and named on stderr and in the JSON summary; a replay with no
// table left fails and says why.
func TestReplayCommandLeftOut(t *testing.T) {
	e := backuptest.NewTimed(t)
	k := replayKafka(t)
	var doc replayJSON
	stderr, stdout, err := captureStderr(t, func() error {
		return commands["replay"].run(context.Background(), e.Args(append(k, "--flow", "f", "--tables", "1,3", "--json")...))
	})
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatalf("%v in\n%s", err, stdout)
	}
	if !strings.Contains(stderr, "left out table 3: not a table of the flow") || len(doc.LeftOut) != 1 || doc.LeftOut[0].Table != 3 || fmt.Sprint(doc.Tables) != "[1]" {
		t.Errorf("stderr %q, summary %+v; want table 3 left out", stderr, doc)
	}
	_, err = runIn(t, e.Conn, "replay", append(k, "--flow", "f", "--tables", "3")...)
	if err == nil || !strings.Contains(err.Error(), "no table of flow default/f (id 1) is restorable") {
		t.Errorf("replay of table 3 alone: %v, want a refusal", err)
	}
}

// TestReplayCommandInterrupt: SIGINT stops a replay with exit 130 and a
// line saying how far it got; the same command again resumes, and the
// topic then holds every record of the run once.
func TestReplayCommandInterrupt(t *testing.T) {
	h := backuptest.NewHistory(t, testenv.StartRedis(t), testenv.StartGCS(t), "intr", 5, 20, 10)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := strings.Join(c.ListenAddrs(), ",")
	args := append([]string{"replay"}, h.Args("--brokers", brokers, "--to-topic", "out", "--flow", "f", "--to", fmt.Sprint(h.Checkpoint))...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := consumerCmd(ctx, "", nil, append(args, "--rate", "2KiB")...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	written := func() int64 {
		ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "out")
		if err != nil {
			return 0 // not yet
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	for written() < 3 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := procEnd(t, ctx, cmd.Wait(), args, procResult{stdout: stdout.String(), stderr: stderr.String()})
	if r.code != 130 || !strings.Contains(r.stderr, "interrupted: replay of flow default/f (id 1) into out") || !strings.Contains(r.stderr, "re-run the same command") {
		t.Fatalf("interrupted replay: exit %d, stderr %q", r.code, r.stderr)
	}
	before := written()
	again := runConsumer(t, time.Minute, nil, append(args, "--json")...)
	var doc replayJSON
	if err := json.Unmarshal([]byte(again.stdout), &doc); again.code != 0 || err != nil {
		t.Fatalf("re-run: exit %d, %v\n%s\n%s", again.code, err, again.stdout, again.stderr)
	}
	if !doc.Resumed || doc.Skipped != before || written() != doc.Skipped+doc.Records {
		t.Errorf("re-run skipped %d and wrote %d records; the topic held %d before and %d after", doc.Skipped, doc.Records, before, written())
	}
}

// topicRecords reads every record of topic out at brokers: per partition,
// key, headers and value of each, in offset order.
func topicRecords(t *testing.T, brokers []string) map[int32][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("out"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "out")
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	out := map[int32][]string{}
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading out: %v", ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			out[r.Partition] = append(out[r.Partition], fmt.Sprintf("%s %v %x", r.Key, r.Headers, r.Value))
			if r.Offset+1 >= left[r.Partition] {
				delete(left, r.Partition)
			}
		})
	}
	return out
}

// TestReplayCommandFromBucket: with Redis gone, `replay --from-bucket`
// writes exactly the records the Redis-backed replay writes.
func TestReplayCommandFromBucket(t *testing.T) {
	e := backuptest.NewTimed(t)
	e.CommitV2(t, e.TS(56*time.Minute), sinktest.WritePut(2, 9, e.TS(51*time.Minute), e.TS(52*time.Minute), []byte("v2 nine"), true),
		sinktest.WritePut(1, 3, e.TS(53*time.Minute), e.TS(54*time.Minute), []byte("three"), true))
	e.WriteCatalog(t, 1, 1)
	noRedis := append(append([]string{}, e.Conn...), "--redis-url", "redis://"+testenv.ClosedAddr(t))
	for _, mode := range []string{"log", "state"} {
		withRedis, fromBucket := replayKafka(t), replayKafka(t)
		if out, err := runIn(t, e.Conn, "replay", append(withRedis, "--flow", "f", "--mode", mode, "--temp-dir", t.TempDir())...); err != nil {
			t.Fatalf("replay: %v\n%s", err, out)
		}
		if out, err := runIn(t, noRedis, "replay", append(fromBucket, "--flow", "f", "--mode", mode, "--from-bucket", "--temp-dir", t.TempDir())...); err != nil {
			t.Fatalf("replay --from-bucket: %v\n%s", err, out)
		}
		want, got := topicRecords(t, strings.Split(withRedis[1], ",")), topicRecords(t, strings.Split(fromBucket[1], ","))
		if len(want) == 0 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s mode: --from-bucket wrote\n%v\nthe Redis-backed replay\n%v", mode, got, want)
		}
	}
}

// TestReplayCommandNoTopic: a target topic that does not exist fails the
// replay, which writes nothing and says to create it.
func TestReplayCommandNoTopic(t *testing.T) {
	e := backuptest.NewTimed(t)
	k := replayKafka(t)
	_, err := runIn(t, e.Conn, "replay", k[0], k[1], "--to-topic", "missing", "--flow", "f")
	if err == nil || !strings.Contains(err.Error(), "topic missing does not exist: create it first") {
		t.Errorf("replay into a missing topic: %v", err)
	}
}
