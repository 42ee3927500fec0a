package replay_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/replay"
)

// kafka is a kfake cluster with topic "out" of parts partitions.
func kafka(t testing.TB, parts int32, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func target(t testing.TB, c *kfake.Cluster, topic string) *replay.KafkaTarget {
	t.Helper()
	tg, err := replay.NewKafkaTarget(context.Background(), replay.KafkaTargetConfig{Topic: topic, MaxBuffered: 8 << 20}, kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tg.Close)
	return tg
}

// record is one replayed record as a plain consumer reads it.
type record struct {
	partition int32
	seq       int64
	run       string
	batch     event.Batch
	value     string
}

// readAll reads every record of topic.
func readAll(t testing.TB, c *kfake.Cluster, topic string) []record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends := map[int32]int64{}
	{
		adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		defer adm.Close()
		for p := int32(0); ; p++ {
			off, err := endOffset(ctx, adm, topic, p)
			if err != nil {
				break
			}
			ends[p] = off
		}
	}
	got := map[int32]int64{}
	done := func() bool {
		for p, e := range ends {
			if got[p] < e {
				return false
			}
		}
		return true
	}
	var out []record
	for !done() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("reading %s: %v (have %v of %v)", topic, ctx.Err(), got, ends)
		}
		fs.EachRecord(func(r *kgo.Record) {
			got[r.Partition] = r.Offset + 1
			rec := record{partition: r.Partition, value: string(r.Value)}
			ct := ""
			for _, h := range r.Headers {
				switch h.Key {
				case replay.HeaderRun:
					rec.run = string(h.Value)
				case replay.HeaderSeq:
					rec.seq, _ = strconv.ParseInt(string(h.Value), 10, 64)
				case "content-type":
					ct = string(h.Value)
				}
			}
			if rec.run == "" { // another producer's
				out = append(out, rec)
				return
			}
			if err := event.DecodeBatch(&rec.batch, r.Value, ct); err != nil {
				t.Errorf("record %d of partition %d: %v", r.Offset, r.Partition, err)
			}
			if k := strconv.FormatUint(rec.batch.RegionID, 10); k != string(r.Key) {
				t.Errorf("record key %q, region %s", r.Key, k)
			}
			rec.batch.Events = slices.Clone(rec.batch.Events)
			out = append(out, rec)
		})
	}
	return out
}

// state is the MVCC read at ts of the replayed events: raw key hex ->
// value.
func state(t testing.TB, recs []record, ts uint64) map[string]string {
	t.Helper()
	type ver struct {
		commit uint64
		w      event.Write
	}
	latest := map[string]ver{}
	defaults := map[string][]byte{}
	for _, r := range recs {
		for _, e := range r.batch.Events {
			raw, kts, err := event.DecodeDataKey(e.Key)
			if err != nil {
				t.Fatal(err)
			}
			if e.Op != event.OpPut {
				continue
			}
			if e.CF == event.CFDefault {
				defaults[fmt.Sprintf("%x/%d", raw, kts)] = e.Value
				continue
			}
			w, err := event.DecodeWrite(e.Value)
			if err != nil {
				t.Fatal(err)
			}
			if w.Type != event.WritePut && w.Type != event.WriteDelete || kts > ts {
				continue
			}
			k := fmt.Sprintf("%x", raw)
			if v, ok := latest[k]; !ok || kts > v.commit {
				w.ShortValue = slices.Clone(w.ShortValue)
				latest[k] = ver{kts, w}
			}
		}
	}
	out := map[string]string{}
	for k, v := range latest {
		switch {
		case v.w.Type == event.WriteDelete:
		case v.w.HasShortValue:
			out[k] = string(v.w.ShortValue)
		default:
			d, ok := defaults[fmt.Sprintf("%s/%d", k, v.w.StartTS)]
			if !ok {
				t.Errorf("key %s: no default-CF value at start ts %d", k, v.w.StartTS)
			}
			out[k] = string(d)
		}
	}
	return out
}

// historyState is h's generated state at ts as state gives it.
func historyState(h *backuptest.History, ts uint64) map[string]string {
	out := map[string]string{}
	for hd, v := range h.State(ts) {
		out[backuptest.RowHex(1, hd)] = v
	}
	return out
}

func TestReplayLogEqualsHistory(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	h := backuptest.NewHistory(t, rd, g, "log", 7, 20, 10)
	k := kafka(t, 3, "out")
	res, err := replay.Run(context.Background(), h.Source(), target(t, k, "out"), replay.Request{Flow: h.Flow, MaxClockSkew: backuptest.Skew, Topic: "out"})
	if err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, k, "out")
	if int64(len(recs)) != res.Records || res.To != h.Checkpoint {
		t.Fatalf("read %d records, result %+v; checkpoint %d", len(recs), res, h.Checkpoint)
	}
	for _, ts := range []uint64{h.Checkpoint, h.MS(300, 0), h.MS(700, 5)} {
		if got, want := state(t, recs, ts), historyState(h, ts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("state at %d of the replayed log:\n%v\nwant\n%v", ts, got, want)
		}
	}
}

// checkResolved fails unless every region's records carry resolved ts
// that no later event of the region is at or below, and the region's last
// record carries to.
func checkResolved(t testing.TB, recs []record, to uint64) {
	t.Helper()
	byRegion := map[uint64][]record{}
	for _, r := range recs {
		byRegion[r.batch.RegionID] = append(byRegion[r.batch.RegionID], r)
	}
	for region, rs := range byRegion {
		slices.SortFunc(rs, func(a, b record) int { return int(a.seq - b.seq) })
		var res uint64
		for _, r := range rs {
			for _, e := range r.batch.Events {
				_, ts, _ := event.SplitDataKey(e.Key)
				if ts <= res {
					t.Fatalf("region %d: record %d holds an event at %d, after a record resolved at %d", region, r.seq, ts, res)
				}
			}
			if r.batch.ResolvedTS < res {
				t.Fatalf("region %d: record %d resolved at %d, after %d", region, r.seq, r.batch.ResolvedTS, res)
			}
			res = r.batch.ResolvedTS
		}
		if res != to {
			t.Errorf("region %d ends resolved at %d, want %d", region, res, to)
		}
	}
}

// TestReplayStateThenLog: the state at A followed by the log of (A, T] is
// every state of the history in [A, T], including the values prewritten
// at or before A that the puts after A need; the log's resolved ts never
// pass an event not yet sent, and every region ends at T.
func TestReplayStateThenLog(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	h := backuptest.NewHistory(t, rd, g, "statelog", 11, 30, 12)
	// A on a cycle boundary, and inside a cycle: chunks then straddle A,
	// default-CF ones holding values at or before A that puts after it
	// need.
	for _, a := range []uint64{h.MS(600, 0), h.MS(617, 3), h.MS(633, 0), h.MS(745, 1), h.MS(1010, 0)} {
		t.Run(fmt.Sprint(a), func(t *testing.T) { stateThenLog(t, h, a) })
	}
}

func stateThenLog(t *testing.T, h *backuptest.History, a uint64) {
	k := kafka(t, 3, "state", "log")
	ctx := context.Background()
	sres, err := replay.Run(ctx, h.Source(), target(t, k, "state"), replay.Request{Flow: h.Flow, MaxClockSkew: backuptest.Skew,
		Mode: replay.ModeState, To: a, Topic: "state", TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	lres, err := replay.Run(ctx, h.Source(), target(t, k, "log"), replay.Request{Flow: h.Flow, MaxClockSkew: backuptest.Skew,
		From: a, Topic: "log", Parallel: 2, MaxMemory: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	srecs, lrecs := readAll(t, k, "state"), readAll(t, k, "log")
	if sres.To != a || lres.From != a || lres.To != h.Checkpoint || int64(len(srecs)) != sres.Records || int64(len(lrecs)) != lres.Records {
		t.Fatalf("state %+v (%d read), log %+v (%d read)", sres, len(srecs), lres, len(lrecs))
	}
	checkResolved(t, srecs, a)
	checkResolved(t, lrecs, h.Checkpoint)
	// Every region the state used ends at T in the log too: a consumer of
	// both passes A only once the log resolves them.
	logEnd := map[uint64]uint64{}
	for _, r := range lrecs {
		logEnd[r.batch.RegionID] = max(logEnd[r.batch.RegionID], r.batch.ResolvedTS)
	}
	for _, r := range srecs {
		if got := logEnd[r.batch.RegionID]; got != h.Checkpoint {
			t.Fatalf("region %d of the state replay ends in the log at %d, want %d", r.batch.RegionID, got, h.Checkpoint)
		}
	}
	all := append(slices.Clone(srecs), lrecs...)
	for _, ts := range []uint64{a, a + 1, h.MS(900, 3), h.MS(1200, 0), h.Checkpoint} {
		if ts < a {
			continue
		}
		if got, want := state(t, all, ts), historyState(h, ts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("state at %d of the replayed state and log:\n%v\nwant\n%v", ts, got, want)
		}
	}
	// The log holds no event at or below A but the default-CF values the
	// puts after A need.
	early, needed := map[string]bool{}, map[string]bool{}
	for _, r := range lrecs {
		for _, e := range r.batch.Events {
			enc, ts, _ := event.SplitDataKey(e.Key)
			if ts <= a {
				if e.CF != event.CFDefault {
					t.Fatalf("log record %d holds a write-CF event at %d <= from %d", r.seq, ts, a)
				}
				early[string(e.Key)] = true
			}
			if w, err := event.DecodeWrite(e.Value); e.CF == event.CFWrite && err == nil && w.Type == event.WritePut && !w.HasShortValue {
				needed[fmt.Sprintf("%x%016x", enc, ^w.StartTS)] = true
			}
		}
	}
	for k := range early {
		if !needed[fmt.Sprintf("%x", k)] {
			t.Errorf("the log holds value %x prewritten at or before from, which no put after from needs", k)
		}
	}
	if len(early) == 0 {
		t.Errorf("no value prewritten at or before from %d was replayed; the history should need some", a)
	}
}
