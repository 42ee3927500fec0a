package replay_test

import (
	"context"
	"fmt"
	"io"
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

// TestReplayMultiRegionChunks: a log replay of layout v2 chunks that hold
// several regions (their runs listed in the meta) sends each entry keyed
// by its run's region, each region's events in their backed-up order
// across chunks and cycles, resolved ts that never pass an unsent event of
// the region; it gives every region the events a backup of a chunk per
// region gives, and the same records on every run.
func TestReplayMultiRegionChunks(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	backupOf := func(name string, multi bool) *backuptest.Env {
		e := backuptest.New(t, rd, g, name, name, 1)
		e.MultiRegion = multi
		ts := func(ms int) uint64 { return e.TS(time.Duration(ms) * time.Millisecond) }
		long := []byte(fmt.Sprintf("%0300d", 7))
		// Cycle 1: regions 1, 2 and 3 interleaved in one write-CF put
		// chunk (runs 1, 2, 1, 3, 2), region 2's value in a default-CF
		// chunk of its own, region 0 in a delete chunk with region 3.
		e.CommitV2(t, ts(150), slices.Concat(
			inRegion(1, sinktest.WritePut(1, 1, ts(100), ts(101), []byte("a1"), true)),
			inRegion(2, sinktest.DefaultPut(1, 2, ts(105), long), sinktest.WritePut(1, 2, ts(105), ts(110), long, false)),
			inRegion(1, sinktest.WritePut(1, 3, ts(111), ts(112), []byte("a3"), true)),
			inRegion(3, sinktest.WritePut(1, 4, ts(113), ts(114), []byte("c4"), true)),
			inRegion(2, sinktest.WritePut(1, 5, ts(115), ts(116), []byte("b5"), true)),
			inRegion(0, deleteOf(sinktest.WritePut(1, 6, ts(117), ts(118), nil, true))),
			inRegion(3, deleteOf(sinktest.WritePut(1, 7, ts(119), ts(120), nil, true))),
		)...)
		// Cycle 2: region 2 before and after region 1, region 3 last.
		e.CommitV2(t, ts(300), slices.Concat(
			inRegion(2, sinktest.WritePut(1, 1, ts(201), ts(202), []byte("b1"), true)),
			inRegion(1, sinktest.WritePut(1, 2, ts(203), ts(204), []byte("a2"), true)),
			inRegion(2, sinktest.WritePut(1, 3, ts(205), ts(206), []byte("b3"), true)),
			inRegion(3, sinktest.WritePut(1, 4, ts(207), ts(208), []byte("c4'"), true)),
		)...)
		return e
	}
	narrow, wide := backupOf("mr-narrow", false), backupOf("mr-wide", true)
	if n := multiRegionChunks(t, wide); n != 3 {
		t.Fatalf("the multi-region backup has %d chunks of several regions, want 3 (a write-CF put chunk in each cycle, the deletes of cycle 1)", n)
	}
	if n := multiRegionChunks(t, narrow); n != 0 {
		t.Fatalf("the per-region backup has %d chunks of several regions", n)
	}
	k := kafka(t, 4, "narrow", "wide", "again")
	run := func(e *backuptest.Env, topic string) (replay.Result, []record) {
		t.Helper()
		res, err := replay.Run(context.Background(), e.Source(), target(t, k, topic),
			replay.Request{Flow: backup.Lookup{Catalog: "default", Name: "f"}, MaxClockSkew: backuptest.Skew, Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		recs := readAll(t, k, topic)
		if int64(len(recs)) != res.Records || res.Regions != 4 {
			t.Fatalf("%s: result %+v, %d records read; want 4 regions", topic, res, len(recs))
		}
		slices.SortFunc(recs, func(a, b record) int { return int(a.seq - b.seq) })
		return res, recs
	}
	nres, nrecs := run(narrow, "narrow")
	wres, wrecs := run(wide, "wide")
	_, again := run(wide, "again")

	byRegion := func(e *backuptest.Env, recs []record) map[uint64][]string {
		out := map[uint64][]string{}
		for _, r := range recs {
			for _, ev := range r.batch.Events {
				raw, at, _ := event.DecodeDataKey(ev.Key)
				out[r.batch.RegionID] = append(out[r.batch.RegionID], fmt.Sprintf("%s/%s row %d @%d", ev.CF, ev.Op, raw[len(raw)-1], (at-e.TS(0))>>18))
			}
		}
		return out
	}
	want := byRegion(narrow, nrecs)
	if got := byRegion(wide, wrecs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events by region from multi-region chunks:\n%v\nwant, as from a chunk per region:\n%v", got, want)
	}
	if len(want[1]) != 3 || len(want[2]) != 5 || len(want[3]) != 3 || len(want[0]) != 1 {
		t.Errorf("events by region %v: want 3, 5, 3 of regions 1, 2, 3 and 1 of region 0", want)
	}
	checkResolved(t, wrecs, wres.To)
	checkResolved(t, nrecs, nres.To)
	for _, at := range []time.Duration{150 * time.Millisecond, 300 * time.Millisecond} {
		if got, want := state(t, wrecs, wide.TS(at)), state(t, nrecs, narrow.TS(at)); fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
			t.Errorf("state at %v of the replay of multi-region chunks:\n%v\nwant\n%v", at, got, want)
		}
	}
	// The same arguments write the same records.
	if len(again) != len(wrecs) {
		t.Fatalf("a second run wrote %d records, the first %d", len(again), len(wrecs))
	}
	for i := range again {
		if again[i].partition != wrecs[i].partition || again[i].value != wrecs[i].value {
			t.Fatalf("record %d differs between two runs: partition %d / %d", i, again[i].partition, wrecs[i].partition)
		}
	}
}

// multiRegionChunks counts the chunks of e's metas that list region runs.
func multiRegionChunks(t *testing.T, e *backuptest.Env) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	err := e.Bucket.Iter(ctx, e.Prefix+"/v2/meta/", func(name string) error {
		rc, err := e.Bucket.Get(ctx, name)
		if err != nil {
			return err
		}
		defer rc.Close()
		raw, err := io.ReadAll(rc)
		if err != nil {
			return err
		}
		m, err := sink.DecodeMeta(raw)
		if err != nil {
			return err
		}
		for _, f := range m.Files {
			if f.Regions != nil {
				n++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// deleteOf makes a write-CF put entry a write-CF delete (TiKV's garbage
// collection of a version).
func deleteOf(e sinktest.Entry) sinktest.Entry {
	e.Op = "delete"
	return e
}
