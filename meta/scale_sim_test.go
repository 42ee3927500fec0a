package meta_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flowlog/flowlog/meta"
)

// A simulated replica runs the Redis side of the consumer's flush cycle
// through the real meta API, in the order the pipeline calls it: on
// assignment the lease and the start position of each partition; per
// cycle a registry refresh and the pending coverage after a DDL, one
// commit (leases, offset compare-and-set, checkpoints, maxts, regions,
// coverage reports, the cycle's layout v2 meta listed under every flow,
// last_flush_ts per flow), then the checkpoint advance (the advance turn;
// its holder reads every partition's checkpoint, finalises coverage and
// advances every flow, the others read the global checkpoint). Kafka and the bucket are left out: the
// partitions' end offsets are "every partition has records", and no
// object is uploaded.

const simTopic = "flowlog.apply"

// simShape is one point of the sweep.
type simShape struct {
	Replicas   int
	Partitions int
	Flows      int
	Regions    int           // regions per partition
	Interval   time.Duration // one commit per replica per interval
	DDLEvery   time.Duration // a replace that adds a table to a flow; 0: none
}

// simPart is one partition a replica owns.
type simPart struct {
	lease  meta.Lease
	stored int64 // offset:<topic>:<p> as this replica last left it
}

// simReplica is one consumer: its own client, store and registry.
type simReplica struct {
	id    int
	shape simShape
	st    *meta.Store
	reg   *meta.Registry
	parts []simPart
	all   []int32 // every partition: the "partitions with records"
	seq   int     // cycles
	ddls  uint64  // the DDL generation the registry last loaded
	// covDirty: pending coverage may await reports (after an assignment,
	// and after each DDL).
	covDirty bool
	// reports waiting for the next commit, and the entries reported.
	reports   []meta.CoverageReport
	reported  map[[2]uint64]bool
	pending   *meta.Commit // a commit that failed, to try again
	committed atomic.Int64
	// finErrs counts the coverage finalisations that failed (the advance
	// goes on, as the pipeline's does), lastFinErr holds the last error.
	finErrs    atomic.Int64
	lastFinErr atomic.Value
}

// simStats collects what every replica measured.
type simStats struct {
	mu       sync.Mutex
	commit   []time.Duration // Store.Commit
	advance  []time.Duration // the checkpoint advance
	cycle    []time.Duration // refresh + coverage + commit + advance
	commits  int
	errs     []error
	advanced int // flows whose checkpoint an advance moved
}

func (s *simStats) add(commit, advance, cycle time.Duration, advanced int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs = append(s.errs, err)
		return
	}
	s.commits++
	s.commit = append(s.commit, commit)
	s.advance = append(s.advance, advance)
	s.cycle = append(s.cycle, cycle)
	s.advanced += advanced
}

func tsoAt(t time.Time) uint64 { return uint64(t.UnixMilli()) << 18 }

// newSimReplica opens a client and a store for replica id, registering its
// metrics on reg under replica=<id>.
func newSimReplica(addr string, id int, shape simShape, reg prometheus.Registerer) *simReplica {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 4})
	wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"replica": strconv.Itoa(id)}, reg)
	st := meta.NewStore(rdb, "", wrapped)
	r := &simReplica{id: id, shape: shape, st: st, reg: meta.NewRegistry(st), reported: map[[2]uint64]bool{}, covDirty: true}
	for p := range int32(shape.Partitions) {
		r.all = append(r.all, p)
	}
	return r
}

func (r *simReplica) close() { _ = r.st.Client().Close() }

// assign takes the leases of the partitions p with p % replicas == id and
// reads their start position, as a new owner does.
func (r *simReplica) assign(ctx context.Context) error {
	member := r.member()
	for p := int32(r.id); p < int32(r.shape.Partitions); p += int32(r.shape.Replicas) {
		l, err := r.st.AcquireLease(ctx, simTopic, p, member)
		if err != nil {
			return err
		}
		off, ok, err := r.st.Offset(ctx, simTopic, p)
		if err != nil {
			return err
		}
		if !ok {
			off = -1
		}
		if _, err := r.st.PartitionStart(ctx, simTopic, p); err != nil {
			return err
		}
		if _, err := r.st.PartitionRegions(ctx, simTopic, p); err != nil {
			return err
		}
		r.parts = append(r.parts, simPart{lease: l, stored: off})
	}
	return r.reg.Refresh(ctx)
}

// observe reloads the registry after a DDL, as the DDL applier of every
// replica does, and values the pending coverage entries for every owned
// partition after an assignment or a DDL: the reports ride in the next
// commit.
func (r *simReplica) observe(ctx context.Context, ddls uint64, now time.Time) error {
	if ddls != r.ddls {
		if err := r.reg.Refresh(ctx); err != nil {
			return err
		}
		r.ddls, r.covDirty = ddls, true
	}
	if !r.covDirty {
		return nil
	}
	pending, err := r.st.PendingCoverage(ctx)
	if err != nil {
		return err
	}
	for _, pf := range pending {
		for _, e := range pf.Entries {
			key := [2]uint64{uint64(pf.ID), e.Seq}
			if r.reported[key] {
				continue
			}
			r.reported[key] = true
			v := meta.CoverageValue{TS: tsoAt(now.Add(-time.Second))}
			for _, p := range r.parts {
				r.reports = append(r.reports, meta.CoverageReport{FlowID: pf.ID, Seq: e.Seq,
					Topic: simTopic, Partition: p.lease.Partition, Since: v, Until: v})
			}
		}
	}
	r.covDirty = false
	return nil
}

// commit is one cycle's commit: every owned partition moved by 100 records
// with a checkpoint a little behind now, the cycle's meta listed under
// every flow. A commit that
// failed without being fenced is tried again as it was, as the flusher
// retries a cycle.
func (r *simReplica) commit(ctx context.Context, now time.Time) error {
	if r.pending == nil {
		r.pending = r.build(now)
		r.reports = nil
	}
	if err := r.st.Commit(ctx, *r.pending); err != nil {
		return err
	}
	for i := range r.parts {
		r.parts[i].stored = r.pending.Partitions[i].NextOffset
	}
	r.pending = nil
	r.committed.Add(1)
	return nil
}

// build is the next cycle's commit.
func (r *simReplica) build(now time.Time) *meta.Commit {
	r.seq++
	ck := tsoAt(now.Add(-300 * time.Millisecond))
	c := &meta.Commit{LastFlushTS: tsoAt(now), Coverage: r.reports}
	for _, p := range r.parts {
		regions := make(map[uint64]uint64, r.shape.Regions)
		for j := range r.shape.Regions {
			regions[uint64(int(p.lease.Partition)*r.shape.Regions+j+1)] = ck + uint64(j)
		}
		c.Leases = append(c.Leases, p.lease)
		c.Partitions = append(c.Partitions, meta.PartitionCommit{Topic: simTopic, Partition: p.lease.Partition,
			NextOffset: max(p.stored, 0) + 100, Checkpoint: ck, HasCheckpoint: true, MaxTS: ck + 1<<18,
			Regions: regions, CheckFrom: true, From: p.stored})
	}
	// Layout v2, the default: one meta for the cycle, listed under every
	// flow it serves (docs/FORMAT.md, "Meta objects, version 2").
	path := fmt.Sprintf("bench/v2/meta/%020d-%s-%d-%d-%016x.meta", ck, r.member(), now.UnixMilli(), r.seq, r.seq)
	for _, f := range r.reg.Flows() {
		c.Metas = append(c.Metas, meta.MetaRef{FlowID: f.ID, MinResolvedTS: ck, Path: path})
		c.Flows = append(c.Flows, f.ID)
	}
	return c
}

// advance is the checkpoint advance the pipeline runs after each commit,
// in its order, without the Kafka offsets (every partition has records)
// and the objects: the replica holding the advance turn reads every
// partition's checkpoint, finalises coverage and advances every flow; the
// others read the global checkpoint. A failed finalisation is counted and
// nothing advances, as in the pipeline, until the next turn. It returns
// how many flows' checkpoints moved.
func (r *simReplica) advance(ctx context.Context, now time.Time) (int, error) {
	turn, err := r.st.TakeAdvanceTurn(ctx, r.member(), time.Second)
	if err != nil {
		return 0, err
	}
	if !turn {
		_, _, err := r.st.GlobalCheckpointTS(ctx)
		return 0, err
	}
	cks, idle, err := r.st.PartitionCheckpoints(ctx, simTopic, r.all)
	if err != nil {
		return 0, err
	}
	var global uint64
	found, held := false, false
	for _, p := range r.all {
		if idle[p] {
			continue
		}
		ck, ok := cks[p]
		if !ok {
			held = true
			break
		}
		if !found || ck < global {
			global, found = ck, true
		}
	}
	if _, err := r.st.FinalizeCoverage(ctx, simTopic, r.all); err != nil {
		r.finErrs.Add(1)
		r.lastFinErr.Store(err)
		return 0, nil
	}
	if held || !found || global == 0 {
		return 0, nil
	}
	flows := r.reg.Flows()
	ids := make([]meta.FlowID, len(flows))
	for i, f := range flows {
		ids[i] = f.ID
	}
	moved, _, err := r.st.AdvanceCheckpoints(ctx, ids, global, tsoAt(now.Add(time.Minute)))
	return len(moved), err
}

func (r *simReplica) member() string { return fmt.Sprintf("replica-%d", r.id) }

// run commits once per interval, from a random phase, until stop is set;
// a cycle that takes longer than the interval delays the next (the ticker
// drops what it missed), so commits fall short of the offered rate. Only
// cycles that start while rec is set are recorded, and every error. A
// fenced commit ends the replica, as it ends a session; any other failure
// is tried again on the next tick.
func (r *simReplica) run(ctx context.Context, phase time.Duration, rec, stop *atomic.Bool, ddls *atomic.Uint64, out *simStats) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(phase):
	}
	tick := time.NewTicker(r.shape.Interval)
	defer tick.Stop()
	for !stop.Load() {
		start := time.Now()
		recorded := rec.Load()
		err := r.observe(ctx, ddls.Load(), start)
		var commit, adv time.Duration
		moved := 0
		if err == nil {
			t := time.Now()
			err = r.commit(ctx, start)
			commit = time.Since(t)
		}
		if err == nil {
			t := time.Now()
			moved, err = r.advance(ctx, start)
			adv = time.Since(t)
		}
		if recorded || err != nil {
			out.add(commit, adv, time.Since(start), moved, err)
		}
		if errors.Is(err, meta.ErrLeaseLost) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// simFlows creates n flows, flow i over tables i+1 and i+2 (overlapping),
// through the DDL path.
func simFlows(ctx context.Context, st *meta.Store, n int) error {
	for i := range n {
		if err := simDDL(ctx, st, i, []uint32{uint32(i + 1), uint32(i + 2)}, int64(i+1)); err != nil {
			return err
		}
	}
	return nil
}

// simDDL applies a replace of flow i with tables at DDL offset off.
func simDDL(ctx context.Context, st *meta.Store, i int, tables []uint32, off int64) error {
	raw, _ := json.Marshal(map[string]any{"op": meta.OpReplace,
		"flow": map[string]any{"catalog_name": "bench", "flow_name": fmt.Sprintf("f%d", i), "source_table_ids": tables}})
	d, err := meta.ParseDDL(raw)
	if err != nil {
		return err
	}
	_, err = st.ApplyDDL(ctx, d, meta.DDLPosition{Topic: "flowlog.ddl", Partition: 0, NextOffset: off})
	return err
}

// ddlDriver adds a table to one flow after another every shape.DDLEvery
// once rec is set, bumping ddls so that the replicas refresh and report,
// until ctx ends.
func ddlDriver(ctx context.Context, st *meta.Store, shape simShape, rec *atomic.Bool, ddls *atomic.Uint64) error {
	if shape.DDLEvery <= 0 {
		return nil
	}
	for !rec.Load() {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
	tick := time.NewTicker(shape.DDLEvery)
	defer tick.Stop()
	off := int64(shape.Flows)
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		i := n % shape.Flows
		tables := []uint32{uint32(i + 1), uint32(i + 2), uint32(100000 + n)}
		off++
		if err := simDDL(ctx, st, i, tables, off); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		ddls.Add(1)
	}
}

// quantile returns the q-quantile of ds (sorted in place).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}
