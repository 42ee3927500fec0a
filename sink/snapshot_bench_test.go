package sink_test

import (
	"context"
	"testing"

	"github.com/flowlog/flowlog/sink"
)

// BenchmarkRestoreFromSnapshot is BenchmarkRestore's data (-restore-mib of
// log in a MemBucket) restored at its end from a snapshot at about 90% of
// its history: the in-process counterpart of cmd/consumer's
// BenchmarkSnapshotRestore, for profiling the snapshot path.
func BenchmarkRestoreFromSnapshot(b *testing.B) {
	ctx := context.Background()
	bkt := sink.NewMemBucket()
	metas, ts := benchBackup(b, bkt, *benchRestoreMiB, sink.CompressionZstd, 3)
	snapTS := ts - (ts-1000)/10
	win := map[int64]sink.SnapshotWindow{1: {}, 2: {}, 3: {}}
	st, err := sink.Snapshot(ctx, sink.SnapshotOptions{Bucket: bkt, Flow: testFlow, MetaPaths: metas, TS: snapTS, Windows: win,
		TempDir: b.TempDir(), MaxMemory: int64(*benchRestoreMem) << 20})
	if err != nil {
		b.Fatal(err)
	}
	refs := []sink.SnapshotRef{{TS: snapTS, Path: st.MetaPath}}
	windows := map[int64]sink.TableWindow{1: {Until: ts}, 2: {Until: ts}, 3: {Until: ts}}
	b.ResetTimer()
	for b.Loop() {
		rs, err := sink.Restore(ctx, sink.RestoreOptions{Bucket: bkt, Flow: testFlow, MetaPaths: metas, TS: ts, Windows: windows,
			Snapshots: refs, OutDir: b.TempDir(), TempDir: b.TempDir(), MaxMemory: int64(*benchRestoreMem) << 20})
		if err != nil {
			b.Fatal(err)
		}
		if rs.FromSnapshot != 3 {
			b.Fatalf("%d tables from the snapshot, want 3", rs.FromSnapshot)
		}
		b.ReportMetric(float64(rs.LogBytes)/(1<<20), "log-MiB-read")
	}
}
