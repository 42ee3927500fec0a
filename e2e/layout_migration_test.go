package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// TestV1BackupContinuedUnderV2 runs the built consumer on a backup written
// first in layout v1 (--layout v1) and then continued in layout v2 by a
// consumer of the same group (--layout v2), as an upgrade does, and checks
// every operator command on the flows that span both: flow f on tables 1
// and 2, flow g on table 2 (a table the v2 cycles store once for both).
//
//   - restore (from Redis and --from-bucket) at the checkpoint, inside the
//     v1 part and inside the v2 part give the rows loadgen.Expected computes
//     from the seeds; verify finds no fault;
//   - a snapshot of f inside the v2 part and a truncate of f at it: f's v1
//     objects are deleted, every v2 object any flow lists stays, g's v1
//     objects stay; gc after it keeps everything a flow lists;
//   - afterwards f restores from the snapshot plus the v2 log (Redis and
//     bucket alone), refuses a ts below the truncation point, and g still
//     restores across both layouts.
func TestV1BackupContinuedUnderV2(t *testing.T) {
	c := startCluster(t, 4)
	first := loadgen.Config{
		Events: 8_000, Tables: []int64{1, 2, 3}, Regions: 6, ValueSize: 64, Seed: 5301, HeartbeatEvery: 5,
		StartTime: time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC),
	}
	firstStats := expectLoad(first)
	second := loadgen.Config{
		Events: 8_000, Tables: []int64{1, 2, 3}, Regions: 6, ValueSize: 64, Seed: 5302, HeartbeatEvery: 5,
		StartTime: restoreTSTime(firstStats.maxResolved).Add(time.Second),
	}
	secondStats := expectLoad(second)
	muts := append(loadgen.Mutations(first), loadgen.Mutations(second)...)
	firstMuts := loadgen.Mutations(first)
	secondMuts := loadgen.Mutations(second)

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f", "--tables", "1,2")
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "g", "--tables", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)

	cons := c.startConsumer(t, "consumer-v1", "--layout", "v1", "--flush-size", "256KiB")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(first)...)...)
	fid := waitFlowCheckpoint(ctx, t, store, "f", firstStats.maxResolved, 2*time.Minute)
	gid := waitFlowCheckpoint(ctx, t, store, "g", firstStats.maxResolved, 2*time.Minute)
	if err := cons.Stop(); err != nil {
		t.Fatalf("v1 consumer exit: %v", err)
	}
	cons = c.startConsumer(t, "consumer-v2", "--layout", "v2", "--flush-size", "256KiB")
	runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(second)...)...)
	waitFlowCheckpoint(ctx, t, store, "f", secondStats.maxResolved, 2*time.Minute)
	waitFlowCheckpoint(ctx, t, store, "g", secondStats.maxResolved, 2*time.Minute)
	b, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// --from-bucket reads the group's checkpoint object, written after the
	// catalogs at each advance.
	waitFor(t, 2*time.Minute, func() (bool, string) {
		ck, err := sink.ReadCheckpoint(ctx, b, sink.CheckpointPathV2("", "flowlog"))
		return err == nil && ck >= secondStats.maxResolved, "v2 checkpoint object " + strconv.FormatUint(ck, 10) + ": " + errString(err)
	})
	if err := cons.Stop(); err != nil {
		t.Fatalf("v2 consumer exit: %v", err)
	}

	for _, id := range []meta.FlowID{fid, gid} {
		refs, err := store.Metas(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var v1, v2 int
		for _, r := range refs {
			switch {
			case strings.Contains(r.Path, "/v1/backupmeta/"):
				v1++
			case strings.HasPrefix(r.Path, sink.V2MetaDir("")):
				v2++
			}
		}
		if v1 == 0 || v2 == 0 {
			t.Fatalf("metas:%d lists %d v1 and %d v2 metas, want both", id, v1, v2)
		}
	}

	flowTables := map[string][]int64{"f": {1, 2}, "g": {2}}
	expect := func(flow string, ts uint64) map[int64]map[string]loadgen.Row {
		all := loadgen.Expected(muts, ts)
		out := map[int64]map[string]loadgen.Row{}
		for _, tb := range flowTables[flow] {
			if len(all[tb]) > 0 {
				out[tb] = all[tb]
			}
		}
		return out
	}
	restoreAt := func(t *testing.T, flow string, ts uint64, extra ...string) {
		t.Helper()
		out := t.TempDir()
		args := append([]string{"--flow", flow, "--out", out, "--temp-dir", t.TempDir()}, extra...)
		if ts != 0 {
			args = append(args, "--ts", strconv.FormatUint(ts, 10))
		}
		res := restoreRun(t, c, "restore", args...)
		if res.code != 0 {
			t.Fatalf("restore %v exited %d:\n%s", args, res.code, res.out)
		}
		got := restoreOutputTS(t, res.out)
		if ts != 0 && got != ts {
			t.Fatalf("restore says as of %d, asked for %d", got, ts)
		}
		n := restoreCompare(t, out, expect(flow, got))
		t.Logf("%s %v as of %d: %d rows match", flow, extra, got, n)
	}
	inFirst := firstMuts[len(firstMuts)/2].CommitTS
	inSecond := secondMuts[len(secondMuts)/2].CommitTS
	verify := func(t *testing.T, flow string, extra ...string) {
		t.Helper()
		res := restoreRun(t, c, "verify", append([]string{"--flow", flow}, extra...)...)
		if res.code != 0 || !strings.Contains(res.out, "OK") {
			t.Fatalf("verify %s %v exited %d:\n%s", flow, extra, res.code, res.out)
		}
	}
	t.Run("before truncate", func(t *testing.T) {
		for _, flow := range []string{"f", "g"} {
			for _, ts := range []uint64{0, inFirst, inSecond} {
				restoreAt(t, flow, ts)
			}
			restoreAt(t, flow, 0, "--from-bucket")
			restoreAt(t, flow, inFirst, "--from-bucket")
			verify(t, flow)
			verify(t, flow, "--from-bucket")
		}
	})

	before := countObjects(ctx, t, b)
	if r := restoreRun(t, c, "snapshot", "--flow", "f", "--ts", strconv.FormatUint(inSecond, 10), "--temp-dir", t.TempDir()); r.code != 0 {
		t.Fatalf("snapshot exited %d:\n%s", r.code, r.out)
	}
	if r := restoreRun(t, c, "truncate", "--flow", "f", "--until", strconv.FormatUint(inSecond, 10)); r.code != 0 {
		t.Fatalf("truncate exited %d:\n%s", r.code, r.out)
	}
	after := countObjects(ctx, t, b)
	if after.v1["f"] != 0 || before.v1["f"] == 0 {
		t.Errorf("f's v1 objects: %d before the truncate, %d after; want all of them deleted", before.v1["f"], after.v1["f"])
	}
	if after.v1["g"] != before.v1["g"] || after.v2 != before.v2 {
		t.Errorf("truncate of f deleted objects of g or of layout v2: g's v1 %d -> %d, v2 %d -> %d", before.v1["g"], after.v1["g"], before.v2, after.v2)
	}
	checkListed := func(t *testing.T) {
		t.Helper()
		for _, id := range []meta.FlowID{fid, gid} {
			refs, err := store.Metas(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range refs {
				if _, err := b.Size(ctx, r.Path); err != nil {
					t.Errorf("meta %s listed by flow %d: %v", r.Path, id, err)
				}
			}
		}
	}
	checkListed(t)
	if r := restoreRun(t, c, "gc", "--grace", "1s"); r.code != 0 {
		t.Fatalf("gc exited %d:\n%s", r.code, r.out)
	}
	checkListed(t)
	if gcd := countObjects(ctx, t, b); gcd.v1["g"] != before.v1["g"] {
		t.Errorf("gc deleted g's v1 objects: %d -> %d", before.v1["g"], gcd.v1["g"])
	}

	t.Run("after truncate and gc", func(t *testing.T) {
		restoreAt(t, "f", 0)
		restoreAt(t, "f", 0, "--from-bucket")
		restoreAt(t, "f", inSecond+1)
		if r := restoreRun(t, c, "restore", "--flow", "f", "--out", t.TempDir(), "--temp-dir", t.TempDir(),
			"--ts", strconv.FormatUint(inFirst, 10)); r.code == 0 {
			t.Errorf("restore of f below its truncation point succeeded:\n%s", r.out)
		}
		for _, ts := range []uint64{0, inFirst, inSecond} {
			restoreAt(t, "g", ts)
		}
		restoreAt(t, "g", inFirst, "--from-bucket")
		verify(t, "f")
		verify(t, "g")
		verify(t, "f", "--from-bucket")
	})
}

// objectCounts counts a bucket's data objects: layout v1 ones by flow name
// (prefix "", catalog default) and layout v2 ones.
type objectCounts struct {
	v1 map[string]int
	v2 int
}

func countObjects(ctx context.Context, t testing.TB, b sink.Bucket) objectCounts {
	t.Helper()
	n := objectCounts{v1: map[string]int{}}
	err := b.Iter(ctx, "", func(name string) error {
		switch {
		case strings.HasPrefix(name, sink.V2LogDir("")) && strings.HasSuffix(name, ".log"):
			n.v2++
		case strings.HasPrefix(name, meta.DefaultCatalog+"/") && strings.HasSuffix(name, ".log"):
			n.v1[strings.Split(name, "/")[1]]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
