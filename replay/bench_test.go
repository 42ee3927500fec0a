package replay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/backup/backuptest"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/replay"
	"github.com/flowlog/flowlog/sink/sinktest"
)

// discard is a target that drops every record: the replay's own cost.
type discard struct{}

func (discard) Partitions(context.Context) (int32, error)                { return 8, nil }
func (discard) MaxBatchBytes() int32                                     { return 1048588 }
func (discard) Written(context.Context, string) (map[int32]int64, error) { return nil, nil }
func (discard) Produce(context.Context, *kgo.Record) error               { return nil }
func (discard) Flush(context.Context) error                              { return nil }

// benchBackup is a backup of cycles cycles, each of regions regions with
// rows puts of value bytes apiece (a long value and its default-CF entry
// for values over 255 bytes), and the bytes of its events.
func benchBackup(b *testing.B, cycles, regions, rows, value int) (*backuptest.Env, int64) {
	e := backuptest.New(b, testenv.StartRedis(b), testenv.StartGCS(b), "bench", "bench", 1)
	var total int64
	val := make([]byte, value)
	for c := range cycles {
		var es []sinktest.Entry
		for r := range regions {
			for i := range rows {
				commit := e.TS(time.Duration(c*1000+i+1) * time.Millisecond)
				h := int64(r*rows + i)
				put := sinktest.WritePut(1, h, commit-1, commit, val, value <= 255)
				put.RegionID = uint64(r + 1)
				es = append(es, put)
				total += int64(len(put.Key) + len(put.Value))
				if value > 255 {
					d := sinktest.DefaultPut(1, h, commit-1, val)
					d.RegionID = uint64(r + 1)
					es = append(es, d)
					total += int64(len(d.Key) + len(d.Value))
				}
			}
		}
		e.Commit(b, e.TS(time.Duration(c*1000+999)*time.Millisecond), es...)
	}
	return e, total
}

// BenchmarkReplay: log replay throughput (MB/s of events) into a
// discarding target, the replay's own cost, and into kfake.
func BenchmarkReplay(b *testing.B) {
	e, total := benchBackup(b, 8, 8, 2000, 1024)
	flow := backup.Lookup{Catalog: "default", Name: "f"}
	for _, tc := range []struct {
		name   string
		target func(b *testing.B, i int) replay.Target
	}{
		{"discard", func(*testing.B, int) replay.Target { return discard{} }},
		{"kfake", func(b *testing.B, i int) replay.Target {
			return target(b, kafka(b, 8, fmt.Sprintf("out%d", i)), fmt.Sprintf("out%d", i))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(total)
			i := 0
			for b.Loop() {
				b.StopTimer()
				tg := tc.target(b, i)
				i++
				b.StartTimer()
				res, err := replay.Run(context.Background(), e.Source(), tg, replay.Request{Flow: flow, MaxClockSkew: backuptest.Skew, Topic: "out"})
				if err != nil || res.Records == 0 {
					b.Fatalf("replay: %+v, %v", res, err)
				}
			}
		})
	}
}
