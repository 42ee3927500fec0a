package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
)

// TestReplayLargeValueOnBroker: `consumer replay` of a backup holding a
// 1.5 MB value, into topics of the broker the suite runs on (Apache Kafka
// in CI). Into a topic of the broker's default max.message.bytes (1 MiB)
// the run stops before the value, exits 1 and names its size and the
// limit (docs/RESTORE.md, "Replay"), with the records before it whole;
// once the topic takes 2 MiB, the same command finishes, and the topic
// then equals one replayed whole into a roomy topic, the value included.
func TestReplayLargeValueOnBroker(t *testing.T) {
	big := make([]byte, 1500<<10)
	for i := range big {
		big[i] = byte('a' + i%26)
	}
	copy(big, loadgen.Marker+"big-")
	const regions = 2
	src := replayBackup(t, "big", []int64{1}, regions, []replayPhase{
		{load: loadgen.Config{Events: 400, Tables: []int64{1}, Regions: regions, Seed: 21, HeartbeatEvery: 2}},
	}, func(src *replaySource) uint64 {
		addr := src.c.Broker.Addr
		alterTopic(t, addr, testenv.ApplyTopic, "4194304")
		ck, _, err := src.store.GlobalCheckpointTS(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		start := event.ComposeTS(event.PhysicalTime(ck).Add(time.Second).UnixMilli(), 0)
		commit := event.ComposeTS(event.PhysicalTime(ck).Add(2*time.Second).UnixMilli(), 0)
		pre, done := replayLongBatches(start-1, []replayLongTxn{{table: 1, handle: longHandle, start: start, commit: commit, value: big}})
		pre.RegionID, done.RegionID = 1, 1
		replayProduce(t, addr, testenv.ApplyTopic, pre, done)
		runProducer(t, "heartbeat", "--brokers", addr, "--regions", strconv.Itoa(regions), "--ts", strconv.FormatUint(commit+1, 10))
		return commit + 1
	})
	addr := src.c.Broker.Addr
	createTopics(t, addr, 2, "big.roomy", "big.tight")
	alterTopic(t, addr, "big.roomy", "2097152")

	if res := replayRun(t, src, "--flow", "big", "--to-topic", "big.roomy"); res.code != 0 {
		t.Fatalf("replay into a topic that takes 2 MiB exited %d:\n%s", res.code, res.out)
	}
	whole := readReplayed(t, addr, "big.roomy")
	carried := false
	for _, recs := range whole {
		for _, r := range recs {
			for _, ev := range r.batch.Events {
				carried = carried || bytes.Equal(ev.Value, big)
			}
		}
	}
	if !carried {
		t.Fatalf("the 1.5 MB value is not in the %d records of the roomy topic", replayCount(whole))
	}

	res := replayRun(t, src, "--flow", "big", "--to-topic", "big.tight")
	if res.code != 1 || !strings.Contains(res.out, "1048588") {
		t.Fatalf("replay into a topic of the default max.message.bytes exited %d, want 1 naming the limit 1048588:\n%s", res.code, res.out)
	}
	t.Logf("the refusal: %s", lastLine(res.out))
	part := readReplayed(t, addr, "big.tight")
	if replayCount(part) == 0 {
		t.Errorf("the refused replay wrote nothing of what came before the value")
	}
	for p, recs := range part {
		if d := diffTopics(map[int32][]replayedRecord{p: whole[p][:min(len(recs), len(whole[p]))]}, map[int32][]replayedRecord{p: recs}); len(recs) > len(whole[p]) || d != "" {
			t.Errorf("partition %d of the refused replay is not a prefix of the whole replay's: %s", p, d)
		}
	}

	alterTopic(t, addr, "big.tight", "2097152")
	if res := replayRun(t, src, "--flow", "big", "--to-topic", "big.tight"); res.code != 0 {
		t.Fatalf("the same replay once the topic takes 2 MiB exited %d:\n%s", res.code, res.out)
	}
	if d := diffTopics(whole, readReplayed(t, addr, "big.tight")); d != "" {
		t.Errorf("the resumed topic differs from one uninterrupted replay's: %s", d)
	}
}

// alterTopic sets topic's max.message.bytes on the broker at addr.
func alterTopic(t *testing.T, addr, topic, maxMessage string) {
	t.Helper()
	adm := newAdmin(t, addr)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: kadm.StringPtr(maxMessage)}}, topic)
	if err == nil {
		for _, r := range res {
			err = r.Err
		}
	}
	if err != nil {
		t.Fatalf("set max.message.bytes of %s to %s: %v", topic, maxMessage, err)
	}
	// Apache Kafka answers the change once its controller took it; a
	// broker describes it once it has applied the metadata.
	waitFor(t, 30*time.Second, func() (bool, string) {
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err == nil && len(rcs) == 1 {
			for _, c := range rcs[0].Configs {
				if c.Key == "max.message.bytes" {
					return c.MaybeValue() == maxMessage, fmt.Sprintf("%s describes max.message.bytes %s", topic, c.MaybeValue())
				}
			}
		}
		return false, fmt.Sprintf("describe %s: %v", topic, err)
	})
}
