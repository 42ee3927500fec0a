package pipeline_test

import (
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

const baseMS = 1_700_000_000_000

func ts(ms int64) uint64 { return event.ComposeTS(baseMS+ms, 0) }

// putBatch is one region's batch of n write-CF puts on table at commit ts
// base+i, resolved at the last one.
func putBatch(region uint64, table int64, handle0 int64, n int, baseTS int64) *event.Batch {
	b := &event.Batch{RegionID: region}
	for i := range n {
		commit := ts(baseTS + int64(i))
		w, _ := event.AppendWrite(nil, event.Write{Type: event.WritePut, StartTS: commit - 1, ShortValue: []byte("v"), HasShortValue: true})
		b.Events = append(b.Events, event.Event{
			Key: event.AppendDataKey(nil, event.RowKey(table, handle0+int64(i)), commit), Value: w,
			CF: event.CF_CF_WRITE, Op: event.Op_OP_PUT,
		})
		b.ResolvedTS = commit
	}
	return b
}

func TestFlush133RegionsInOneCycle(t *testing.T) {
	r := newRig(t, 4, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("f133", 1)
	want := map[string]int{}
	for region := uint64(1); region <= 133; region++ {
		b := putBatch(region, 1, int64(region)*10, 3, int64(region)*10)
		for _, e := range b.Events {
			want[string(e.Key)+"\x00"+string(e.Value)] = 1
		}
		r.produceBatch(b)
	}
	r.eventually(20*time.Second, func() bool {
		return testutil.ToFloat64(r.cons.MetricEventsWritten()) == float64(133*3)
	}, "all events written to temp files")
	r.flush()

	metas, got := r.entries(id)
	if len(metas) != 1 {
		t.Fatalf("got %d metas, want 1 (one cycle)", len(metas))
	}
	// Layout v1 writes a chunk per region; layout v2 one for the table,
	// of every apply partition, which lists the runs of its regions: each
	// region's 3 events.
	seen := map[uint64]int{}
	for _, f := range metas[0].Files {
		f.EachRegion(func(region uint64, n int64) { seen[region] += int(n) })
		if testLayout() == pipeline.LayoutV2 && (f.RegionID != 0 || len(f.Regions) < 2) {
			t.Errorf("layout v2 chunk: region_id %d, %d runs; want 0 and a run per region", f.RegionID, len(f.Regions))
		}
	}
	wantChunks := 133
	if testLayout() == pipeline.LayoutV2 {
		wantChunks = 1
		if n := len(metas[0].Offsets); n < 2 {
			t.Fatalf("the cycle consumed %d partitions; the test needs several in one chunk", n)
		}
	}
	if n := len(metas[0].Files); n != wantChunks {
		t.Fatalf("meta lists %d chunks, want %d", n, wantChunks)
	}
	for region := uint64(1); region <= 133; region++ {
		if seen[region] != 3 {
			t.Errorf("region %d has %d entries in the runs, want 3", region, seen[region])
		}
	}
	checkOnce(t, got, want)
	checkOffsetsCommitted(t, r)
	if files := r.tempFiles(); len(files) != 0 {
		t.Fatalf("temp files left after the cycle: %v", files)
	}
}

// checkOffsetsCommitted asserts Redis and Kafka offsets equal the end offsets
// of every apply partition that holds records.
func checkOffsetsCommitted(t *testing.T, r *rig) {
	t.Helper()
	ctx := context.Background()
	adm := kadm.NewClient(r.kafka.Client(t))
	ends, err := adm.ListEndOffsets(ctx, testenv.ApplyTopic)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := adm.FetchOffsets(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset == 0 {
			return
		}
		got, ok, err := r.store.Offset(ctx, testenv.ApplyTopic, o.Partition)
		if err != nil || !ok || got != o.Offset {
			t.Errorf("partition %d: redis offset %d (set=%v, err=%v), want end offset %d", o.Partition, got, ok, err, o.Offset)
		}
		c, _ := committed.Lookup(testenv.ApplyTopic, o.Partition)
		if c.At != o.Offset {
			t.Errorf("partition %d: kafka committed %d, want %d", o.Partition, c.At, o.Offset)
		}
	})
}

func TestStorageErrorOnceThenSuccessLosesNothing(t *testing.T) {
	fb := &faultyBucket{Bucket: sink.NewMemBucket()}
	fb.setFail(func(n int) bool { return n == 1 })
	r := newRig(t, 2, fb, nil)
	r.start()
	id := r.createFlow("retry", 7)
	b := putBatch(5, 7, 0, 50, 0)
	r.produceBatch(b)
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 50 }, "events written")
	r.flush()
	if fb.failed.Load() != 1 {
		t.Fatalf("injected %d failures, want 1", fb.failed.Load())
	}
	_, got := r.entries(id)
	if len(got) != 50 {
		t.Fatalf("backed up %d entries, want 50", len(got))
	}
	for _, n := range got {
		if n != 1 {
			t.Fatalf("an entry is referenced %d times", n)
		}
	}
	checkOffsetsCommitted(t, r)
}

func TestAlwaysFailingStorageMakesFlowFatal(t *testing.T) {
	fb := &faultyBucket{Bucket: sink.NewMemBucket()}
	r := newRig(t, 1, fb, func(c *pipeline.Config) { c.FatalAfter = 30; c.StallTimeout = time.Second })
	r.start()
	id := r.createFlow("doomed", 3)
	fb.setFail(func(int) bool { return true })
	r.produceBatch(putBatch(1, 3, 0, 20, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 20 }, "events written")
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.cons.Flush(ctx)
	}()
	ctx := context.Background()
	r.eventually(30*time.Second, func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.Status == meta.StatusFatal
	}, "flow fatal in Redis")
	if n := fb.failed.Load(); n < 30 {
		t.Fatalf("flow fatal after %d failed uploads, want at least 30", n)
	}
	if v := testutil.ToFloat64(r.cons.MetricFlowFatal("default/doomed")); v != 1 {
		t.Fatalf("flow_fatal = %v, want 1", v)
	}
	r.eventually(10*time.Second, func() bool { return r.cons.Status().Paused }, "fetching paused while the flow is fatal")
	if len(r.tempFiles()) == 0 {
		t.Fatal("temp files were dropped while the flow is fatal")
	}
	if refs, _ := r.store.Metas(ctx, id); len(refs) != 0 {
		t.Fatalf("a failing cycle committed metas: %v", refs)
	}
	// Records wait while fetching is stopped: /readyz reports the stall.
	r.produceBatch(putBatch(1, 3, 100, 5, 100))
	r.eventually(10*time.Second, func() bool { return r.cons.Stalled() != nil }, "consume loop reported stalled")

	fb.setFail(nil) // the fault clears; the next retry succeeds
	r.eventually(30*time.Second, func() bool {
		st, err := r.store.FlowState(ctx, id)
		return err == nil && st.Status == meta.StatusActive
	}, "flow active again")
	r.eventually(10*time.Second, func() bool { return r.cons.Stalled() == nil }, "stall cleared after recovery")
	r.waitHandled(2) // fetching resumed: the record produced while fatal
	r.flush()
	_, got := r.entries(id)
	if len(got) != 25 {
		t.Fatalf("after recovery %d entries backed up, want 25", len(got))
	}
	if v := testutil.ToFloat64(r.cons.MetricFlowFatal("default/doomed")); v != 0 {
		t.Fatalf("flow_fatal = %v after recovery, want 0", v)
	}
}

func TestStopFlushesAndRemovesTempFiles(t *testing.T) {
	r := newRig(t, 2, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("stopper", 2)
	r.produceBatch(putBatch(9, 2, 0, 10, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 10 }, "events written")
	// (Ten small entries stay in a temp file's buffer: the segment file
	// may not exist yet. What matters is that nothing is committed.)
	if metas, _ := r.entries(id); len(metas) != 0 {
		t.Fatalf("%d metas committed before the stop: the test needs unflushed data", len(metas))
	}
	if err := r.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if files := r.tempFiles(); len(files) != 0 {
		t.Fatalf("temp files left after stop: %v", files)
	}
	_, got := r.entries(id)
	if len(got) != 10 {
		t.Fatalf("stop committed %d entries, want 10", len(got))
	}
	checkOffsetsCommitted(t, r)
}

func TestCheckpointForwardOnlyAnd8ByteLE(t *testing.T) {
	mb := sink.NewMemBucket()
	r := newRig(t, 1, mb, nil)
	r.start()
	id := r.createFlow("ck", 4)
	ctx := context.Background()
	name := sink.CheckpointPath("backup", "default", "ck", "g", id)
	if r.cfg.Layout == pipeline.LayoutV2 {
		name = sink.CheckpointPathV2("backup", "g")
	}

	// A cycle with no data (only a heartbeat) still reports its resolved ts.
	r.produceBatch(&event.Batch{RegionID: 1, ResolvedTS: ts(1000)})
	r.eventually(10*time.Second, func() bool { return r.next0() == 1 }, "heartbeat consumed")
	r.flush()
	readCk := func() uint64 {
		rc, err := mb.Get(ctx, name)
		if err != nil {
			t.Fatalf("checkpoint object: %v", err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if len(b) != 8 {
			t.Fatalf("checkpoint object is %d bytes, want 8", len(b))
		}
		return binary.LittleEndian.Uint64(b)
	}
	if got := readCk(); got != ts(1000) {
		t.Fatalf("checkpoint object = %d, want the heartbeat's resolved ts %d", got, ts(1000))
	}
	if st, _ := r.store.FlowState(ctx, id); st.CheckpointTS != ts(1000) {
		t.Fatalf("flow:state checkpoint_ts = %d, want %d", st.CheckpointTS, ts(1000))
	}

	r.produceBatch(&event.Batch{RegionID: 1, ResolvedTS: ts(2000)})
	r.eventually(10*time.Second, func() bool { return r.next0() == 2 }, "second heartbeat consumed")
	r.flush()
	if got := readCk(); got != ts(2000) {
		t.Fatalf("checkpoint = %d, want %d", got, ts(2000))
	}

	// A new region appears far behind: the partition's checkpoint drops,
	// the global checkpoint does not go backwards.
	r.produceBatch(&event.Batch{RegionID: 2, ResolvedTS: ts(1500)})
	r.eventually(10*time.Second, func() bool { return r.next0() == 3 }, "third heartbeat consumed")
	r.flush()
	if got := readCk(); got != ts(2000) {
		t.Fatalf("checkpoint moved to %d, want it to stay at %d", got, ts(2000))
	}
	if st, _ := r.store.FlowState(ctx, id); st.CheckpointTS != ts(2000) {
		t.Fatalf("flow:state checkpoint_ts = %d, want %d", st.CheckpointTS, ts(2000))
	}
}

func TestBadRecordsGoToDLQAndValidOnesAreKept(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("dlq", 1)
	good1 := putBatch(1, 1, 0, 5, 0)
	r.produceBatch(good1)
	r.produce(testenv.ApplyTopic, "1", []byte("\xff\xff not a protobuf"), "")
	r.produce(testenv.ApplyTopic, "1", []byte(`{"regionId": "1", "events": [{"key": "!!"}]}`), "application/json")
	noTS := putBatch(1, 1, 100, 1, 100)
	noTS.Events[0].Key = noTS.Events[0].Key[:5] // no ts left
	r.produceBatch(noTS)
	good2 := putBatch(1, 1, 200, 5, 200)
	r.produceBatch(good2)
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 10 }, "valid events written")
	r.flush()
	_, got := r.entries(id)
	if len(got) != 10 {
		t.Fatalf("backed up %d entries, want the 10 valid ones", len(got))
	}

	cl := r.kafka.Client(t, kgo.ConsumeTopics(testenv.DLQTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var dlq []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(dlq) < 3 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { dlq = append(dlq, rec) })
	}
	if len(dlq) != 3 {
		t.Fatalf("DLQ has %d records, want 3", len(dlq))
	}
	for _, rec := range dlq {
		h := map[string]string{}
		for _, kv := range rec.Headers {
			h[kv.Key] = string(kv.Value)
		}
		if h["flowlog-source-topic"] != testenv.ApplyTopic || h["flowlog-source-offset"] == "" || h["flowlog-error"] == "" {
			t.Fatalf("DLQ record headers %v lack the source or the reason", h)
		}
	}
	if !strings.Contains(headerOf(dlq[2], "flowlog-error"), "bad_key") {
		t.Fatalf("record without ts: reason %q, want bad_key", headerOf(dlq[2], "flowlog-error"))
	}
	checkOffsetsCommitted(t, r)
}

func headerOf(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// A new owner of a partition inherits the regions the previous one knew, so
// its checkpoint waits for a region it has not heard from since.
func TestCheckpointRemembersSilentRegionsAcrossRestart(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("regions", 1)
	ctx := context.Background()
	r.produceBatch(&event.Batch{RegionID: 1, ResolvedTS: ts(1000)})
	r.produceBatch(&event.Batch{RegionID: 2, ResolvedTS: ts(2000)})
	r.eventually(10*time.Second, func() bool {
		st := r.cons.Status()
		return len(st.Partitions) == 1 && st.Partitions[0].Next == 2
	}, "heartbeats consumed")
	r.flush()
	if st, _ := r.store.FlowState(ctx, id); st.CheckpointTS != ts(1000) {
		t.Fatalf("checkpoint %d, want %d", st.CheckpointTS, ts(1000))
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	r.start() // a new process: only region 2 speaks
	r.produceBatch(&event.Batch{RegionID: 2, ResolvedTS: ts(3000)})
	r.eventually(10*time.Second, func() bool {
		st := r.cons.Status()
		return len(st.Partitions) == 1 && st.Partitions[0].Next == 3
	}, "heartbeat consumed after restart")
	r.flush()
	if st, _ := r.store.FlowState(ctx, id); st.CheckpointTS != ts(1000) {
		t.Fatalf("checkpoint %d after restart, want it held at region 1's %d", st.CheckpointTS, ts(1000))
	}
	r.produceBatch(&event.Batch{RegionID: 1, ResolvedTS: ts(2500)})
	r.eventually(10*time.Second, func() bool { return r.next0() == 4 }, "region 1 heartbeat")
	r.flush()
	if st, _ := r.store.FlowState(ctx, id); st.CheckpointTS != ts(2500) {
		t.Fatalf("checkpoint %d, want %d", st.CheckpointTS, ts(2500))
	}
}

func TestLeftoverTempFilesRemovedAtStart(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	dir := filepath.Join(r.tempDir, "default", "old")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	left := []string{filepath.Join(dir, "g1-p0-t1-r1-write-put.tmp"), filepath.Join(dir, "1-x-1.spool")}
	keep := filepath.Join(r.tempDir, "README.txt")      // not ours: never touched
	marker := filepath.Join(r.tempDir, ".flowlog-temp") // written by the process that crashed
	for _, p := range append(left, keep, marker) {
		if err := os.WriteFile(p, []byte("crashed"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r.start()
	for _, p := range left {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("leftover %s still there (err=%v)", p, err)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("a file that is not a temp file was removed: %v", err)
	}
}

// A stop whose final flush is fenced (another member took the partition's
// lease, as when the group session expires during the stop) returns nil:
// the new owner consumes the uncommitted records from the last commit, and
// nothing of them is committed here.
func TestStopFencedFinalFlushIsNotAnError(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("fenced", 1)
	r.produceBatch(putBatch(9, 1, 0, 10, 0))
	r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == 10 }, "events written")
	if _, err := r.store.AcquireLease(context.Background(), testenv.ApplyTopic, 0, "another-member"); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("stop with a fenced final flush: %v, want nil", err)
	}
	if metas, got := r.entries(id); len(metas) != 0 || len(got) != 0 {
		t.Fatalf("a fenced stop committed %d metas (%d entries)", len(metas), len(got))
	}
}

// Each committed cycle leaves its segment as a spare, and the next cycle's
// segment is written over it (the file, its inode, carries on from one
// cycle to the next), while every event reaches the bucket exactly once.
func TestCyclesWriteOverTheSpareOfTheOneBefore(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("spares", 2)
	// spares are the spare files now, by name, with their inodes.
	spares := func() map[string]uint64 {
		// Polled: a pattern error (none with this one) reads as no spare yet.
		names, _ := filepath.Glob(filepath.Join(r.tempDir, "spare*.seg"))
		out := map[string]uint64{}
		for _, name := range names {
			if fi, err := os.Stat(name); err == nil {
				out[filepath.Base(name)] = fi.Sys().(*syscall.Stat_t).Ino
			}
		}
		return out
	}
	const rounds, perRound = 3, 100
	var before map[string]uint64
	for round := range rounds {
		r.produceBatch(putBatch(9, 2, int64(round*perRound), perRound, int64(10+round*1000)))
		want := float64((round + 1) * perRound)
		r.eventually(10*time.Second, func() bool { return testutil.ToFloat64(r.cons.MetricEventsWritten()) == want }, "events written")
		r.flush()
		var now map[string]uint64
		r.eventually(10*time.Second, func() bool {
			now = spares()
			for name := range now {
				if _, old := before[name]; !old {
					return true // a spare kept since the last round
				}
			}
			return false
		}, "the committed cycle's segment kept as a spare")
		if round > 0 {
			reused := false
			for _, ino := range now {
				for _, was := range before {
					reused = reused || ino == was
				}
			}
			if !reused {
				t.Errorf("round %d: spares %v share no inode with those before, %v: the cycle's segment was a new file, not a spare written over", round, now, before)
			}
		}
		before = now
	}
	_, got := r.entries(id)
	if len(got) != rounds*perRound {
		t.Fatalf("backed up %d distinct entries, want %d", len(got), rounds*perRound)
	}
	for _, n := range got {
		if n != 1 {
			t.Fatalf("an entry backed up %d times", n)
		}
	}
	checkOffsetsCommitted(t, r)
}
