package sink_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"syscall"
	"testing"
	"time"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
	"github.com/flowlog/flowlog/sink/sinktest"
)

var benchRestoreMiB = flag.Int("restore-mib", 128, "MiB of log data BenchmarkRestore restores")
var benchRestoreMem = flag.Int("restore-max-memory-mib", 64, "BenchmarkRestore's MaxMemory in MiB")
var benchRestoreGCS = flag.Bool("restore-gcs", false, "BenchmarkRestore reads from the fake-gcs-server emulator through the GCS client instead of a MemBucket")
var benchLowGC = flag.Bool("restore-lowgc", true, "run BenchmarkRestore with GOGC=5 so that restore-heap-MiB approximates the live heap")

// benchBackup writes about mib MiB of TiKV-shaped log data: puts with short
// values, larger values through the default CF, deletes; tables tables (3
// in BenchmarkRestore's main runs), many versions per key.
func benchBackup(b *testing.B, bkt sink.Bucket, mib int, compression string, tables int) ([]string, uint64) {
	r := rand.New(rand.NewPCG(1, 1))
	var metas []string
	ts := uint64(1000)
	total := 0
	for cycle := 0; total < mib<<20; cycle++ {
		var es []sinktest.Entry
		size := 0
		for size < 32<<20 {
			table, handle := int64(1+r.IntN(tables)), int64(r.IntN(1_000_000))
			start, commit := ts, ts+1
			ts += 2
			switch x := r.IntN(10); {
			case x == 0:
				es = append(es, sinktest.WriteRecord(table, handle, commit, event.Write{Type: event.WriteDelete, StartTS: start}))
				size += 40
			case x < 7:
				v := make([]byte, 64+r.IntN(64))
				for i := range v {
					v[i] = byte('a' + r.IntN(26))
				}
				es = append(es, sinktest.WritePut(table, handle, start, commit, v, true))
				size += 40 + len(v)
			default:
				v := make([]byte, 1024)
				for i := range v {
					v[i] = byte('a' + r.IntN(26))
				}
				es = append(es, sinktest.DefaultPut(table, handle, start, v), sinktest.WritePut(table, handle, start, commit, v, false))
				size += 80 + len(v)
			}
		}
		_, path := sinktest.WriteCycle(b, bkt, sinktest.Cycle{Catalog: "default", Flow: "f", FlowID: 1, CycleID: fmt.Sprint(cycle),
			Compression: compression, ResolvedTS: ts, Entries: es})
		metas = append(metas, path)
		total += size
	}
	return metas, ts
}

// BenchmarkRestore reports restore throughput in MB/s of uncompressed log
// data and the heap the restore adds at its peak (over the in-memory
// bucket's, with GOGC=5 so that garbage hardly counts), with MaxMemory well below the data size so the
// external sort spills. Its select runs restore parts of a backup of ten
// tables (see benchmarkSelect).
func BenchmarkRestore(b *testing.B) {
	for _, comp := range []string{sink.CompressionNone, sink.CompressionZstd} {
		b.Run(comp, func(b *testing.B) {
			var bkt sink.Bucket = sink.NewMemBucket()
			if *benchRestoreGCS {
				g, err := gcs.New(context.Background(), gcs.Config{Bucket: testenv.Bucket, Endpoint: testenv.StartGCS(b).Endpoint()})
				if err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				bkt = g
			}
			metas, ts := benchBackup(b, bkt, *benchRestoreMiB, comp, 3)
			runtime.GC()
			b.ResetTimer()
			if *benchLowGC {
				defer debug.SetGCPercent(debug.SetGCPercent(5))
			}
			runtime.GC()
			base := liveHeap()
			for b.Loop() {
				stop := make(chan struct{})
				peak := make(chan uint64)
				go func() { peak <- peakHeap(stop) }()
				cpu0 := cpuTime()
				st, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: bkt, Flow: testFlow, MetaPaths: metas, TS: ts,
					OutDir: b.TempDir(), TempDir: b.TempDir(), MaxMemory: int64(*benchRestoreMem) << 20})
				close(stop)
				cpu := cpuTime() - cpu0
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(st.LogBytes)
				p := <-peak
				b.ReportMetric(float64(p-min(base, p))/(1<<20), "restore-heap-MiB")
				// CPU seconds per GiB of log: steadier than MB/s on a loaded machine.
				b.ReportMetric(cpu.Seconds()/(float64(st.LogBytes)/(1<<30)), "cpu-s/GiB")
			}
		})
	}
	b.Run("select", benchmarkSelect)
}

// cpuTime is the user and system CPU time of the process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// liveHeap is the heap in use. The benchmark runs the restore with a low
// GOGC so that this stays close to the live heap.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

func peakHeap(stop <-chan struct{}) uint64 {
	var peak uint64
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		peak = max(peak, liveHeap())
		select {
		case <-stop:
			return peak
		case <-t.C:
		}
	}
}

// benchmarkSelect restores, from one zstd backup of -restore-mib MiB over
// ten tables of the same shape, the whole backup, one table, and the same
// table as a key range, and reports the bytes the bucket's client read per
// restore (read-MiB) beside the time: a selection's cost follows the data
// it selects (docs/RESTORE.md, "Selective restore").
func benchmarkSelect(b *testing.B) {
	var bkt sink.Bucket = sink.NewMemBucket()
	if *benchRestoreGCS {
		g, err := gcs.New(context.Background(), gcs.Config{Bucket: testenv.Bucket, Endpoint: testenv.StartGCS(b).Endpoint()})
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		bkt = g
	}
	metas, ts := benchBackup(b, bkt, *benchRestoreMiB, sink.CompressionZstd, 10)
	rc := sinktest.NewReadCounter(bkt)
	for _, sel := range []struct {
		name   string
		tables map[int64]bool
		keys   sink.KeyRange
	}{
		{"all", nil, sink.KeyRange{}},
		{"table-1-of-10", map[int64]bool{1: true}, sink.KeyRange{}},
		{"keys-of-table-1", nil, sink.KeyRange{Start: event.TablePrefix(1), End: event.TablePrefix(2)}},
	} {
		b.Run(sel.name, func(b *testing.B) {
			for b.Loop() {
				rc.Reset()
				st, err := sink.Restore(context.Background(), sink.RestoreOptions{Bucket: rc, Flow: testFlow, MetaPaths: metas, TS: ts,
					Tables: sel.tables, Keys: sel.keys, OutDir: b.TempDir(), TempDir: b.TempDir(), MaxMemory: int64(*benchRestoreMem) << 20})
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(st.LogBytes)
				b.ReportMetric(float64(rc.Total())/(1<<20), "read-MiB")
			}
		})
	}
}
