package pipeline

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// BenchmarkGenerationAppend measures the consume loop's work on temp files
// per entry: a write-CF put with its value inline, in a table and region
// picked at random for each entry, as `producer load` spreads them, from
// one of 8 apply partitions. The gap between few tables and regions and
// many is the per-file cost of a wide load (docs/SIZING.md, width).
func BenchmarkGenerationAppend(b *testing.B) {
	for _, shape := range []struct{ tables, regions int }{{4, 16}, {3000, 5000}, {20000, 5000}} {
		b.Run(fmt.Sprintf("tables=%d/regions=%d", shape.tables, shape.regions), func(b *testing.B) {
			flow := &meta.Flow{ID: 1, Info: meta.FlowInfo{CatalogName: "default", FlowName: "f"}}
			set := &meta.FlowSet{IDs: []meta.FlowID{1}, Flows: []*meta.Flow{flow}}
			rng := rand.New(rand.NewPCG(1, 2))
			value := make([]byte, 215) // a 200 B value inline in its write record
			const perGen = 400_000     // entries a generation takes: about a 128 MiB cycle
			dir := b.TempDir()
			g := newGeneration(dir, 1, defaultMaxOpenFiles, sink.CompressionZstd, nil)
			keys := make([][]byte, 1024)
			for i := range keys {
				keys[i] = event.AppendDataKey(nil, event.RowKey(int64(i), int64(i)), uint64(i))
			}
			b.SetBytes(int64(len(keys[0]) + len(value)))
			b.ResetTimer()
			for i := range b.N {
				if i > 0 && i%perGen == 0 {
					b.StopTimer()
					files, _ := g.seal()
					for _, f := range files {
						f.remove()
					}
					g = newGeneration(dir, uint64(i), defaultMaxOpenFiles, sink.CompressionZstd, nil)
					b.StartTimer()
				}
				table := int64(rng.IntN(shape.tables))
				region := uint64(rng.IntN(shape.regions))
				key := fileKey{set: set, table: table, cf: event.CF_CF_WRITE, op: event.Op_OP_PUT}
				f, err := g.regionFile(key, region)
				if err != nil {
					b.Fatal(err)
				}
				if err := f.append(keys[i%len(keys)], value, uint64(i), uint64(i)); err != nil {
					b.Fatal(err)
				}
				f.countRegion(region)
				f.countPartition(int32(region % 8))
			}
			b.StopTimer()
			files, _ := g.seal()
			for _, f := range files {
				f.remove()
			}
		})
	}
}
