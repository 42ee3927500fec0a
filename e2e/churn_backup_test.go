package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// What TestChurn's oracle reads of a flow's backup: every referenced chunk,
// through a bucket that reads each object once, and, when an event is
// missing, where it came from.

// churnBackup is what the referenced chunks of a flow hold.
type churnBackup struct {
	events         map[int64]map[string]int // table -> data key + "\x00" + value -> times stored
	metas, entries int
	firstWrite     uint64 // min_ts of the earliest write-CF put chunk, as restore plans it
}

// scan reads every meta of metas:<id> and every chunk it lists, failing the
// test on an entry stored twice or overlapping offset ranges (the duplicate
// checks of oracleScan).
func (o *churnOracle) scan(ctx context.Context, id meta.FlowID) churnBackup {
	t := o.t
	refs, err := o.store.Metas(ctx, id)
	if err != nil {
		t.Fatalf("metas of flow %d: %v", id, err)
	}
	bk := churnBackup{events: map[int64]map[string]int{}}
	type span struct{ from, to int64 }
	ranges := map[int32][]span{}
	dups := 0
	for _, ref := range refs {
		m := oracleMeta(ctx, t, o.bucket, ref.Path)
		if !m.Serves(id) {
			t.Errorf("meta %s listed under flow %d does not serve it", ref.Path, id)
		}
		bk.metas++
		for _, r := range m.Offsets {
			if r.To > r.From {
				ranges[r.Partition] = append(ranges[r.Partition], span{r.From, r.To})
			}
		}
		for i, f := range m.Files {
			if !m.Holds(id, &f) {
				continue
			}
			if !f.IsMeta && f.CF == sink.CFWrite && f.Op == sink.OpPut && (f.NumberOfEntries > 0 || f.RawLength > 0) &&
				(bk.firstWrite == 0 || f.MinTS < bk.firstWrite) {
				bk.firstWrite = f.MinTS
			}
			framed, err := sink.ReadChunk(ctx, o.bucket, m.DataPath, f)
			if err != nil {
				t.Fatalf("chunk %d of %s: %v", i, m.DataPath, err)
			}
			evs := bk.events[f.TableID]
			if evs == nil {
				evs = map[string]int{}
				bk.events[f.TableID] = evs
			}
			for rest := framed; len(rest) > 0; {
				var k, v []byte
				if k, v, rest, err = event.NextEntry(rest); err != nil {
					t.Fatalf("chunk %d of %s: %v", i, m.DataPath, err)
				}
				bk.entries++
				ek := string(k) + "\x00" + string(v)
				if evs[ek]++; evs[ek] == 2 {
					if dups++; dups <= 5 {
						t.Errorf("flow %d: entry key %x of table %d in more than one place (again in %s chunk %d)", id, k, f.TableID, m.DataPath, i)
					}
				}
			}
		}
	}
	if dups > 0 {
		t.Errorf("flow %d: %d entries referenced more than once", id, dups)
	}
	for p, rs := range ranges {
		sort.Slice(rs, func(i, j int) bool { return rs[i].from < rs[j].from })
		for i := 1; i < len(rs); i++ {
			if rs[i].from < rs[i-1].to {
				t.Errorf("flow %d: partition %d: offset ranges [%d,%d) and [%d,%d) overlap", id, p, rs[i-1].from, rs[i-1].to, rs[i].from, rs[i].to)
			}
		}
	}
	o.bucket.forget()
	return bk
}

// cachedBucket reads each object once, whole, and serves range reads from
// memory: a flow's chunks are thousands of small ranges of a few objects.
type cachedBucket struct {
	sink.Bucket
	mu   sync.Mutex
	objs map[string][]byte
}

func newCachedBucket(ctx context.Context, t testing.TB, c *cluster) *cachedBucket {
	t.Helper()
	b, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatalf("gcs bucket: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &cachedBucket{Bucket: b, objs: map[string][]byte{}}
}

// GetRange serves length bytes from off of the cached object.
func (b *cachedBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	b.mu.Lock()
	data, ok := b.objs[name]
	b.mu.Unlock()
	if !ok {
		rc, err := b.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		data, err = io.ReadAll(rc)
		_ = rc.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		b.mu.Lock()
		b.objs[name] = data
		b.mu.Unlock()
	}
	off = min(max(off, 0), int64(len(data)))
	end := min(off+max(length, 0), int64(len(data)))
	return io.NopCloser(bytes.NewReader(data[off:end])), nil
}

func (b *cachedBucket) forget() {
	b.mu.Lock()
	clear(b.objs)
	b.mu.Unlock()
}

// explainMissing logs, for the first events inside a window that no
// referenced chunk holds, the apply record that carried them and the metas
// whose offset ranges hold that record: which cycle consumed it, and which
// tables of the flow it backed up from that partition.
func (o *churnOracle) explainMissing(ctx context.Context, id meta.FlowID, windows []meta.Window, ckpt uint64, bk churnBackup) {
	t := o.t
	if o.where == nil {
		o.where = churnIndexApply(ctx, t, o.c)
	}
	refs, err := o.store.Metas(ctx, id)
	if err != nil {
		t.Fatalf("metas of flow %d: %v", id, err)
	}
	var metas []sink.Meta
	for _, ref := range refs {
		metas = append(metas, oracleMeta(ctx, t, o.bucket, ref.Path))
	}
	n := 0
	for _, w := range windows {
		for _, e := range o.data.writes[int64(w.TableID)] {
			if e.ts > ckpt || !w.Contains(e.ts) || bk.events[int64(w.TableID)][e.key+"\x00"+e.value] > 0 {
				continue
			}
			if n++; n > 3 {
				return
			}
			at := o.where[e.key]
			var in []string
			for _, m := range metas {
				for _, r := range m.Offsets {
					if r.Partition != at.partition || at.offset < r.From || at.offset >= r.To {
						continue
					}
					tables := map[int64]bool{}
					for _, f := range m.Files {
						if f.Partition == at.partition && m.Holds(id, &f) {
							tables[f.TableID] = true
						}
					}
					in = append(in, fmt.Sprintf("%s (offsets [%d,%d), min_resolved_ts %d; tables of the partition %v)",
						m.CycleID, r.From, r.To, m.MinResolvedTS, slices.Sorted(maps.Keys(tables))))
				}
			}
			t.Logf("flow %d: table %d event at ts %d (window %s) came in region %d's record at partition %d offset %d (resolved ts %d); committed by %s",
				id, w.TableID, e.ts, windowText(w), at.region, at.partition, at.offset, at.resolved, strings.Join(in, ", "))
		}
	}
}

// churnRecord is where an apply event was produced.
type churnRecord struct {
	partition int32
	offset    int64
	region    uint64
	resolved  uint64
}

// churnIndexApply reads the apply topic and maps every event's data key to
// the record that carried it.
func churnIndexApply(ctx context.Context, t *testing.T, c *cluster) map[string]churnRecord {
	adm := newAdmin(t, c.Broker.Addr)
	defer adm.Close()
	out := map[string]churnRecord{}
	for _, r := range churnReadTopic(ctx, t, adm, c.Broker.Addr, testenv.ApplyTopic) {
		var b event.Batch
		if err := event.DecodeBatch(&b, r.Value, event.ContentType(r)); err != nil {
			t.Fatalf("apply record %d/%d: %v", r.Partition, r.Offset, err)
		}
		for _, e := range b.Events {
			out[string(e.Key)] = churnRecord{r.Partition, r.Offset, b.RegionID, b.ResolvedTS}
		}
	}
	return out
}
