package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/internal/loadgen"
	"github.com/flowlog/flowlog/internal/testenv"
	"github.com/flowlog/flowlog/meta"
)

// The backups that the replay tests replay: a flow of the e2e group
// "flowlog" on the default Redis and bucket prefixes, backed up by one
// consumer from seeded loads, with flow DDL between the loads.

// replayPartitions is the partition count of the original apply topic.
const replayPartitions = 4

// replaySource is an original backup, once its checkpoint reached the end
// of everything produced.
type replaySource struct {
	c     *cluster
	store *meta.Store
	cons  *proc
	name  string
	id    meta.FlowID
	ckpt  uint64
	cur   map[uint32]meta.Window
	hist  []meta.Window
	loads []loadgen.Config
}

// replayPhase is a step of a backup: a flow DDL (`producer flow` arguments
// without the brokers; none for nil), then a load (none when Events is 0).
type replayPhase struct {
	ddl  []string
	load loadgen.Config
}

// replayBackup starts a cluster, creates flow name over tables, starts a
// consumer and runs phases one after another: each DDL is published once
// the load before it is backed up, and each load starts a second past the
// TSO where the one before it ended, so every load's ts lie above every
// earlier one's. Region ids 1..regions announce themselves first (a
// partition counts only regions it heard from). extra, if not nil, runs
// after the phases (with the backup so far) and returns the resolved ts it
// took the regions to; the backup is done when the flow's checkpoint
// reaches that ts, or else the end of the last load.
func replayBackup(t *testing.T, name string, tables []int64, regions int, phases []replayPhase,
	extra func(src *replaySource) uint64) *replaySource {
	t.Helper()
	c := startCluster(t, replayPartitions)
	src := &replaySource{c: c, store: meta.NewStore(c.Redis.Client(t), "flowlog", nil), name: name}
	runProducer(t, "flow", "create", "--brokers", c.Broker.Addr, "--name", name, "--tables", tableList(tables))
	start := replayBase()
	runProducer(t, "heartbeat", "--brokers", c.Broker.Addr, "--regions", strconv.Itoa(regions),
		"--start-time", start.Format(time.RFC3339Nano))
	src.cons = c.startConsumer(t, "origin")
	var end uint64
	for _, ph := range phases {
		if ph.ddl != nil {
			runProducer(t, append(ph.ddl, "--brokers", c.Broker.Addr)...)
		}
		if ph.load.Events == 0 {
			continue
		}
		cfg := ph.load
		cfg.StartTime = start
		runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(cfg)...)...)
		src.loads = append(src.loads, cfg)
		end = expectLoad(cfg).maxResolved
		start = event.PhysicalTime(end).Add(time.Second)
		// The next DDL comes after the load is backed up: a consumer
		// that is behind would route the load's last records with the
		// next definition already (the DDL barrier holds back data
		// published after a DDL, not before it). Regions the load does
		// not write are resolved to its end too.
		runProducer(t, "heartbeat", "--brokers", c.Broker.Addr, "--regions", strconv.Itoa(regions),
			"--ts", strconv.FormatUint(end, 10))
		waitFlowCheckpointTS(context.Background(), t, src.store, name, end, 90*time.Second)
	}
	if extra != nil {
		end = extra(src)
	}
	ctx := context.Background()
	src.id, src.ckpt = waitFlowCheckpointTS(ctx, t, src.store, name, end, 90*time.Second)
	// The windows are final once nothing is pending.
	waitFor(t, 30*time.Second, func() (bool, string) {
		pending, err := src.store.PendingCoverage(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pending {
			if p.ID == src.id {
				return false, fmt.Sprintf("flow %d has %d pending coverage entries", p.ID, len(p.Entries))
			}
		}
		return true, ""
	})
	cur, hist, err := src.store.Windows(ctx, src.id)
	if err != nil {
		t.Fatal(err)
	}
	src.cur, src.hist = cur, hist
	t.Logf("backup of flow %s (id %d): checkpoint %d, windows %s", name, src.id, src.ckpt, src.windowsText())
	return src
}

// replayBase is the TSO physical time the first load of a backup starts
// at: far enough in the past that every load ends before now.
func replayBase() time.Time {
	return time.Now().UTC().Add(-30 * time.Minute).Truncate(time.Millisecond)
}

// windowAt is the window of table that holds ts, if any.
func (s *replaySource) windowAt(table int64, ts uint64) (meta.Window, bool) {
	return meta.WindowAt(s.cur, s.hist, uint32(table), ts)
}

// tablesAt are the tables of the flow restorable at ts, sorted.
func (s *replaySource) tablesAt(ts uint64) []int64 {
	var out []int64
	seen := map[int64]bool{}
	for _, w := range append(mapValues(s.cur), s.hist...) {
		tb := int64(w.TableID)
		if _, ok := s.windowAt(tb, ts); ok && !seen[tb] {
			seen[tb] = true
			out = append(out, tb)
		}
	}
	slices.Sort(out)
	return out
}

func (s *replaySource) windowsText() string {
	out := ""
	for _, w := range append(s.hist, mapValues(s.cur)...) {
		out += fmt.Sprintf(" %d:%s", w.TableID, windowText(w))
	}
	return out
}

// conn are the connection flags of `consumer replay` and `restore` for the
// original backup (replay also takes --brokers: it writes to Kafka).
func (s *replaySource) conn() []string {
	return append(s.c.oracleConn(), "--brokers", s.c.Broker.Addr)
}

// The churned backup of the round trip.
const (
	churnRegions = 6
	longRegion   = churnRegions + 1 // the region of the crafted long transactions
	quietRegion  = churnRegions + 2 // a region that writes early in the last load and then only resolves
	longHandle   = 1 << 20          // the crafted rows' handles: above any the loads write
	longTxns     = 24
	quietTxns    = 6
)

// replayLongTxn is a crafted transaction whose long value was prewritten
// well before it committed: the prewrite (its default-CF put) goes out
// before the last load, the commit (its write-CF put) after it.
type replayLongTxn struct {
	table, handle int64
	start, commit uint64
	value         []byte
}

// replayChurn is the round trip's original backup and what it was made
// of.
type replayChurn struct {
	*replaySource
	seed int64
	// lo and hi bound the TSO range of the last load.
	lo, hi uint64
	// long are region longRegion's transactions, quiet region
	// quietRegion's.
	long, quiet []replayLongTxn
}

// replayChurnBackup backs up, seeded by seed, flow "rt": created on
// tables 11, 12, 13 and 15; a load on tables 11-16; a replace that
// removes 13 and adds 14; a load; a replace that adds 13 back (a new
// window) and removes 15; a last load. (Table ids are not region ids, as
// in a real store.) Around the last load region longRegion prewrites long values
// just as it begins and commits them in two groups, early in it and late
// in it, so a ts A taken from the middle of the last load has values
// prewritten before A that commits after A need; and region quietRegion
// writes a few rows early in it and then only resolves, so it has no event
// after such an A. Values are long (in the default CF) in the first and
// last load and short in the middle one, and a quarter of the mutations
// are deletes.
func replayChurnBackup(t *testing.T, seed int64) *replayChurn {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	load := func(n int, size int, k int64) loadgen.Config {
		return loadgen.Config{Events: n, Tables: []int64{11, 12, 13, 14, 15, 16}, Regions: churnRegions, Rows: 240,
			ValueSize: size, Seed: seed*10 + k, DeleteRatio: 0.25, HeartbeatEvery: 3}
	}
	rc := &replayChurn{seed: seed}
	phases := []replayPhase{
		{load: load(1500+rng.IntN(500), 300+rng.IntN(200), 1)},
		{ddl: []string{"flow", "replace", "--name", "rt", "--tables", "11,12,14,15"}, load: load(1500+rng.IntN(500), 64, 2)},
		{ddl: []string{"flow", "replace", "--name", "rt", "--tables", "11,12,13,14"}},
	}
	last := load(2500+rng.IntN(1000), 260+rng.IntN(400), 3)
	rc.replaySource = replayBackup(t, "rt", []int64{11, 12, 13, 15}, quietRegion, phases, func(src *replaySource) uint64 {
		// The last load, with the long transactions around it.
		c := src.c
		prev := src.loads[len(src.loads)-1]
		last.StartTime = event.PhysicalTime(expectLoad(prev).maxResolved).Add(time.Second)
		rc.lo = event.ComposeTS(last.StartTime.UnixMilli(), 0)
		rc.hi = expectLoad(last).maxResolved
		rc.long, rc.quiet = replayLongPlan(rng, rc.lo, rc.hi)
		pre, commit := replayLongBatches(rc.lo, rc.long)
		replayProduce(t, c.Broker.Addr, testenv.ApplyTopic, pre, replayQuietBatch(rc.quiet))
		runProducer(t, append([]string{"load", "--brokers", c.Broker.Addr}, loadArgs(last)...)...)
		src.loads = append(src.loads, last)
		replayProduce(t, c.Broker.Addr, testenv.ApplyTopic, commit)
		end := rc.hi + 1<<18
		runProducer(t, "heartbeat", "--brokers", c.Broker.Addr, "--regions", strconv.Itoa(quietRegion),
			"--ts", strconv.FormatUint(end, 10))
		return end
	})
	return rc
}

// replayLongPlan plans the crafted transactions in (lo, hi], on tables 11-14,
// each on its own row: the long ones with prewrites in the first tenth of
// the span, half of the commits in the second tenth and half in the last
// fifth; the quiet region's, short, inside the first tenth.
func replayLongPlan(rng *rand.Rand, lo, hi uint64) (long, quiet []replayLongTxn) {
	span := hi - lo
	at := func(from, to float64) uint64 {
		return lo + uint64(from*float64(span)) + rng.Uint64N(max(uint64((to-from)*float64(span)), 1))
	}
	for i := range quietTxns {
		tx := replayLongTxn{table: int64(11 + i%4), handle: longHandle + 1000 + int64(i), commit: at(0.02, 0.09)}
		tx.start = tx.commit - 1
		tx.value = fmt.Appendf(nil, "%squiet-%d", loadgen.Marker, i)
		quiet = append(quiet, tx)
	}
	slices.SortFunc(quiet, func(a, b replayLongTxn) int { return cmpUint(a.commit, b.commit) })
	var out []replayLongTxn
	for i := range longTxns {
		tx := replayLongTxn{table: int64(11 + i%4), handle: longHandle + int64(i), start: at(0.01, 0.1)}
		if i%2 == 0 {
			tx.commit = at(0.1, 0.2)
		} else {
			tx.commit = at(0.8, 0.95)
		}
		tx.value = make([]byte, 300+rng.IntN(1700))
		for j := range tx.value {
			tx.value[j] = 'a' + byte(rng.IntN(26))
		}
		copy(tx.value, fmt.Sprintf("%slong-%d-", loadgen.Marker, i))
		out = append(out, tx)
	}
	return out, quiet
}

// replayQuietBatch is region quietRegion's one batch of short puts,
// resolved at its last commit.
func replayQuietBatch(txns []replayLongTxn) *event.Batch {
	b := &event.Batch{RegionID: quietRegion}
	for _, tx := range txns {
		rec, err := event.AppendWrite(nil, event.Write{Type: event.WritePut, StartTS: tx.start, ShortValue: tx.value, HasShortValue: true})
		if err != nil {
			panic(err)
		}
		b.Events = append(b.Events, event.Event{Key: event.AppendDataKey(nil, event.RowKey(tx.table, tx.handle), tx.commit),
			Value: rec, CF: event.CFWrite, Op: event.OpPut})
		b.ResolvedTS = tx.commit
	}
	return b
}

// replayLongBatches are region longRegion's two batches: the prewrites,
// resolved at lo (below every prewrite: nothing of the region is complete
// past it), and the commits in commit-ts order, resolved at the last one.
func replayLongBatches(lo uint64, txns []replayLongTxn) (pre, commit *event.Batch) {
	pre = &event.Batch{RegionID: longRegion, ResolvedTS: lo}
	commit = &event.Batch{RegionID: longRegion}
	sorted := slices.Clone(txns)
	slices.SortFunc(sorted, func(a, b replayLongTxn) int { return cmpUint(a.commit, b.commit) })
	for _, tx := range sorted {
		raw := event.RowKey(tx.table, tx.handle)
		pre.Events = append(pre.Events, event.Event{Key: event.AppendDataKey(nil, raw, tx.start), Value: tx.value,
			CF: event.CFDefault, Op: event.OpPut})
		rec, err := event.AppendWrite(nil, event.Write{Type: event.WritePut, StartTS: tx.start})
		if err != nil {
			panic(err)
		}
		commit.Events = append(commit.Events, event.Event{Key: event.AppendDataKey(nil, raw, tx.commit), Value: rec,
			CF: event.CFWrite, Op: event.OpPut})
		commit.ResolvedTS = tx.commit
	}
	return pre, commit
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// replayProduce publishes batches to topic as `producer load` does: keyed
// by region id, protobuf values, one record at a time, each up to 4 MiB
// (as large as the topic takes).
func replayProduce(t *testing.T, brokers, topic string, batches ...*event.Batch) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(4<<20))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, b := range batches {
		r := &kgo.Record{Key: strconv.AppendUint(nil, b.RegionID, 10), Value: event.EncodeBatch(nil, b)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce region %d's batch to %s: %v", b.RegionID, topic, err)
		}
	}
}
