package pipeline_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/sink"
)

// gateBucket holds every upload until open is called, counting those
// waiting.
type gateBucket struct {
	sink.Bucket
	mu      sync.Mutex
	waiting int
	gate    chan struct{}
}

func (b *gateBucket) Upload(ctx context.Context, obj sink.Object) error {
	b.mu.Lock()
	b.waiting++
	b.mu.Unlock()
	select {
	case <-b.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.Bucket.Upload(ctx, obj)
}

func (b *gateBucket) Overwrite(ctx context.Context, obj sink.Object) error {
	return b.Bucket.(sink.Overwriter).Overwrite(ctx, obj)
}

func (b *gateBucket) held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
}

// A cycle queued behind one that uploads is sealed meanwhile: its chunks'
// raw runs are packed (its g<gen>.pack appears) while the cycle before it
// still waits on the store, and both commit in order, every entry once.
func TestNextCycleSealsWhileOneUploads(t *testing.T) {
	bucket := &gateBucket{Bucket: sink.NewMemBucket(), gate: make(chan struct{})}
	r := newRig(t, 1, bucket, nil)
	r.start()
	id := r.createFlow("f", 1)
	want := map[string]int{}
	packs := func() int {
		n := 0
		for _, f := range r.tempFiles() {
			if strings.HasSuffix(filepath.Base(f), ".pack") {
				n++
			}
		}
		return n
	}
	flushed := make(chan error, 2)
	for i := range 2 {
		// 150 entries, a few KiB: more than a tiny chunk, less than a
		// buffer, so the chunk is a raw run that its seal packs.
		b := putBatch(1, 1, int64(i)*1000, 150, int64(i)*1000)
		for _, e := range b.Events {
			want[string(e.Key)+"\x00"+string(e.Value)] = 1
		}
		r.produceBatch(b)
		r.eventually(20*time.Second, func() bool {
			return testutil.ToFloat64(r.cons.MetricEventsWritten()) == float64(150*(i+1))
		}, "the batch written to temp files")
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			flushed <- r.cons.Flush(ctx)
		}()
		if i == 0 {
			r.eventually(20*time.Second, func() bool { return bucket.held() > 0 }, "the first cycle's upload held")
		}
	}
	r.eventually(20*time.Second, func() bool { return packs() == 2 },
		"the second cycle packed while the first one's upload is held")
	close(bucket.gate)
	for range 2 {
		if err := <-flushed; err != nil {
			t.Fatalf("flush: %v", err)
		}
	}
	metas, got := r.entries(id)
	if len(metas) != 2 {
		t.Fatalf("%d metas committed, want one per cycle", len(metas))
	}
	checkOnce(t, got, want)
}
