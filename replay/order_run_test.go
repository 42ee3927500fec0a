package replay_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/replay"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

func part(p int32, from, to int64) sink.OffsetRange {
	return sink.OffsetRange{Topic: "flowlog.apply", Partition: p, From: from, To: to}
}

func inRegion(r uint64, es ...sinktest.Entry) []sinktest.Entry {
	for i := range es {
		es[i].RegionID = r
	}
	return es
}

// TestReplayRegionOrderAcrossCycles: each region's events come out in the
// order its partition's records were consumed, although the meta list (by
// min resolved ts) has a later cycle of partition 1 first, and that cycle
// holds no record of partition 0; within a cycle a region's default-CF
// value goes before the write-CF put that needs it.
func TestReplayRegionOrderAcrossCycles(t *testing.T) {
	e := backuptest.New(t, testenv.StartRedis(t), testenv.StartGCS(t), "order", "order", 1)
	ts := func(ms int) uint64 { return e.TS(time.Duration(ms) * time.Millisecond) }
	long := []byte(fmt.Sprintf("%0300d", 7))
	// X: partition 0 (region 1) and partition 1 (region 2), listed at 150.
	e.CommitOffsets(t, ts(150), []sink.OffsetRange{part(0, 0, 2), part(1, 0, 5)}, slices.Concat(
		inRegion(1, sinktest.WritePut(1, 1, ts(100), ts(101), []byte("x1"), true)),
		inRegion(2, sinktest.WritePut(1, 2, ts(105), ts(110), long, false), sinktest.DefaultPut(1, 2, ts(105), long),
			sinktest.WritePut(1, 2, ts(111), ts(112), []byte("x2"), true)))...)
	// Y: partition 0 only (region 3), listed at 200.
	e.CommitOffsets(t, ts(200), []sink.OffsetRange{part(0, 2, 4)},
		inRegion(3, sinktest.WritePut(1, 3, ts(180), ts(181), []byte("y3"), true))...)
	// Z: partition 1 only, consumed after X, listed at 140 (before X).
	e.CommitOffsets(t, ts(140), []sink.OffsetRange{part(1, 5, 9)},
		inRegion(2, sinktest.WritePut(1, 2, ts(120), ts(121), []byte("z2"), true))...)
	// W: both partitions, last.
	e.CommitOffsets(t, ts(300), []sink.OffsetRange{part(0, 4, 6), part(1, 9, 10)}, slices.Concat(
		inRegion(1, sinktest.WritePut(1, 1, ts(250), ts(251), []byte("w1"), true)),
		inRegion(2, sinktest.WritePut(1, 2, ts(260), ts(261), []byte("w2"), true)))...)

	k := kafka(t, 4, "out")
	res, err := replay.Run(context.Background(), e.Source(), target(t, k, "out"),
		replay.Request{Flow: backup.Lookup{Catalog: "default", Name: "f"}, MaxClockSkew: backuptest.Skew, Topic: "out"})
	if err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, k, "out")
	if res.To != ts(300) || int64(len(recs)) != res.Records || res.Regions != 3 {
		t.Fatalf("result %+v, %d records read", res, len(recs))
	}
	slices.SortFunc(recs, func(a, b record) int { return int(a.seq - b.seq) })
	got := map[uint64][]string{}
	parts := map[uint64]map[int32]bool{}
	for _, r := range recs {
		if parts[r.batch.RegionID] == nil {
			parts[r.batch.RegionID] = map[int32]bool{}
		}
		parts[r.batch.RegionID][r.partition] = true
		for _, ev := range r.batch.Events {
			_, at, _ := event.SplitDataKey(ev.Key)
			got[r.batch.RegionID] = append(got[r.batch.RegionID], fmt.Sprintf("%s@%d", ev.CF, (at-ts(0))>>18))
		}
	}
	ms := func(cf event.CF, m int) string { return fmt.Sprintf("%s@%d", cf, uint64(m)) }
	want := map[uint64][]string{
		1: {ms(event.CFWrite, 101), ms(event.CFWrite, 251)},
		2: {ms(event.CFDefault, 105), ms(event.CFWrite, 110), ms(event.CFWrite, 112), ms(event.CFWrite, 121), ms(event.CFWrite, 261)},
		3: {ms(event.CFWrite, 181)},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events by region:\n%v\nwant\n%v", got, want)
	}
	for r, ps := range parts {
		if len(ps) != 1 {
			t.Errorf("region %d's records went to partitions %v", r, ps)
		}
	}
	checkResolved(t, recs, ts(300))
}

// TestReplayLogEarlyValues: a log replay from A sends, before anything
// else, exactly the default-CF values at or before A that its puts after A
// need, also from a default-CF chunk that straddles A, and nothing else at
// or before A.
func TestReplayLogEarlyValues(t *testing.T) {
	e := backuptest.New(t, testenv.StartRedis(t), testenv.StartGCS(t), "early", "early", 1)
	ts := func(ms int) uint64 { return e.TS(time.Duration(ms) * time.Millisecond) }
	long := func(c byte) []byte { return []byte(fmt.Sprintf("%c%0299d", c, 0)) }
	// One cycle: values of rows 1, 2, 3 prewritten at 10, 30, 38 (one
	// default-CF chunk from 10 to 38), row 4's at 20 never committed; row
	// 3 committed at 39, row 1 at 40.
	e.CommitOffsets(t, ts(50), []sink.OffsetRange{part(0, 0, 1)}, inRegion(1,
		sinktest.DefaultPut(1, 1, ts(10), long('a')), sinktest.DefaultPut(1, 4, ts(20), long('d')),
		sinktest.DefaultPut(1, 2, ts(30), long('b')), sinktest.DefaultPut(1, 3, ts(38), long('c')),
		sinktest.WritePut(1, 3, ts(38), ts(39), long('c'), false), sinktest.WritePut(1, 1, ts(10), ts(40), long('a'), false))...)
	// Row 2 committed at 60.
	e.CommitOffsets(t, ts(100), []sink.OffsetRange{part(0, 1, 2)}, inRegion(1, sinktest.WritePut(1, 2, ts(30), ts(60), long('b'), false))...)

	k := kafka(t, 1, "out")
	_, err := replay.Run(context.Background(), e.Source(), target(t, k, "out"),
		replay.Request{Flow: backup.Lookup{Catalog: "default", Name: "f"}, MaxClockSkew: backuptest.Skew, Topic: "out", From: ts(35)})
	if err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, k, "out")
	var got []string
	for _, r := range recs {
		for _, ev := range r.batch.Events {
			raw, at, _ := event.DecodeDataKey(ev.Key)
			got = append(got, fmt.Sprintf("%s row %d @%d", ev.CF, raw[len(raw)-1], (at-ts(0))>>18))
		}
	}
	want := []string{"CF_DEFAULT row 1 @10", "CF_DEFAULT row 2 @30", "CF_DEFAULT row 3 @38", "CF_WRITE row 3 @39", "CF_WRITE row 1 @40", "CF_WRITE row 2 @60"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("replayed\n%v\nwant\n%v", got, want)
	}
	checkResolved(t, recs, ts(100))
}
