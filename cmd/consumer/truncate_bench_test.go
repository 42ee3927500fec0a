package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowlog/flowlog/sink"
)

var benchTruncMid = flag.Bool("truncbench-mid", false, "BenchmarkTruncateStorage: snapshot halfway through a cycle instead of at its end")

// BenchmarkTruncateStorage measures what truncate leaves (docs/FORMAT.md,
// "Truncate rule"): on the flow of BenchmarkSnapshotRestore (-snapbench-mib
// of log), `consumer snapshot` at 90% of the history (a checkpoint, as a
// scheduled snapshot takes it), `consumer truncate --until` it, then the
// bytes stored (every object but the checkpoints) against the snapshot's
// objects plus the log a restore at the checkpoint still reads (the listed
// chunks with an event after the snapshot, and their metas). It reports that
// ratio (the goal is at most 1.05) and the sizes. Run it with -benchtime=1x.
// With -truncbench-mid the snapshot is halfway through a cycle, as when
// several consumers' cycles do not end at the flow's checkpoint: the cycle
// holding the snapshot's ts is then kept whole.
func BenchmarkTruncateStorage(b *testing.B) {
	ctx := context.Background()
	sb := newSnapBench(b)
	k := len(sb.cycleTS)*9/10 - 1
	snapTS := sb.cycleTS[k]
	if *benchTruncMid {
		snapTS += (sb.cycleTS[k+1] - snapTS) / 2
	}
	run := func(args ...string) string {
		r := runConsumer(b, time.Hour, nil, append(args, sb.conn...)...)
		if r.code != 0 {
			b.Fatalf("consumer %v: exit %d\n%s\n%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	stored := func() (all, snap int64) {
		err := sb.bucket.(sink.Lister).List(ctx, "", func(o sink.ObjectInfo) error {
			switch {
			case strings.Contains(o.Name, "/global_checkpoint/"):
			case strings.Contains(o.Name, "/snapshot/"):
				snap += o.Size
				all += o.Size
			default:
				all += o.Size
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return all, snap
	}
	runs := 0
	for b.Loop() {
		if runs++; runs > 1 {
			b.Fatal("one truncate per flow: run with -benchtime=1x")
		}
		run("snapshot", "--flow", "f", "--ts", fmt.Sprint(snapTS), "--temp-dir", b.TempDir())
		before, _ := stored()
		out := run("truncate", "--flow", "f", "--until", fmt.Sprint(snapTS))
		after, snapBytes := stored()
		refs, err := sb.store.Metas(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		var paths []string
		for _, r := range refs {
			paths = append(paths, r.Path)
		}
		metas, err := sink.ReadMetaSummaries(ctx, sb.bucket, sink.Flow{Catalog: "default", Name: "f", ID: 1}, paths, snapTS, 8)
		if err != nil {
			b.Fatal(err)
		}
		var logAfter int64
		for _, m := range metas {
			if m.LogBytesAfter > 0 {
				logAfter += m.LogBytesAfter + m.Size
			}
		}
		ratio := float64(after) / float64(snapBytes+logAfter)
		b.ReportMetric(float64(before)/(1<<20), "stored-before-MiB")
		b.ReportMetric(float64(after)/(1<<20), "stored-after-MiB")
		b.ReportMetric(float64(snapBytes)/(1<<20), "snapshot-MiB")
		b.ReportMetric(float64(logAfter)/(1<<20), "log-after-MiB")
		b.ReportMetric(ratio, "stored/(snap+log)")
		b.Logf("truncate:\n%s", out)
		if ratio > 1.05 && !*benchTruncMid {
			b.Errorf("truncate left %d bytes, %.3f times the snapshot (%d) plus the log after it (%d)", after, ratio, snapBytes, logAfter)
		}
	}
}
