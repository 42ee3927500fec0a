package pipeline

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// beforeMGet runs fn once, just before the first MGET the client sends:
// the checkpoint advance's read of the partition checkpoints.
type beforeMGet struct {
	once sync.Once
	fn   func()
}

func (h *beforeMGet) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *beforeMGet) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.EqualFold(cmd.Name(), "mget") {
			h.once.Do(h.fn)
		}
		return next(ctx, cmd)
	}
}

func (h *beforeMGet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A checkpoint advance reads the partition checkpoints before it finalises
// coverage windows. Here partition 1 commits its report for the removal of
// table 1 (it stopped routing it at 60) together with a checkpoint of 200
// at the worst moment: after the advance began, just before it reads the
// checkpoints. Finalising first would miss the report and leave table 1's
// window open while the checkpoint moves to 150: a restore at 150 would
// claim table 1's events up to 150, which partition 1 never routed after
// 60. Read first, the checkpoints either predate the report (the
// checkpoint stays at 50) or finalisation sees it (the window closes at
// 60).
func TestCheckpointReadBeforeCoverageFinalises(t *testing.T) {
	ctx := context.Background()
	rs := testenv.StartRedis(t)
	hook := &beforeMGet{}
	hooked := rs.Client(t)
	hooked.AddHook(hook)
	st := meta.NewStore(hooked, "", nil)
	other := meta.NewStore(rs.Client(t), "", nil) // the other replica's
	kafka := testenv.StartKafka(t, 2)
	prod := kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := range int32(2) {
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: testenv.ApplyTopic, Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	base := event.ComposeTS(time.Now().Add(-time.Hour).UnixMilli(), 0)
	at := func(d uint64) uint64 { return base + d<<18 }
	leases := map[int32]meta.Lease{}
	for p := range int32(2) {
		l, err := other.AcquireLease(ctx, testenv.ApplyTopic, p, "replica")
		if err != nil {
			t.Fatal(err)
		}
		leases[p] = l
	}
	commit := func(p int32, ckpt uint64, reports ...meta.CoverageReport) {
		t.Helper()
		for i := range reports {
			reports[i].Topic, reports[i].Partition = testenv.ApplyTopic, p
		}
		err := other.Commit(ctx, meta.Commit{Leases: []meta.Lease{leases[p]}, Coverage: reports, Partitions: []meta.PartitionCommit{{
			Topic: testenv.ApplyTopic, Partition: p, NextOffset: 1, Checkpoint: ckpt, HasCheckpoint: true}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	ddl := func(op string, next int64, tables ...uint32) meta.FlowID {
		t.Helper()
		d := meta.DDL{Op: op, Flow: meta.FlowInfo{FlowName: "f", SourceTableIDs: tables}}
		a, err := other.ApplyDDL(ctx, d, meta.DDLPosition{Topic: "ddl", NextOffset: next})
		if err != nil {
			t.Fatal(err)
		}
		return a.FlowID
	}
	id := ddl("create", 1, 1, 2)
	for p := range int32(2) {
		commit(p, at(10), meta.CoverageReport{FlowID: id, Seq: 1, Since: meta.CoverageValue{TS: at(1)}, Until: meta.CoverageValue{TS: at(1)}})
	}
	if _, err := other.FinalizeCoverage(ctx, testenv.ApplyTopic, []int32{0, 1}); err != nil {
		t.Fatal(err)
	}
	ddl("replace", 2, 2) // table 1 removed: pending step 2
	until := func(ts uint64) meta.CoverageReport {
		return meta.CoverageReport{FlowID: id, Seq: 2, Since: meta.CoverageValue{TS: ts}, Until: meta.CoverageValue{TS: ts}}
	}
	commit(0, at(150), until(at(100)))
	commit(1, at(50))
	hook.fn = func() { commit(1, at(200), until(at(60))) }

	reg := meta.NewRegistry(st)
	if err := reg.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	c := &Consumer{cfg: Config{MaxClockSkew: DefaultMaxClockSkew, Layout: LayoutV1, FatalAfter: 30},
		d:   Deps{ApplyTopic: testenv.ApplyTopic, Group: "g", Store: st, Registry: reg, Bucket: sink.NewMemBucket(), GCSPrefix: "backup"},
		log: slog.New(slog.DiscardHandler), m: newMetrics(nil)}
	c.fatal = newFatal(st, reg, c.m, c.log, 30)
	f := newFlusher(c)
	f.adm = kadm.NewClient(kafka.Client(t))
	if err := f.advanceCheckpoint(ctx); err != nil {
		t.Fatal(err)
	}
	state, err := st.FlowState(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	cur, _, err := st.Windows(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	w := cur[1]
	if state.CheckpointTS > at(60) && (w.Until == nil || *w.Until > at(60)) {
		t.Fatalf("checkpoint %d is past %d, where partition 1 stopped routing table 1, and table 1's window is %+v: a restore there claims events the backup lacks",
			state.CheckpointTS, at(60), w)
	}
	if state.CheckpointTS != at(150) || w.Until == nil || *w.Until != at(60) {
		t.Fatalf("checkpoint %d, table 1 window %+v; want %d and the window closed at %d", state.CheckpointTS, w, at(150), at(60))
	}
}
