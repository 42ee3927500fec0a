package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestGCCommand: gc says what it will delete, keeps what is young, listed
// or a checkpoint, deletes the rest, and writes its metrics.
func TestGCCommand(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	e := newRetentionEnv(t, rd, g, "gc1", 3, 6, 5)
	// A crashed cycle: uploaded, never committed.
	m, metaPath := sinktest.WriteCycle(t, e.bucket, sinktest.Cycle{Prefix: e.prefix, Catalog: "default", Flow: "f", FlowID: 1, CycleID: "crashed",
		ResolvedTS: e.ckpt, Entries: []sinktest.Entry{sinktest.WritePut(1, 1, e.ckpt-2, e.ckpt-1, []byte("x"), true)}})
	listed := len(e.objectNames(t))
	base := e.baseline(t, e.restoreTSs(e.ms(100, 0))...)

	out, err := e.run(t, "gc")
	if err != nil || !strings.Contains(out, "will delete 0 unreferenced objects") || !strings.Contains(out, "keeping 2 unreferenced objects") {
		t.Fatalf("gc with the default grace: %v, stdout:\n%s", err, out)
	}
	out, err = e.run(t, "gc", "--grace", "0s", "--dry-run")
	if err != nil || !strings.Contains(out, "would delete 2 unreferenced objects") || !strings.Contains(out, "would delete "+m.DataPath) ||
		len(e.objectNames(t)) != listed {
		t.Fatalf("gc --dry-run: %v, stdout:\n%s", err, out)
	}
	prom := filepath.Join(t.TempDir(), "gc.prom")
	r := runConsumer(t, 30*time.Second, nil, e.cmd("gc", "--grace", "0s", "--metrics-file", prom)...)
	if r.code != 0 || !strings.Contains(r.stdout, "gc deleted 2 objects") {
		t.Fatalf("gc: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	names := e.objectNames(t)
	for _, n := range names {
		if n == metaPath || n == m.DataPath {
			t.Errorf("gc left %s", n)
		}
	}
	if len(names) != listed-2 {
		t.Errorf("%d objects left of %d, want all but the crashed cycle's 2", len(names), listed)
	}
	e.checkRestores(t, base)
	raw, err := os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`flowlog_op_objects\{command="gc",flow="default/f"\} 2`,
		`flowlog_op_bytes\{command="gc",flow="default/f"\} [1-9]`,
		`flowlog_op_duration_seconds\{command="gc"\} `,
		`flowlog_storage_log_bytes\{flow="default/f"\} [1-9]`,
		`flowlog_storage_snapshot_bytes\{flow="default/f"\} 0`,
	} {
		if !regexp.MustCompile(re).Match(raw) {
			t.Errorf("metrics file lacks %s:\n%s", re, raw)
		}
	}
}

// TestGCSnapshots: with the real snapshot command, gc (no grace) keeps
// every object of a listed snapshot, of a dropped flow too whose name a new
// flow id took, and deletes an unlisted, half-written snapshot directory;
// verify counts listed snapshot objects as referenced, before and after,
// and restores from the snapshots are unchanged.
func TestGCSnapshots(t *testing.T) {
	ctx := context.Background()
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	e := newRetentionEnv(t, rd, g, "gcs1", 5, 8, 6)
	s1 := e.ms(8*50*3/4, 0)
	e.snapshot(t, s1)

	// DROP FLOW f, then CREATE FLOW f again: flow id 2, same directory.
	info, ok, err := e.store.FlowInfo(ctx, 1)
	if err != nil || !ok {
		t.Fatalf("flow info: %v, %v", ok, err)
	}
	if err := e.store.DestroyFlow(ctx, 1, info); err != nil {
		t.Fatal(err)
	}
	if err := e.store.CreateFlow(ctx, 2, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	// The drop closes flow 1's window and the create opens flow 2's, both
	// at the partition's checkpoint when it reports them.
	pending, err := e.store.PendingCoverage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reps []meta.CoverageReport
	for _, pf := range pending {
		for _, en := range pf.Entries {
			reps = append(reps, meta.CoverageReport{FlowID: pf.ID, Seq: en.Seq, Topic: e.lease.Topic, Partition: e.lease.Partition,
				Since: meta.CoverageValue{TS: e.ckpt}, Until: meta.CoverageValue{TS: e.ckpt}})
		}
	}
	if err := e.store.Commit(ctx, meta.Commit{Leases: []meta.Lease{e.lease}, Coverage: reps}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.FinalizeCoverage(ctx, e.lease.Topic, []int32{e.lease.Partition}); err != nil {
		t.Fatal(err)
	}
	hi := e.ms(9*50, 0)
	_, path := sinktest.WriteCycle(t, e.bucket, sinktest.Cycle{Prefix: e.prefix, Catalog: "default", Flow: "f", FlowID: 2, CycleID: "n0", ResolvedTS: hi,
		Entries: []sinktest.Entry{sinktest.WritePut(1, 1, e.ms(8*50+5, 0), e.ms(8*50+6, 0), []byte("new"), true)},
		Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: 8, To: 9}}})
	err = e.store.Commit(ctx, meta.Commit{Leases: []meta.Lease{e.lease}, Metas: []meta.MetaRef{{FlowID: 2, Path: path, MinResolvedTS: hi}},
		Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: 9, Checkpoint: hi, HasCheckpoint: true}},
		Flows:      []meta.FlowID{2}, LastFlushTS: hi})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.AdvanceCheckpoint(ctx, 2, hi); err != nil {
		t.Fatal(err)
	}
	g.CreateObject(fakeObject(sink.CheckpointPath(e.prefix, "default", "f", "g1", 2), sink.EncodeCheckpoint(hi)))
	if out, err := e.run(t, "snapshot", "--flow", "f", "--temp-dir", t.TempDir()); err != nil || !strings.Contains(out, "listed snapshot") {
		t.Fatalf("snapshot of flow id 2: %v, stdout:\n%s", err, out)
	}
	// A snapshot cut short: one table object, no snapshot.meta, not listed.
	half := sink.SnapshotTablePath(e.prefix, "default", "f", 2, hi-1, 1)
	body := []byte("half")
	if err := e.bucket.Upload(ctx, sink.Object{Name: half, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, n := range e.objectNames(t) {
		if strings.Contains(n, "/snapshot/") && n != half {
			listed = append(listed, n)
		}
	}
	if len(listed) != 4 { // flow 1: 1.snap + meta; flow 2: 1.snap + meta
		t.Fatalf("listed snapshot objects: %v", listed)
	}

	e.flow = []string{"--flow-id", "1"}
	old := e.baseline(t, s1, e.ckpt)
	e.flow = nil
	cur := map[uint64]map[string]string{}
	if cur[hi], _, err = e.restore(t, hi, "--snapshots=false"); err != nil {
		t.Fatal(err)
	}
	out, err := e.run(t, "verify", "--flow", "f")
	if err != nil || !strings.Contains(out, "snapshots 1 (") || !strings.Contains(out, "unreferenced: 1 objects") {
		t.Fatalf("verify before gc: want the snapshot checked and only the half-written object unreferenced: %v, stdout:\n%s", err, out)
	}

	// Within the default grace the half-written snapshot may still be in
	// progress: kept.
	if out, err := e.run(t, "gc"); err != nil || !strings.Contains(out, "will delete 0 unreferenced objects") || !slices.Contains(e.objectNames(t), half) {
		t.Fatalf("gc with the default grace: %v, stdout:\n%s", err, out)
	}
	if out, err := e.run(t, "gc", "--grace", "0s"); err != nil || !strings.Contains(out, "gc deleted 1 objects") {
		t.Fatalf("gc: %v, stdout:\n%s", err, out)
	}
	names := e.objectNames(t)
	if slices.Contains(names, half) {
		t.Errorf("gc kept the half-written snapshot object %s", half)
	}
	for _, n := range listed {
		if !slices.Contains(names, n) {
			t.Errorf("gc deleted %s of a listed snapshot", n)
		}
	}
	plan, err := sink.PlanGC(ctx, e.bucket, sink.GCOptions{Prefix: e.prefix, Refs: gcRefs(e.store)})
	if err != nil || len(plan.Delete)+plan.Young > 0 {
		t.Errorf("after gc, unreferenced objects remain: %+v, %v", plan.Delete, err)
	}
	for _, flow := range [][]string{{"--flow", "f"}, {"--flow-id", "1"}} {
		out, err := e.run(t, "verify", flow...)
		if err != nil || !strings.Contains(out, "snapshots 1 (") || strings.Contains(out, "unreferenced") {
			t.Errorf("verify %v after gc: %v, stdout:\n%s", flow, err, out)
		}
	}
	e.checkRestores(t, cur)
	e.flow = []string{"--flow-id", "1"}
	e.checkRestores(t, old)
}
