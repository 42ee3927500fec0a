package e2e

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
	"github.com/flowlog/flowlog/sink/gcs"
)

// TestBackupEndToEnd is the backup's end-to-end check, on processes only: a
// flow on tables 1 and 2, a load over tables 1, 2 and 3, and then every
// produced event of tables 1 and 2 sits in exactly one chunk referenced by
// metas:<flow_id> (sha256 verified), nothing of table 3 does, and the Kafka
// and Redis offsets equal the end offsets.
func TestBackupEndToEnd(t *testing.T) {
	const partitions = 4
	c := startCluster(t, partitions)
	cfg := loadgen.Config{
		Events: 200_000, Tables: []int64{1, 2, 3}, Regions: 16, Seed: 20260301,
		StartTime: time.Date(2026, 3, 1, 23, 59, 40, 0, time.UTC), // crosses an hour and a date
	}
	if testing.Short() {
		cfg.Events = 20_000
	}
	want := expectedEvents(cfg, map[int64]bool{1: true, 2: true})

	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", "f12", "--tables", "1,2")
	cons := c.startConsumer(t, "consumer-1", "--flush-interval", "2s", "--flush-size", "8MiB")
	out := runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
	if line := fmt.Sprintf("max resolved ts %d\n", want.maxResolved); !strings.Contains(out, line) {
		t.Fatalf("producer printed %q, want a line ending %q", out, line)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	store := meta.NewStore(c.Redis.Client(t), "flowlog", nil)
	id := waitFlowCheckpoint(ctx, t, store, "f12", want.maxResolved, 90*time.Second)

	bucket, err := gcs.New(ctx, gcs.Config{Bucket: c.GCS.Bucket, Endpoint: c.GCS.Addr})
	if err != nil {
		t.Fatalf("gcs bucket: %v", err)
	}
	defer bucket.Close()
	got := readFlowBackup(ctx, t, store, bucket, id)
	if got.metas == 0 {
		t.Fatalf("no meta in metas:%d", id)
	}
	t.Logf("flow %d: %d metas, %d chunks, %d entries; %d expected events", id, got.metas, got.chunks, got.entries, want.total)

	missing, dup := 0, 0
	for k, n := range want.events {
		switch g := got.events[k]; {
		case g == 0:
			if missing++; missing <= 5 {
				t.Errorf("missing: %s", k)
			}
		case g != n:
			if dup++; dup <= 5 {
				t.Errorf("%s stored %d times, produced %d", k, g, n)
			}
		}
	}
	extra, table3 := 0, 0
	for k, n := range got.events {
		if _, ok := want.events[k]; ok {
			continue
		}
		if k.table == 3 {
			table3 += n
		} else if extra += n; extra <= 5 {
			t.Errorf("extra entry: %s", k)
		}
	}
	if missing+dup+extra+table3 > 0 {
		t.Errorf("%d events missing, %d stored more than once, %d extra entries, %d entries of table 3", missing, dup, extra, table3)
	}
	if got.entries != want.total {
		t.Errorf("read %d entries, want %d", got.entries, want.total)
	}

	checkOffsetsAtEnd(ctx, t, c.Broker.Addr, "flowlog", store, partitions)
	if !cons.Running() {
		t.Fatalf("consumer exited: %v", cons.Wait())
	}
	if err := cons.Stop(); err != nil {
		t.Errorf("consumer exit after SIGTERM: %v", err)
	}
}

// eventKey identifies one stored apply event: its chunk's table, cf and op
// and its key and value bytes.
type eventKey struct {
	table      int64
	cf, op     string
	key, value string
}

func (k eventKey) String() string {
	return fmt.Sprintf("table %d %s/%s key %x (%d value bytes)", k.table, k.cf, k.op, k.key, len(k.value))
}

// wantEvents are the events a flow on some tables must back up.
type wantEvents struct {
	events      map[eventKey]int
	total       int
	maxResolved uint64
}

// expectedEvents regenerates the load of cfg and returns its events of
// tables: every default- and write-CF event (lock-CF ones are never stored:
// docs/FORMAT.md, "How an apply record is handled"), by chunk identity.
func expectedEvents(cfg loadgen.Config, tables map[int64]bool) wantEvents {
	w := wantEvents{events: map[eventKey]int{}}
	g := loadgen.New(cfg)
	for b, ok := g.Next(); ok; b, ok = g.Next() {
		for _, e := range b.Events {
			if e.CF == event.CFLock {
				continue
			}
			raw, _, err := event.DecodeDataKey(e.Key)
			if err != nil {
				panic(fmt.Sprintf("loadgen produced an undecodable key %x: %v", e.Key, err))
			}
			table, ok := event.TableIDOfRaw(raw)
			if !ok || !tables[table] {
				continue
			}
			w.events[eventKey{table, sink.CFName(e.CF), sink.OpName(e.Op), string(e.Key), string(e.Value)}]++
			w.total++
		}
	}
	w.maxResolved = g.MaxResolvedTS()
	return w
}

// waitFlowCheckpoint waits until flow name (catalog default) exists and its
// checkpoint_ts reaches ts, failing the test after timeout with the
// checkpoint it saw; it returns the flow's id.
func waitFlowCheckpoint(ctx context.Context, t testing.TB, store *meta.Store, name string, ts uint64, timeout time.Duration) meta.FlowID {
	t.Helper()
	id, _ := waitFlowCheckpointTS(ctx, t, store, name, ts, timeout)
	return id
}

// waitFlowCheckpointTS is waitFlowCheckpoint that also returns the
// checkpoint_ts it saw (at least ts). A flow that is not active fails the
// test at once: only an operator's resume makes it move again.
func waitFlowCheckpointTS(ctx context.Context, t testing.TB, store *meta.Store, name string, ts uint64, timeout time.Duration) (meta.FlowID, uint64) {
	t.Helper()
	var id meta.FlowID
	var ckpt uint64
	waitForOrStop(t, timeout, func() (bool, string, error) {
		if id == 0 {
			got, ok, err := store.FlowIDByName(ctx, meta.DefaultCatalog, name)
			if err != nil || !ok {
				return false, fmt.Sprintf("flow %s not created (%v)", name, err), nil
			}
			id = got
		}
		st, err := store.FlowState(ctx, id)
		if err != nil {
			return false, err.Error(), nil
		}
		if st.Status != meta.StatusActive && st.Status != "" {
			return false, "", fmt.Errorf("flow %s is %s: %s", name, st.Status, st.Error)
		}
		ckpt = st.CheckpointTS
		return ckpt >= ts, fmt.Sprintf("flow %s checkpoint_ts %d, want >= %d", name, ckpt, ts), nil
	})
	return id, ckpt
}

// flowBackup is what readFlowBackup found.
type flowBackup struct {
	events                 map[eventKey]int
	metas, chunks, entries int
}

// readFlowBackup reads every meta of metas:<id>, every chunk of the flow it
// lists (in a layout v2 meta those that hold the flow: sink.Meta.Holds;
// ReadChunk checks the sha256) and every entry of them.
func readFlowBackup(ctx context.Context, t testing.TB, store *meta.Store, b sink.Bucket, id meta.FlowID) flowBackup {
	t.Helper()
	refs, err := store.Metas(ctx, id)
	if err != nil {
		t.Fatalf("metas of flow %d: %v", id, err)
	}
	fb := flowBackup{events: map[eventKey]int{}}
	for _, ref := range refs {
		r, err := b.Get(ctx, ref.Path)
		if err != nil {
			t.Fatalf("get meta: %v", err)
		}
		raw, err := io.ReadAll(r)
		_ = r.Close()
		if err != nil {
			t.Fatalf("read meta %s: %v", ref.Path, err)
		}
		m, err := sink.DecodeMeta(raw)
		if err != nil {
			t.Fatalf("decode meta %s: %v", ref.Path, err)
		}
		if !m.Serves(id) {
			t.Fatalf("meta %s listed under flow %d does not serve it", ref.Path, id)
		}
		fb.metas++
		for i, f := range m.Files {
			if !m.Holds(id, &f) {
				continue
			}
			framed, err := sink.ReadChunk(ctx, b, m.DataPath, f)
			if err != nil {
				t.Fatalf("chunk %d of %s: %v", i, m.DataPath, err)
			}
			fb.chunks++
			n := int64(0)
			for rest := framed; len(rest) > 0; n++ {
				var k, v []byte
				if k, v, rest, err = event.NextEntry(rest); err != nil {
					t.Fatalf("chunk %d of %s, entry %d: %v", i, m.DataPath, n, err)
				}
				fb.events[eventKey{f.TableID, f.CF, f.Op, string(k), string(v)}]++
			}
			if n != f.NumberOfEntries {
				t.Errorf("chunk %d of %s holds %d entries, meta says %d", i, m.DataPath, n, f.NumberOfEntries)
			}
			fb.entries += int(n)
		}
	}
	return fb
}

// checkOffsetsAtEnd checks that group's committed Kafka offsets and the
// Redis offset:<topic>:<p> of every apply partition equal its end offset.
func checkOffsetsAtEnd(ctx context.Context, t testing.TB, brokers, group string, store *meta.Store, partitions int) {
	t.Helper()
	end, committed := applyOffsets(ctx, t, brokers, group)
	for p := range int32(partitions) {
		e, ok := end.Lookup(testenv.ApplyTopic, p)
		if !ok || e.Err != nil {
			t.Fatalf("end offset of partition %d: %v", p, e.Err)
		}
		if e.Offset == 0 {
			t.Errorf("partition %d is empty: the load should cover every partition", p)
		}
		if c, ok := committed.Lookup(testenv.ApplyTopic, p); !ok || c.Err != nil || c.At != e.Offset {
			t.Errorf("partition %d: Kafka committed offset %d (%v), end offset %d", p, c.At, c.Err, e.Offset)
		}
		r, ok, err := store.Offset(ctx, testenv.ApplyTopic, p)
		if err != nil || !ok || r != e.Offset {
			t.Errorf("partition %d: Redis offset %d (set %v, %v), end offset %d", p, r, ok, err, e.Offset)
		}
	}
}

// applyOffsets returns the apply topic's end offsets and group's committed
// offsets.
func applyOffsets(ctx context.Context, t testing.TB, brokers, group string) (kadm.ListedOffsets, kadm.OffsetResponses) {
	t.Helper()
	adm := newAdmin(t, brokers)
	defer adm.Close()
	// A coordinator still loading or moving answers with a retriable
	// error (COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS):
	// ask again until ctx ends.
	for {
		committed, err := adm.FetchOffsets(ctx, group)
		if err == nil {
			return endOffsets(ctx, t, adm), committed
		}
		if !kerr.IsRetriable(err) || ctx.Err() != nil {
			t.Fatalf("committed offsets of %s: %v", group, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// endOffsets returns the apply topic's end offsets, failing the test if
// they cannot be listed.
func endOffsets(ctx context.Context, t testing.TB, adm *kadm.Client) kadm.ListedOffsets {
	t.Helper()
	end, err := listEndOffsets(ctx, adm)
	if err != nil {
		t.Fatal(err)
	}
	return end
}

// listEndOffsets returns the apply topic's end offsets.
func listEndOffsets(ctx context.Context, adm *kadm.Client) (kadm.ListedOffsets, error) {
	end, err := adm.ListEndOffsets(ctx, testenv.ApplyTopic)
	if err == nil {
		err = end.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", testenv.ApplyTopic, err)
	}
	return end, nil
}

func newAdmin(t testing.TB, brokers string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	return kadm.NewClient(cl)
}
