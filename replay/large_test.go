package replay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/replay"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// A value larger than Kafka's default 1 MB message limit replays into a
// topic whose max.message.bytes takes it (docs/RESTORE.md, "Replay"); into
// one that does not, the replay fails naming the limit, the records before
// the value are written whole, and once the topic takes it the same replay
// resumes and leaves the topic as the first one.
func TestReplayLargeValue(t *testing.T) {
	e := backuptest.New(t, testenv.StartRedis(t), testenv.StartGCS(t), "large", "large", 1)
	big := make([]byte, 1500<<10)
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	e.Commit(t, e.TS(10*time.Minute), sinktest.WritePut(1, 1, e.TS(time.Minute), e.TS(2*time.Minute), []byte("small"), true))
	e.Commit(t, e.TS(20*time.Minute), sinktest.DefaultPut(1, 2, e.TS(11*time.Minute), big),
		sinktest.WritePut(1, 2, e.TS(11*time.Minute), e.TS(12*time.Minute), big, false))
	e.Commit(t, e.TS(30*time.Minute), sinktest.WritePut(1, 3, e.TS(21*time.Minute), e.TS(22*time.Minute), []byte("after"), true))
	c := kafka(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for topic, cfg := range map[string]map[string]*string{"roomy": {"max.message.bytes": kadm.StringPtr("2097152")}, "tight": nil} {
		if _, err := adm.CreateTopic(ctx, 2, 1, cfg, topic); err != nil {
			t.Fatal(err)
		}
	}
	req := replay.Request{Flow: backup.Lookup{Catalog: "default", Name: "f"}, MaxClockSkew: backuptest.Skew}

	req.Topic = "roomy"
	if _, err := replay.Run(ctx, e.Source(), target(t, c, "roomy"), req); err != nil {
		t.Fatalf("replay into a topic that takes 2 MiB: %v", err)
	}
	want := readAll(t, c, "roomy")
	carried := false
	for _, r := range want {
		for _, ev := range r.batch.Events {
			carried = carried || string(ev.Value) == string(big)
		}
	}
	if !carried {
		t.Errorf("the 1.5 MB value is not in the records of the roomy topic (%d records)", len(want))
	}

	req.Topic = "tight"
	_, err = replay.Run(ctx, e.Source(), target(t, c, "tight"), req)
	var tooLarge *replay.RecordTooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.MaxBatch != 1048588 || tooLarge.Bytes <= len(big) || tooLarge.Events != 1 {
		t.Fatalf("replay into a topic of the default max.message.bytes: %v, want a RecordTooLargeError at 1048588", err)
	}
	t.Logf("%v", err)
	got := topicContent(t, readAll(t, c, "tight"))
	whole := topicContent(t, want)
	for p, recs := range got {
		if len(recs) > len(whole[p]) || fmt.Sprint(recs) != fmt.Sprint(whole[p][:len(recs)]) {
			t.Errorf("partition %d of the failed replay is not a prefix of the whole replay's", p)
		}
	}
	if len(got) == 0 {
		t.Errorf("the failed replay wrote nothing of what came before the value")
	}

	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: kadm.StringPtr("2097152")}}, "tight"); err != nil {
		t.Fatal(err)
	}
	if _, err := replay.Run(ctx, e.Source(), target(t, c, "tight"), req); err != nil {
		t.Fatalf("replay again once the topic takes the value: %v", err)
	}
	if got := topicContent(t, readAll(t, c, "tight")); fmt.Sprint(got) != fmt.Sprint(whole) {
		t.Errorf("the resumed topic differs from one uninterrupted replay's")
	}
}
