package pipeline_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// Every (partition, flow, table, cf, op) of a generation is a temp file
// (and in layout v1 every region of it). Thousands of tables with one
// event each must not need a descriptor (and a 32 KiB buffer) each: the open temp files stay
// under --max-open-files, files closed to make room are opened again for
// the next append (with their hash intact: ReadChunk checks it), the files'
// memory counts toward --flush-size and --max-temp-bytes, and
// --max-cycle-files freezes cycles early. Nothing is lost on the way.
func TestManyTinyTempFiles(t *testing.T) {
	const (
		regions = 3000
		maxOpen = 16
		// margin covers the flusher (the temp files of the flows it
		// uploads at once, opened one after another) and connections the
		// clients open late.
		margin = 32
	)
	cases := []struct {
		name  string
		tweak func(*pipeline.Config)
		check func(t *testing.T, metas []sink.Meta)
	}{
		{
			name: "open files capped",
		},
		{
			name:  "max cycle files",
			tweak: func(c *pipeline.Config) { c.MaxCycleFiles = 500 },
			check: func(t *testing.T, metas []sink.Meta) {
				for _, m := range metas {
					if len(m.Files) > 500 {
						t.Errorf("cycle %s has %d files, over --max-cycle-files 500", m.CycleID, len(m.Files))
					}
				}
				if len(metas) < 2*regions/500 {
					t.Errorf("%d cycles for %d files, want at least %d with --max-cycle-files 500", len(metas), 2*regions, 2*regions/500)
				}
			},
		},
		{
			// 3,000 files of a few dozen bytes each hold 3 MB of
			// memory but 0.2 MB of data: the cost of the files, not
			// their bytes, reaches --flush-size and --max-temp-bytes.
			name: "file memory counts toward flush size",
			tweak: func(c *pipeline.Config) {
				c.FlushSize, c.MaxTempBytes = 1<<20, 1<<20
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 2, sink.NewMemBucket(), func(c *pipeline.Config) {
				c.MaxOpenFiles = maxOpen
				if tc.tweak != nil {
					tc.tweak(c)
				}
			})
			r.start()
			id := r.createFlow("tiny", tableIDs(regions)...)
			base := testenv.OpenFDs(0)
			fds := testenv.SampleFDs(t, 0, 2*time.Millisecond)

			// Two rounds over every region, each of a table of its
			// own, one event per record: each file is closed between its
			// two appends.
			want := map[string]int{}
			var recs []*kgo.Record
			for round := range 2 {
				for region := uint64(1); region <= regions; region++ {
					b := putBatch(region, int64(region), int64(region)*10+int64(round), 1, int64(region)*10+int64(round))
					for _, e := range b.Events {
						want[string(e.Key)+"\x00"+string(e.Value)]++
					}
					recs = append(recs, &kgo.Record{Topic: testenv.ApplyTopic,
						Key: []byte(strconv.FormatUint(region, 10)), Value: event.EncodeBatch(nil, b)})
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := r.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
			r.waitHandled(int64(len(recs)))
			if tc.tweak != nil {
				// Cycles started by the files' cost or count, with no
				// flush requested and --flush-interval an hour.
				r.eventually(30*time.Second, func() bool {
					refs, err := r.store.Metas(ctx, id)
					return err == nil && len(refs) > 0
				}, "a cycle committed without a requested flush")
			}
			r.flush()
			peak := fds.Halt()

			metas, got := r.entries(id)
			checkOnce(t, got, want)
			checkOffsetsCommitted(t, r)
			t.Logf("%d records of %d regions: %d cycles; open descriptors %d before, peak %d (cap %d + margin %d)",
				len(recs), regions, len(metas), base, peak, maxOpen, margin)
			if peak > base+maxOpen+margin {
				t.Errorf("open descriptors peaked at %d, over %d before + --max-open-files %d + margin %d", peak, base, maxOpen, margin)
			}
			if tc.check != nil {
				tc.check(t, metas)
			}
			if files := r.tempFiles(); len(files) != 0 {
				t.Errorf("%d temp files left after the cycles", len(files))
			}
		})
	}
}
