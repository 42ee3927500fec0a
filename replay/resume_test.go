package replay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/replay"
)

// stopAfter is a target that writes its first n records, waits until they
// are written, and then fails: a replay interrupted after n records.
type stopAfter struct {
	replay.Target
	n int
}

var errStopped = errors.New("stopped")

func (s *stopAfter) Produce(ctx context.Context, r *kgo.Record) error {
	if s.n == 0 {
		if err := s.Target.Flush(ctx); err != nil {
			return err
		}
		return errStopped
	}
	s.n--
	return s.Target.Produce(ctx, r)
}

// topicContent is what a plain consumer reads of topic, per partition in
// offset order: seq, run and value of each record.
func topicContent(t testing.TB, recs []record) map[int32][]string {
	out := map[int32][]string{}
	for _, r := range recs {
		out[r.partition] = append(out[r.partition], fmt.Sprintf("%d %s %x", r.seq, r.run, r.value))
	}
	return out
}

// TestReplayResume: a replay stopped after any number of records and run
// again with the same arguments leaves the topic exactly as one
// uninterrupted run does: each record once, in order; the re-run skips
// exactly what the first wrote.
func TestReplayResume(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	h := backuptest.NewHistory(t, rd, g, "resume", 3, 20, 12)
	ctx := context.Background()
	for _, format := range []replay.Format{replay.FormatProtobuf, replay.FormatJSON} {
		req := replay.Request{Flow: h.Flow, MaxClockSkew: backuptest.Skew, Topic: "out", Format: format, From: h.MS(100, 0)}
		whole := kafka(t, 3, "out")
		res, err := replay.Run(ctx, h.Source(), target(t, whole, "out"), req)
		if err != nil {
			t.Fatal(err)
		}
		want := topicContent(t, readAll(t, whole, "out"))
		for _, n := range []int{0, 1, 7, int(res.Records / 2), int(res.Records - 1)} {
			t.Run(fmt.Sprintf("%s/after %d of %d", format, n, res.Records), func(t *testing.T) {
				k := kafka(t, 3, "out")
				if _, err := replay.Run(ctx, h.Source(), &stopAfter{Target: target(t, k, "out"), n: n}, req); !errors.Is(err, errStopped) {
					t.Fatalf("interrupted run: %v", err)
				}
				again, err := replay.Run(ctx, h.Source(), target(t, k, "out"), req)
				if err != nil {
					t.Fatal(err)
				}
				if again.Skipped != int64(n) || again.Records != res.Records-int64(n) || again.RunID != res.RunID {
					t.Errorf("re-run: %d records, %d skipped, run %s; want %d, %d, %s", again.Records, again.Skipped, again.RunID, res.Records-int64(n), n, res.RunID)
				}
				if got := topicContent(t, readAll(t, k, "out")); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("topic after a stop and a re-run differs from one uninterrupted run:\n%v\nwant\n%v", got, want)
				}
			})
		}
	}
}

// TestReplayResumeBehindOtherRecords: the re-run finds what the first run
// wrote even when other producers wrote more than a tail window's worth
// to the topic since.
func TestReplayResumeBehindOtherRecords(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	h := backuptest.NewHistory(t, rd, g, "behind", 4, 10, 10)
	ctx := context.Background()
	req := replay.Request{Flow: h.Flow, MaxClockSkew: backuptest.Skew, Topic: "out"}
	whole := kafka(t, 2, "out")
	res, err := replay.Run(ctx, h.Source(), target(t, whole, "out"), req)
	if err != nil {
		t.Fatal(err)
	}
	want := topicContent(t, readAll(t, whole, "out"))
	k := kafka(t, 2, "out")
	n := int(res.Records / 2)
	if _, err := replay.Run(ctx, h.Source(), &stopAfter{Target: target(t, k, "out"), n: n}, req); !errors.Is(err, errStopped) {
		t.Fatalf("interrupted run: %v", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.ListenAddrs()...), kgo.DefaultProduceTopic("out"), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 6000 {
		cl.Produce(ctx, &kgo.Record{Value: []byte(fmt.Sprint("other ", i))}, nil)
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	again, err := replay.Run(ctx, h.Source(), target(t, k, "out"), req)
	if err != nil || again.Skipped != int64(n) {
		t.Fatalf("re-run: %+v, %v; want %d skipped", again, err, n)
	}
	var mine []record
	for _, r := range readAll(t, k, "out") {
		if r.run != "" {
			mine = append(mine, r)
		}
	}
	if got := topicContent(t, mine); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the run's records after a stop, other records and a re-run:\n%v\nwant\n%v", got, want)
	}
}
