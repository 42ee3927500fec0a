package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"path"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/flowlog/flowlog/sink"
)

// floorBuffer is the size of a temp file buffer, the unit the consumer
// compresses into one zstd frame (docs/SIZING.md, "Throughput and CPU of
// the flush").
const floorBuffer = 32 << 10

// cpuFloor is the per-byte work of BenchmarkPipeline's load that no
// pipeline can skip, measured on the run's own bytes.
type cpuFloor struct {
	raw    float64 // CPU seconds of the raw consume (fetch and decompress the records)
	zstd   float64 // CPU seconds of zstd frames of floorBuffer at the level the consumer uses
	sha    float64 // CPU seconds of the sha256 every chunk's meta carries
	framed int64   // framed bytes of the data objects (the bytes compressed and hashed)
}

// total is the floor in CPU seconds.
func (f cpuFloor) total() float64 { return f.raw + f.zstd + f.sha }

// selfCPU is this process's CPU seconds so far (user + system).
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// threadCPU is the calling thread's CPU seconds so far (user + system);
// the caller holds its goroutine on the thread (runtime.LockOSThread).
func threadCPU() float64 {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD, Linux
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// measureFloor reads back every data object the pipeline wrote under
// prefix through its meta, decodes its chunks to the framed bytes the
// consumer wrote (a zstd chunk decoded, an uncompressed one as stored),
// and measures on one thread the CPU of compressing those bytes again in
// floorBuffer frames (sink.AppendZstdFrame, the consumer's encoder) and
// of their sha256. Reading and decoding are not counted.
func measureFloor(ctx context.Context, b *testing.B, c *cluster, prefix string) cpuFloor {
	b.Helper()
	bkt := c.GCS.Client.Bucket(c.GCS.Bucket)
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		b.Fatalf("zstd decoder: %v", err)
	}
	defer dec.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var (
		f        cpuFloor
		raw, dst []byte
	)
	read := func(name string) []byte {
		r, err := bkt.Object(name).NewReader(ctx)
		if err != nil {
			b.Fatalf("read %s: %v", name, err)
		}
		body, err := io.ReadAll(r)
		_ = r.Close()
		if err != nil {
			b.Fatalf("read %s: %v", name, err)
		}
		return body
	}
	// The framed bytes are read chunk by chunk through the metas: a chunk
	// of at most 2 KiB is stored uncompressed even under zstd
	// (docs/FORMAT.md, "Data objects and chunks").
	eachObject(ctx, b, bkt, prefix, func(name string) {
		if _, kind, ok := sink.V2Unit(prefix, name); ok && kind != sink.GCMeta ||
			!ok && (path.Ext(name) != ".meta" || strings.Contains(name, "/snapshot/")) {
			return // a data, checkpoint, catalog or snapshot object
		}
		m, err := sink.DecodeMeta(read(name))
		if err != nil {
			b.Fatalf("decode meta %s: %v", name, err)
		}
		if len(m.Files) == 0 {
			return
		}
		stored := read(m.DataPath)
		raw = raw[:0]
		for _, fm := range m.Files {
			chunk := stored[fm.Offset : fm.Offset+fm.Length]
			if fm.Compression == sink.CompressionNone {
				raw = append(raw, chunk...)
				continue
			}
			if raw, err = dec.DecodeAll(chunk, raw); err != nil {
				b.Fatalf("decode a chunk of %s: %v", m.DataPath, err)
			}
		}
		f.framed += int64(len(raw))
		t0 := threadCPU()
		for i := 0; i < len(raw); i += floorBuffer {
			if dst, err = sink.AppendZstdFrame(dst[:0], raw[i:min(i+floorBuffer, len(raw))]); err != nil {
				b.Fatalf("zstd frame: %v", err)
			}
		}
		t1 := threadCPU()
		h := sha256.New()
		for i := 0; i < len(raw); i += floorBuffer {
			h.Write(raw[i:min(i+floorBuffer, len(raw))])
		}
		h.Sum(nil)
		f.zstd += t1 - t0
		f.sha += threadCPU() - t1
	})
	if f.framed == 0 {
		b.Fatalf("no data objects under %s", prefix)
	}
	return f
}

// String describes the floor as BenchmarkPipeline's report does.
func (f cpuFloor) String() string {
	return fmt.Sprintf("%.1f CPU s: raw consume %.1f, zstd %.1f and sha256 %.1f of the %.1f MB of framed bytes", f.total(), f.raw, f.zstd, f.sha, float64(f.framed)/1e6)
}
