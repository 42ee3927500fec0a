package pipeline_test

import (
	"context"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/cli"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// applyFetch is what one fetch request asked of the apply topic.
type applyFetch struct {
	maxBytes, partMaxBytes, maxWaitMillis int32
}

// watchApplyFetches records, at the broker, the fetch requests that read
// the apply topic (by name or, from v13 on, by topic id).
func watchApplyFetches(t *testing.T, r *rig) func() []applyFetch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topics, err := kadm.NewClient(r.kafka.Client(t)).ListTopics(ctx, testenv.ApplyTopic)
	if err != nil {
		t.Fatalf("list topics: %v", err)
	}
	id := topics[testenv.ApplyTopic].ID
	var (
		mu  sync.Mutex
		got []applyFetch
	)
	r.kafka.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r.kafka.KeepControl()
		f := req.(*kmsg.FetchRequest)
		for _, tp := range f.Topics {
			if (tp.Topic == testenv.ApplyTopic || tp.TopicID == id) && len(tp.Partitions) > 0 {
				mu.Lock()
				got = append(got, applyFetch{f.MaxBytes, tp.Partitions[0].PartitionMaxBytes, f.MaxWaitMillis})
				mu.Unlock()
				break
			}
		}
		return nil, nil, false
	})
	return func() []applyFetch {
		mu.Lock()
		defer mu.Unlock()
		return append([]applyFetch(nil), got...)
	}
}

// The consumer's fetches are sized from --max-memory, not from the backlog,
// so its memory does not grow with a lag: a quarter of it over the fetches
// that can be held at once (two in flight or buffered, one being handled),
// and a broker holds an empty fetch at most 500 ms. At 48 MiB that is 4 MiB a
// fetch. The limit counts compressed bytes, so it starts at 256 KiB until a
// batch shows the topic's compression ratio; after an uncompressed batch it
// is the whole share (fetchsize.go; TestFetchSizer covers the ratios).
func TestMaxMemoryBoundsFetches(t *testing.T) {
	for _, tc := range []struct {
		name      string
		maxMemory int64
		maxTemp   int64
		want      int32
	}{
		{"from --max-memory", 48 << 20, 1 << 30, 4 << 20},
		{"from --max-temp-bytes", 128 << 20, 16 << 20, 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 1, sink.NewMemBucket(), func(c *pipeline.Config) {
				c.MaxMemory, c.MaxTempBytes = cli.Size(tc.maxMemory), cli.Size(tc.maxTemp)
				c.FlushSize = min(c.FlushSize, c.MaxTempBytes)
			})
			fetches := watchApplyFetches(t, r)
			r.start()
			r.createFlow("f", 1)
			plain := r.kafka.Client(t, kgo.ProducerBatchCompression(kgo.NoCompression()))
			rec := &kgo.Record{Topic: testenv.ApplyTopic, Key: []byte("1"), Value: event.EncodeBatch(nil, putBatch(1, 1, 1, 3, 100))}
			if err := plain.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
			r.eventually(20*time.Second, func() bool { return r.next0() == 1 }, "the record handled")
			r.eventually(20*time.Second, func() bool {
				got := fetches()
				return len(got) > 0 && got[len(got)-1].maxBytes == tc.want
			}, "a fetch asking for the whole share after the uncompressed batch")
			got := fetches()
			if f := got[0]; f.maxBytes != 256<<10 {
				t.Errorf("first fetch asked for %d bytes, want 256 KiB before any batch was seen", f.maxBytes)
			}
			for _, f := range got {
				if f.maxBytes > tc.want || f.partMaxBytes != f.maxBytes || f.maxWaitMillis != 500 {
					t.Fatalf("fetch asked for %d bytes (%d a partition), waiting up to %d ms; want at most %d, the same a partition, 500",
						f.maxBytes, f.partMaxBytes, f.maxWaitMillis, tc.want)
				}
			}
		})
	}
}

// With --max-memory 16 MiB the temp file buffers get 4 MiB: 128 files open
// at most, although --max-open-files is left at its default (1024); and the
// files' bookkeeping gets a sixth: a cycle is frozen at 1365 files, below
// the default --max-cycle-files (10000). 2,000 regions with one event each,
// each of a table of its own, go through both caps without losing
// anything.
func TestMaxMemoryCapsTempFiles(t *testing.T) {
	const (
		regions   = 2000
		openCap   = 128  // 16 MiB / 4 / 32 KiB
		cycleCap  = 1365 // 16 MiB / 6 / (2 x 1 KiB)
		fdMargin  = 32   // the temp files the flusher streams, late connections
		maxMemory = 16 << 20
	)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Max/2 < regions {
		t.Skipf("the open file limit (hard %d, %v) caps temp files below %d by itself: this test would not see --max-memory", lim.Max, err, regions)
	}
	r := newRig(t, 2, sink.NewMemBucket(), func(c *pipeline.Config) { c.MaxMemory = maxMemory })
	r.start()
	id := r.createFlow("mem", tableIDs(regions)...)
	base := testenv.OpenFDs(0)
	fds := testenv.SampleFDs(t, 0, 2*time.Millisecond)

	want := map[string]int{}
	var recs []*kgo.Record
	for region := uint64(1); region <= regions; region++ {
		b := putBatch(region, int64(region), int64(region)*10, 1, int64(region)*10)
		for _, e := range b.Events {
			want[string(e.Key)+"\x00"+string(e.Value)]++
		}
		recs = append(recs, &kgo.Record{Topic: testenv.ApplyTopic, Key: []byte(strconv.FormatUint(region, 10)), Value: event.EncodeBatch(nil, b)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	r.waitHandled(int64(len(recs)))
	r.flush()
	peak := fds.Halt()

	metas, got := r.entries(id)
	checkOnce(t, got, want)
	t.Logf("%d regions: %d cycles; open descriptors %d before, peak %d (cap %d + margin %d)", regions, len(metas), base, peak, openCap, fdMargin)
	if peak > base+openCap+fdMargin {
		t.Errorf("open descriptors peaked at %d, over %d before + %d (from --max-memory) + margin %d", peak, base, openCap, fdMargin)
	}
	for _, m := range metas {
		if len(m.Files) > cycleCap {
			t.Errorf("cycle %s has %d files, over the %d --max-memory allows", m.CycleID, len(m.Files), cycleCap)
		}
	}
	if len(metas) < 2 {
		t.Errorf("%d cycles for %d files, want at least 2 with %d files a cycle", len(metas), regions, cycleCap)
	}
}
