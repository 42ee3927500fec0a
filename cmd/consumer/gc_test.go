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

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// TestGCCommand: gc writes the catalogs of changed flows, says what it will
// delete, keeps what is young, listed or a checkpoint, deletes the rest,
// and writes its metrics.
func TestGCCommand(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	h := backuptest.NewHistory(t, rd, g, "gc1", 3, 6, 5)
	// A crashed cycle: uploaded, never committed.
	m, metaPath := sinktest.WriteCycle(t, h.Bucket, sinktest.Cycle{Prefix: h.Prefix, Catalog: "default", Flow: "f", FlowID: 1, CycleID: "crashed",
		ResolvedTS: h.Checkpoint, Entries: []sinktest.Entry{sinktest.WritePut(1, 1, h.Checkpoint-2, h.Checkpoint-1, []byte("x"), true)}})
	listed := len(h.ObjectNames(t))
	base := h.Baseline(t, h.RestoreTSs(h.MS(100, 0))...)

	out, err := runIn(t, h.Conn, "gc")
	if err != nil || !strings.Contains(out, "will delete 0 unreferenced objects") || !strings.Contains(out, "keeping 2 unreferenced objects") {
		t.Fatalf("gc with the default grace: %v, stdout:\n%s", err, out)
	}
	// gc wrote the catalog of the flow (dirty since its create) before
	// planning: the bucket says what the flow is before anything goes.
	if n := len(h.ObjectNames(t)); n != listed+1 {
		t.Fatalf("%d objects after gc with the default grace, want %d and the flow's catalog", n, listed)
	}
	listed++
	out, err = runIn(t, h.Conn, "gc", "--grace", "0s", "--dry-run")
	if err != nil || !strings.Contains(out, "would delete 2 unreferenced objects") || !strings.Contains(out, "would delete "+m.DataPath) ||
		len(h.ObjectNames(t)) != listed {
		t.Fatalf("gc --dry-run: %v, stdout:\n%s", err, out)
	}
	prom := filepath.Join(t.TempDir(), "gc.prom")
	r := runConsumer(t, 30*time.Second, nil, append(append([]string{"gc"}, h.Conn...), "--grace", "0s", "--metrics-file", prom)...)
	if r.code != 0 || !strings.Contains(r.stdout, "gc deleted 2 objects") {
		t.Fatalf("gc: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	names := h.ObjectNames(t)
	for _, n := range names {
		if n == metaPath || n == m.DataPath {
			t.Errorf("gc left %s", n)
		}
	}
	if len(names) != listed-2 {
		t.Errorf("%d objects left of %d, want all but the crashed cycle's 2", len(names), listed)
	}
	h.CheckRestores(t, base)
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
	h := backuptest.NewHistory(t, rd, g, "gcs1", 5, 8, 6)
	s1 := h.MS(8*50*3/4, 0)
	h.Snapshot(t, s1)

	// DROP FLOW f, then CREATE FLOW f again: flow id 2, same directory.
	info, ok, err := h.Store.FlowInfo(ctx, 1)
	if err != nil || !ok {
		t.Fatalf("flow info: %v, %v", ok, err)
	}
	if err := h.Store.DestroyFlow(ctx, 1, info); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.CreateFlow(ctx, 2, info, map[uint32]meta.Route{0: {Peer: meta.Peer{ID: 1, Addr: "n1:4000"}}}); err != nil {
		t.Fatal(err)
	}
	// The drop closes flow 1's window and the create opens flow 2's, both
	// at the partition's checkpoint when it reports them.
	pending, err := h.Store.PendingCoverage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reps []meta.CoverageReport
	for _, pf := range pending {
		for _, en := range pf.Entries {
			reps = append(reps, meta.CoverageReport{FlowID: pf.ID, Seq: en.Seq, Topic: h.Lease.Topic, Partition: h.Lease.Partition,
				Since: meta.CoverageValue{TS: h.Checkpoint}, Until: meta.CoverageValue{TS: h.Checkpoint}})
		}
	}
	if err := h.Store.Commit(ctx, meta.Commit{Leases: []meta.Lease{h.Lease}, Coverage: reps}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.FinalizeCoverage(ctx, h.Lease.Topic, []int32{h.Lease.Partition}); err != nil {
		t.Fatal(err)
	}
	hi := h.MS(9*50, 0)
	_, path := sinktest.WriteCycle(t, h.Bucket, sinktest.Cycle{Prefix: h.Prefix, Catalog: "default", Flow: "f", FlowID: 2, CycleID: "n0", ResolvedTS: hi,
		Entries: []sinktest.Entry{sinktest.WritePut(1, 1, h.MS(8*50+5, 0), h.MS(8*50+6, 0), []byte("new"), true)},
		Offsets: []sink.OffsetRange{{Topic: "flowlog.apply", Partition: 0, From: 8, To: 9}}})
	err = h.Store.Commit(ctx, meta.Commit{Leases: []meta.Lease{h.Lease}, Metas: []meta.MetaRef{{FlowID: 2, Path: path, MinResolvedTS: hi}},
		Partitions: []meta.PartitionCommit{{Topic: "flowlog.apply", Partition: 0, NextOffset: 9, Checkpoint: hi, HasCheckpoint: true}},
		Flows:      []meta.FlowID{2}, LastFlushTS: hi})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.AdvanceCheckpoint(ctx, 2, hi); err != nil {
		t.Fatal(err)
	}
	h.PutObject(sink.CheckpointPath(h.Prefix, "default", "f", "g1", 2), sink.EncodeCheckpoint(hi))
	if out, err := runIn(t, h.Conn, "snapshot", "--flow", "f", "--temp-dir", t.TempDir()); err != nil || !strings.Contains(out, "listed snapshot") {
		t.Fatalf("snapshot of flow id 2: %v, stdout:\n%s", err, out)
	}
	// A snapshot cut short: one table object, no snapshot.meta, not listed.
	half := sink.SnapshotTablePath(h.Prefix, "default", "f", 2, hi-1, 1)
	body := []byte("half")
	if err := h.Bucket.Upload(ctx, sink.Object{Name: half, Body: bytes.NewReader(body), Size: int64(len(body)), CRC32C: sink.CRC32C(body)}); err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, n := range h.ObjectNames(t) {
		if strings.Contains(n, "/snapshot/") && n != half {
			listed = append(listed, n)
		}
	}
	if len(listed) != 4 { // flow 1: 1.snap + meta; flow 2: 1.snap + meta
		t.Fatalf("listed snapshot objects: %v", listed)
	}

	h.Flow = backup.Lookup{ID: 1}
	old := h.Baseline(t, s1, h.Checkpoint)
	h.Flow = backup.Lookup{Catalog: "default", Name: "f"}
	cur := map[uint64]map[string]string{}
	if cur[hi], _, err = h.Restore(t, hi, true); err != nil {
		t.Fatal(err)
	}
	out, err := runIn(t, h.Conn, "verify", "--flow", "f")
	if err != nil || !strings.Contains(out, "snapshots 1 (") || !strings.Contains(out, "unreferenced: 1 objects") {
		t.Fatalf("verify before gc: want the snapshot checked and only the half-written object unreferenced: %v, stdout:\n%s", err, out)
	}

	// Within the default grace the half-written snapshot may still be in
	// progress: kept.
	if out, err := runIn(t, h.Conn, "gc"); err != nil || !strings.Contains(out, "will delete 0 unreferenced objects") || !slices.Contains(h.ObjectNames(t), half) {
		t.Fatalf("gc with the default grace: %v, stdout:\n%s", err, out)
	}
	if out, err := runIn(t, h.Conn, "gc", "--grace", "0s"); err != nil || !strings.Contains(out, "gc deleted 1 objects") {
		t.Fatalf("gc: %v, stdout:\n%s", err, out)
	}
	names := h.ObjectNames(t)
	if slices.Contains(names, half) {
		t.Errorf("gc kept the half-written snapshot object %s", half)
	}
	for _, n := range listed {
		if !slices.Contains(names, n) {
			t.Errorf("gc deleted %s of a listed snapshot", n)
		}
	}
	plan, err := sink.PlanGC(ctx, h.Bucket, sink.GCOptions{Prefix: h.Prefix, Refs: backup.GCRefs(h.Store)})
	if err != nil || len(plan.Delete)+plan.Young > 0 {
		t.Errorf("after gc, unreferenced objects remain: %+v, %v", plan.Delete, err)
	}
	for _, flow := range [][]string{{"--flow", "f"}, {"--flow-id", "1"}} {
		out, err := runIn(t, h.Conn, "verify", flow...)
		if err != nil || !strings.Contains(out, "snapshots 1 (") || strings.Contains(out, "unreferenced") {
			t.Errorf("verify %v after gc: %v, stdout:\n%s", flow, err, out)
		}
	}
	h.CheckRestores(t, cur)
	h.Flow = backup.Lookup{ID: 1}
	h.CheckRestores(t, old)
}

// TestGCRefusesLostRedis: against a Redis that lost every key under the
// prefix, every object of the backup would look unreferenced. gc refuses,
// names consumer recover, and deletes nothing.
func TestGCRefusesLostRedis(t *testing.T) {
	rd, g := testenv.StartRedis(t), testenv.StartGCS(t)
	h := backuptest.NewHistory(t, rd, g, "gclost", 5, 4, 5)
	before := h.ObjectNames(t)
	if err := rd.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := runIn(t, h.Conn, "gc", "--grace", "0s")
	if err == nil || !strings.Contains(err.Error(), "consumer recover") {
		t.Fatalf("gc over a flushed Redis: %v; want a refusal naming consumer recover", err)
	}
	if after := h.ObjectNames(t); !slices.Equal(after, before) {
		t.Fatalf("gc deleted objects after refusing: %d objects before, %d after", len(before), len(after))
	}
}
