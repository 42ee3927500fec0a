package pipeline_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowlog/flowlog/backup"
	"github.com/flowlog/flowlog/pipeline"
	"github.com/flowlog/flowlog/sink"
)

// slowCommitBucket holds back the answer to each meta upload for up to
// delay, so that a cycle's objects exist for a while before its commit: the
// window in which gc could take them for garbage.
type slowCommitBucket struct {
	*sink.MemBucket
	delay time.Duration
}

func (b *slowCommitBucket) Upload(ctx context.Context, obj sink.Object) error {
	err := b.MemBucket.Upload(ctx, obj)
	if strings.HasSuffix(obj.Name, ".meta") {
		time.Sleep(rand.N(b.delay))
	}
	return err
}

// TestGCWhileCommitting runs gc over and over with a short grace while the
// consumer uploads and commits cycles, and plants garbage (objects of cycles
// that never commit, of both layouts) as it goes: gc deletes the garbage and
// never an object a listed meta references, and every event stays
// readable. Flows g and h back up the same table, so under layout v2 every
// cycle is one unit both list; each round drops g's oldest listed meta (as
// a truncate of g does), and gc must keep the unit while h lists it.
func TestGCWhileCommitting(t *testing.T) {
	mem := sink.NewMemBucket()
	bucket := &slowCommitBucket{MemBucket: mem, delay: 80 * time.Millisecond}
	r := newRig(t, 2, bucket, func(c *pipeline.Config) { c.FlushInterval = 100 * time.Millisecond })
	r.start()
	id := r.createFlow("g", 1)
	hid := r.createFlow("h", 1)
	ctx := context.Background()
	const grace = 400 * time.Millisecond // well above the commit delay

	var (
		mu         sync.Mutex
		violations []string
		planted    []string
		deleted    int
		runs       int
	)
	stop := make(chan struct{})
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond): // pace, to share the CPU with the consumer
			}
			// Garbage: a cycle that uploaded long ago and never committed.
			for _, name := range []string{
				fmt.Sprintf("backup/default/g/v1/20231114/22/1-%d-zombie%d.log", id, i),
				fmt.Sprintf("backup/default/g/v1/backupmeta/%020d-%d-zombie%d.meta", 1, id, i),
				sink.DataPathV2("backup", "zombie", 1, fmt.Sprintf("1-%d-%016x", i, i)),
				sink.MetaPathV2("backup", "zombie", 1, fmt.Sprintf("1-%d-%016x", i, i)),
			} {
				body := []byte("zombie")
				if err := mem.Upload(ctx, sink.Object{Name: name, Body: bytes.NewReader(body), Size: 6, CRC32C: sink.CRC32C(body)}); err == nil {
					mem.SetCreated(name, time.Now().Add(-time.Hour))
					mu.Lock()
					planted = append(planted, name)
					mu.Unlock()
				}
			}
			plan, err := sink.PlanGC(ctx, bucket, sink.GCOptions{Prefix: "backup", Grace: grace, Parallel: 4, Refs: backup.GCRefs(r.store)})
			if err == nil {
				var n int
				n, _, err = sink.DeleteObjects(ctx, bucket, plan.Delete, 4, nil)
				mu.Lock()
				deleted += n
				runs++
				mu.Unlock()
			}
			if err != nil {
				mu.Lock()
				violations = append(violations, "gc: "+err.Error())
				mu.Unlock()
			}
			// g's oldest listed meta goes, as a truncate of g removes it.
			if i%3 == 0 {
				if err := r.store.Client().ZPopMin(ctx, r.store.Keys().Metas(id)).Err(); err != nil {
					mu.Lock()
					violations = append(violations, "zpopmin: "+err.Error())
					mu.Unlock()
				}
			}
			// Every listed meta of both flows and its data object (if it
			// has one) are still there.
			refs, err := r.store.Metas(ctx, id)
			if more, herr := r.store.Metas(ctx, hid); herr == nil {
				refs = append(refs, more...)
			} else if err == nil {
				err = herr
			}
			for _, ref := range refs {
				rc, gerr := bucket.Get(ctx, ref.Path)
				if gerr != nil {
					err = gerr
					break
				}
				var m sink.Meta
				raw := new(bytes.Buffer)
				_, _ = raw.ReadFrom(rc)
				rc.Close()
				// A meta of coverage reports only has no data object.
				if m, gerr = sink.DecodeMeta(raw.Bytes()); gerr == nil && m.DataPath != "" {
					_, gerr = bucket.Size(ctx, m.DataPath)
				}
				if gerr != nil {
					err = gerr
					break
				}
			}
			if err != nil {
				mu.Lock()
				violations = append(violations, "listed object missing: "+err.Error())
				mu.Unlock()
			}
		}
	}()

	want := map[string]int{}
	const batches = 60
	for i := range batches {
		b := putBatch(uint64(i%3+1), 1, int64(i)*10, 5, int64(i)*10)
		for _, e := range b.Events {
			want[string(e.Key)+"\x00"+string(e.Value)] = 1
		}
		r.produceBatch(b)
		time.Sleep(15 * time.Millisecond) // pace the load so cycles keep committing while gc runs
	}
	r.waitHandled(batches)
	r.flush()
	// Let gc run at least twice more after the last commit.
	r.eventually(20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return runs >= 10
	}, "gc runs")
	close(stop)
	<-gcDone

	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	metas, got := r.entries(hid)
	if len(got) != len(want) {
		t.Fatalf("read back %d distinct entries of h from %d metas, want %d", len(got), len(metas), len(want))
	}
	_, gotG := r.entries(id) // g's listed metas lost their oldest ones
	for _, g := range []map[string]int{got, gotG} {
		for k := range g {
			if want[k] != 1 {
				t.Fatal("read back an entry that was not produced")
			}
		}
	}
	// Garbage planted before the last run is gone.
	left := 0
	for _, name := range planted[:len(planted)-2] {
		if _, err := mem.Size(ctx, name); err == nil {
			left++
		}
	}
	if left > 0 || deleted < len(planted)-2 {
		t.Errorf("gc left %d of %d planted objects (deleted %d objects in %d runs)", left, len(planted)-2, deleted, runs)
	}
	t.Logf("%d gc runs deleted %d objects while %d cycles committed", runs, deleted, len(metas))

	// /status shows a listed snapshot and the truncation point.
	snap := sink.SnapshotMetaPath("backup", "default", "g", id, 12345)
	if err := r.store.AddSnapshot(ctx, id, snap); err != nil {
		t.Fatal(err)
	}
	if err := r.store.Client().Set(ctx, r.store.Keys().TruncatedBefore(id), "12345", 0).Err(); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range r.cons.Status().Flows {
		if f.ID == id {
			found = true
			if f.SnapshotTS != 12345 || f.TruncatedBefore != 12345 {
				t.Errorf("/status flow %+v, want snapshot and truncation point 12345", f)
			}
		}
	}
	if !found {
		t.Errorf("/status lacks flow %d", id)
	}
}

// metaFailBucket fails meta uploads while failing is set: a cycle whose
// data object is uploaded and whose commit waits.
type metaFailBucket struct {
	*sink.MemBucket
	failing atomic.Bool
}

func (b *metaFailBucket) Upload(ctx context.Context, obj sink.Object) error {
	if b.failing.Load() && strings.HasSuffix(obj.Name, ".meta") {
		return errors.New("injected meta upload failure")
	}
	return b.MemBucket.Upload(ctx, obj)
}

// TestLateCommitUploadsAgain: a cycle whose objects wait longer than
// --max-commit-age for their commit uploads them again under new names, so
// a gc whose grace exceeds that age, running all along, never deletes what
// the cycle commits; the stale first upload becomes garbage gc removes.
func TestLateCommitUploadsAgain(t *testing.T) {
	mem := sink.NewMemBucket()
	bucket := &metaFailBucket{MemBucket: mem}
	r := newRig(t, 1, bucket, func(c *pipeline.Config) {
		c.MaxCommitAge = 200 * time.Millisecond
		c.FatalAfter = 100000
		// The rename is the same in both layouts (a layout v2 test of it:
		// TestV2LateCommitRenames); this one drives it through gc, which
		// judges layout v1 objects per flow.
		c.Layout = pipeline.LayoutV1
	})
	r.start()
	id := r.createFlow("late", 1)
	ctx := context.Background()

	bucket.failing.Store(true)
	r.produceBatch(putBatch(1, 1, 1, 5, 10))
	r.waitHandled(1)
	flushed := make(chan error, 1)
	go func() { flushed <- r.cons.Flush(ctx) }()

	var violations []string
	stop, gcDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(gcDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			plan, err := sink.PlanGC(ctx, bucket, sink.GCOptions{Prefix: "backup", Grace: 300 * time.Millisecond, Refs: backup.GCRefs(r.store)})
			if err == nil {
				_, _, err = sink.DeleteObjects(ctx, bucket, plan.Delete, 2, nil)
			}
			if err != nil {
				violations = append(violations, err.Error())
			}
		}
	}()
	// The data object is up; its meta keeps failing until gc has taken the
	// data object for garbage: a commit of these names now would list a
	// deleted object.
	var first string
	r.eventually(20*time.Second, func() bool {
		_ = mem.List(ctx, "backup/", func(o sink.ObjectInfo) error {
			if first == "" && strings.HasSuffix(o.Name, ".log") {
				first = o.Name
			}
			return nil
		})
		return first != ""
	}, "the cycle's data object uploaded")
	r.eventually(20*time.Second, func() bool {
		_, err := mem.Size(ctx, first)
		return err != nil
	}, "gc deleting the uncommitted "+first)
	bucket.failing.Store(false)
	select {
	case err := <-flushed:
		if err != nil {
			t.Fatalf("flush: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("flush did not finish")
	}
	close(stop)
	<-gcDone
	for _, v := range violations {
		t.Error(v)
	}
	metas, got := r.entries(id)
	if len(metas) != 1 || !strings.Contains(metas[0].CycleID, "-r") || !strings.Contains(metas[0].DataPath, metas[0].CycleID) {
		t.Fatalf("committed metas %+v, want one, uploaded again under a renamed cycle", metas)
	}
	if len(got) != 5 {
		t.Fatalf("read back %d entries, want 5", len(got))
	}
}
