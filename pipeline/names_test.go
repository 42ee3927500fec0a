package pipeline_test

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// cycleIDRE is a cycle id: <unix ms>-<seq>-<16 hex digits of random bits>,
// maybe renamed (-r<N>).
var cycleIDRE = regexp.MustCompile(`^[0-9]+-[0-9]+-([0-9a-f]{16})(-r[0-9]+)?$`)

// Cycle ids carry 64 random bits, so the name of the next cycle's objects
// cannot be known (and an object placed there ahead of it) from the names
// before it.
func TestCycleIDsCarryRandomBits(t *testing.T) {
	r := newRig(t, 1, sink.NewMemBucket(), nil)
	r.start()
	id := r.createFlow("ids", 1)
	for i := range 3 {
		r.produceBatch(putBatch(1, 1, int64(i)*10, 2, int64(i)*10))
		r.waitHandled(int64(i + 1))
		r.flush()
	}
	metas, _ := r.entries(id)
	seen := map[string]bool{}
	for _, m := range metas {
		sub := cycleIDRE.FindStringSubmatch(m.CycleID)
		if sub == nil {
			t.Fatalf("cycle id %q is not <ms>-<seq>-<16 hex digits>", m.CycleID)
		}
		if seen[sub[1]] {
			t.Fatalf("two cycles share the random part %s", sub[1])
		}
		seen[sub[1]] = true
	}
	if len(seen) != 3 {
		t.Fatalf("%d cycles committed, want 3", len(seen))
	}
}

// squatBucket places a 7-byte object of its own at the first name of each
// cycle's objects that squat selects, just before the consumer uploads
// there, as an attacker who can list the bucket or guess names would.
type squatBucket struct {
	*sink.MemBucket
	squat   func(name string) bool
	mu      sync.Mutex
	cycles  map[string]bool // cycle ids squatted once
	squated atomic.Int64
}

func (b *squatBucket) Upload(ctx context.Context, obj sink.Object) error {
	if b.squat(obj.Name) {
		base := obj.Name[strings.LastIndexByte(obj.Name, '/')+1:]
		if m := regexp.MustCompile(`[0-9]+-[0-9]+-[0-9a-f]{16}`).FindString(base); m != "" {
			b.mu.Lock()
			first := !b.cycles[m]
			b.cycles[m] = true
			b.mu.Unlock()
			if first {
				body := []byte("squat!!")
				_ = b.MemBucket.Upload(ctx, sink.Object{Name: obj.Name, Body: bytes.NewReader(body), Size: 7, CRC32C: sink.CRC32C(body)})
				b.squated.Add(1)
			}
		}
	}
	return b.MemBucket.Upload(ctx, obj)
}

// An object of other content at one of a cycle's names makes the cycle take
// new names at once (the -r<N> rename), whether it is the first object of
// the cycle (the data object) or one after an upload that went through
// (the meta): no retry backoff (an hour here) is waited for, and nothing
// counts toward --fatal-after.
func TestTakenNameRenamedAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		squat func(string) bool
	}{
		{"data object taken", func(n string) bool { return strings.HasSuffix(n, ".log") }},
		{"meta taken after the data object went up", func(n string) bool { return strings.HasSuffix(n, ".meta") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &squatBucket{MemBucket: sink.NewMemBucket(), squat: tc.squat, cycles: map[string]bool{}}
			r := newRig(t, 1, b, func(c *pipeline.Config) {
				c.RetryBackoff, c.MaxRetryDelay, c.FatalAfter = time.Hour, time.Hour, 1
			})
			r.start()
			id := r.createFlow("squatted", 1)
			batch := putBatch(1, 1, 0, 5, 0)
			r.produceBatch(batch)
			r.waitHandled(1)
			r.flush() // 30s, far below the hour a retry would wait
			if b.squated.Load() == 0 {
				t.Fatal("no name was taken: the test took nothing from the consumer")
			}
			metas, got := r.entries(id)
			want := map[string]int{}
			for _, kv := range keysOf(batch) {
				want[string(kv)] = 1
			}
			checkOnce(t, got, want)
			for _, m := range metas {
				if len(m.Files) > 0 && !strings.HasSuffix(m.CycleID, "-r1") {
					t.Errorf("committed cycle %s, want it renamed once", m.CycleID)
				}
			}
			if st, err := r.store.FlowState(context.Background(), id); err != nil || st.Status != meta.StatusActive {
				t.Errorf("flow state %+v (%v), want active: a taken name is no failure", st, err)
			}
			// A renamed meta of coverage reports only (the create's) has no
			// data object: none is uploaded for it.
			_ = b.Iter(context.Background(), sink.V2LogDir("backup"), func(o string) error {
				if n, err := b.Size(context.Background(), o); err == nil && n == 0 {
					t.Errorf("empty data object %s", o)
				}
				return nil
			})
		})
	}
}

// failWhile fails every upload while failing is set.
type failWhile struct {
	*sink.MemBucket
	failing  atomic.Bool
	attempts atomic.Int64
}

func (b *failWhile) Upload(ctx context.Context, obj sink.Object) error {
	if b.failing.Load() {
		b.attempts.Add(1)
		return context.DeadlineExceeded
	}
	return b.MemBucket.Upload(ctx, obj)
}

// A cycle that holds only a dropped flow's data and cannot upload keeps
// retrying (it owes the data routed before the drop) but never makes a live
// flow fatal, the cycles behind it stay bounded however long it fails
// (cycles waiting beyond the bound would grow without end while interval
// triggers go on), and /readyz names it. Once uploads work, everything
// commits.
func TestFailingCycleOfDroppedFlowIsBounded(t *testing.T) {
	b := &failWhile{MemBucket: sink.NewMemBucket()}
	r := newRig(t, 1, b, func(c *pipeline.Config) {
		c.FlushInterval, c.FatalAfter, c.StallTimeout = 50*time.Millisecond, 3, time.Hour
	})
	r.start()
	r.heartbeats(1, 0)
	dropped := r.createFlow("dropped", 1)
	live := r.createFlow("live", 2)
	r.settle()
	b.failing.Store(true)
	r.produceBatch(putBatch(1, 1, 0, 5, 0)) // the dropped flow's data only
	r.waitHandled(2)
	r.eventually(20*time.Second, func() bool { return b.attempts.Load() >= 2 }, "the dropped flow's cycle failing")
	r.produce(testenv.DDLTopic, "dropped", ddl("drop", "dropped"), "application/json")
	r.eventually(10*time.Second, func() bool {
		_, ok, err := r.store.FlowIDByName(context.Background(), "default", "dropped")
		return err == nil && !ok
	}, "the flow dropped")

	liveData := putBatch(2, 2, 100, 5, 100)
	r.produceBatch(liveData)
	maxWaiting := 0
	r.eventually(60*time.Second, func() bool {
		maxWaiting = max(maxWaiting, r.cons.Status().InflightCycles)
		return b.attempts.Load() >= 80
	}, "80 failed uploads while interval cycles go on")
	if maxWaiting > 8 {
		t.Errorf("%d cycles waited behind the failing one, want at most 8", maxWaiting)
	}
	ctx := context.Background()
	if st, err := r.store.FlowState(ctx, live); err != nil || st.Status != meta.StatusActive {
		t.Errorf("live flow state %+v (%v): the dropped flow's failing cycle made it fatal", st, err)
	}
	if v := testutil.ToFloat64(r.cons.MetricFlowFatal("default/live")); v != 0 {
		t.Errorf("flow_fatal of the live flow = %v", v)
	}
	if err := r.cons.Stalled(); err == nil || !strings.Contains(err.Error(), "cannot upload") {
		t.Errorf("/readyz check = %v, want the cycle that cannot upload named", err)
	}

	b.failing.Store(false)
	r.waitHandled(3)
	r.flush()
	_, gotDropped := r.entries(dropped)
	_, gotLive := r.entries(live)
	if len(gotDropped) != 5 || len(gotLive) != 5 {
		t.Fatalf("after the fault: dropped flow %d entries, live flow %d, want 5 each", len(gotDropped), len(gotLive))
	}
	if err := r.cons.Stalled(); err != nil {
		t.Errorf("/readyz check after recovery: %v", err)
	}
}
