package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Recovered is the Redis state `consumer recover` rebuilds from the bucket
// (docs/FORMAT.md, "Keys consumer recover writes"): what a running
// consumer had committed, as far as the bucket says.
type Recovered struct {
	Group   string // written to owner, last
	Flows   []RecoveredFlow
	FlowSeq FlowID
	Metas   []MetaRef
	// Partitions are the apply partitions' offset, ckpt, maxts and
	// regions, as a commit writes them.
	Partitions []PartitionCommit
	// Coverage are reports for the flows' pending entries
	// (coverage:<flow_id>:parts).
	Coverage []CoverageReport
	// DDL are the ddl:offset of the DDL partitions (NextOffset).
	DDL []DDLPosition
	// GlobalCheckpoint is the group's layout v2 checkpoint object, written
	// to global_checkpoint when not 0: the first advance after the
	// recovery then moves on from it, instead of from the lower value the
	// recovered partition checkpoints may give, which would rewrite the
	// object backwards.
	GlobalCheckpoint uint64
}

// RecoveredFlow is one flow id's state: a live flow's definition and
// indexes, and, live or dropped, its coverage, snapshots, truncation point
// and checkpoint.
type RecoveredFlow struct {
	ID      FlowID
	Dropped bool
	Info    FlowInfo
	Routes  map[uint32]Route
	// Windows are coverage:<id> (by table), History the earlier windows
	// (coverage:<id>:past), oldest first within a table, Pending its
	// pending steps and CoverageSeq their counter.
	Windows         map[uint32]Window
	History         []Window
	Pending         []PendingStep
	CoverageSeq     uint64
	TruncatedBefore uint64
	Snapshots       []SnapshotRef
	CheckpointTS    uint64
	// CatalogRev is the revision of the flow's catalog in the bucket and
	// DDL where its last DDL was applied: catalog:rev:<id> and
	// catalog:written:<id>, so that the catalog is not uploaded again.
	CatalogRev uint64
	DDL        *DDLPosition
}

// ErrNotEmpty is returned by WriteRecovered when Redis holds keys under
// the prefix.
var ErrNotEmpty = errors.New("redis holds keys under the prefix")

// PrefixKeys counts the keys under the store's prefix (SCAN, on every
// master of a cluster), up to limit.
func (s *Store) PrefixKeys(ctx context.Context, limit int) (int, []string, error) {
	var names []string
	err := scanAll(ctx, s.rdb, s.keys.Base()+"*", func(key string) bool {
		names = append(names, key)
		return len(names) < limit
	})
	return len(names), names, err
}

// DeletePrefix deletes every key under the store's prefix.
func (s *Store) DeletePrefix(ctx context.Context) (int, error) {
	n := 0
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := s.rdb.Del(ctx, batch...).Err(); err != nil {
			return fmt.Errorf("del: %w", err)
		}
		n += len(batch)
		batch = batch[:0]
		return nil
	}
	var ferr error
	err := scanAll(ctx, s.rdb, s.keys.Base()+"*", func(key string) bool {
		batch = append(batch, key)
		if len(batch) == 500 {
			ferr = flush()
		}
		return ferr == nil
	})
	if err == nil {
		err = ferr
	}
	if err == nil {
		err = flush()
	}
	return n, err
}

// scanAll calls fn with every key matching pattern until it returns false.
func scanAll(ctx context.Context, rdb redis.UniversalClient, pattern string, fn func(string) bool) error {
	scan := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			if !fn(it.Val()) {
				return nil
			}
		}
		return it.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, scan)
	}
	if c, ok := rdb.(*redis.Client); ok {
		return scan(ctx, c)
	}
	return fmt.Errorf("scan %s: unsupported client %T", pattern, rdb)
}

// WriteRecovered writes r under the store's prefix in one MULTI, the owner
// key last in it, WATCHing the owner key: it fails with ErrNotEmpty if the
// owner key exists (another recovery or a consumer claimed the prefix).
// The caller has checked that the prefix is empty (PrefixKeys) or emptied
// it.
func (s *Store) WriteRecovered(ctx context.Context, r Recovered) error {
	k := s.keys
	if r.Group == "" {
		return errors.New("write recovered state: empty group")
	}
	type flowWrite struct {
		info   string
		idx    indexSet
		routes []any
	}
	fw := make([]flowWrite, len(r.Flows))
	for i, f := range r.Flows {
		if f.Dropped {
			if f.Info.FlowName != "" {
				info, err := encodeInfo(f.Info)
				if err != nil {
					return fmt.Errorf("flow %d: %w", f.ID, err)
				}
				fw[i].info = info
			}
			continue
		}
		info, err := encodeInfo(f.Info)
		if err != nil {
			return fmt.Errorf("flow %d: %w", f.ID, err)
		}
		idx := newIndexSet()
		idx.add(f.ID, f.Info, f.Routes)
		fw[i] = flowWrite{info: info, idx: idx}
		if len(f.Routes) > 0 {
			fw[i].routes = routeArgs(f.Routes)
		}
	}
	err := s.txn(ctx, "recover", []string{k.Owner()}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		if n, err := tx.Exists(ctx, k.Owner()).Result(); err != nil {
			return nil, fmt.Errorf("exists %s: %w", k.Owner(), err)
		} else if n > 0 {
			return nil, fmt.Errorf("%w: %s exists", ErrNotEmpty, k.Owner())
		}
		return func(p redis.Pipeliner) error {
			for i, f := range r.Flows {
				s.queueRecoveredFlow(ctx, p, f, fw[i].info, fw[i].idx, fw[i].routes)
			}
			p.Set(ctx, k.FlowSeq(), u32(r.FlowSeq), 0)
			for _, m := range r.Metas {
				p.ZAdd(ctx, k.Metas(m.FlowID), redis.Z{Score: float64(m.MinResolvedTS), Member: m.Path})
			}
			for _, pc := range r.Partitions {
				queuePartition(ctx, p, k, pc)
			}
			for _, c := range r.Coverage {
				queueReport(ctx, p, k, c)
			}
			for _, d := range r.DDL {
				p.Set(ctx, k.DDLOffset(d.Topic, d.Partition), strconv.FormatInt(d.NextOffset, 10), 0)
			}
			if r.GlobalCheckpoint != 0 {
				p.Set(ctx, k.GlobalCheckpoint(), u64(r.GlobalCheckpoint), 0)
			}
			// Every flow's catalog is in the bucket at the revision
			// recovered: nothing to mark dirty on the first start.
			p.Set(ctx, k.CatalogInit(), "1", 0)
			p.Set(ctx, k.Owner(), r.Group, 0)
			return nil
		}, nil
	})
	if err != nil {
		return fmt.Errorf("write recovered state: %w", err)
	}
	return nil
}

// queueRecoveredFlow queues the keys of one flow id.
func (s *Store) queueRecoveredFlow(ctx context.Context, p redis.Pipeliner, f RecoveredFlow, info string, idx indexSet, routes []any) {
	k := s.keys
	id := f.ID
	if !f.Dropped {
		p.Set(ctx, k.FlowName(f.Info.CatalogName, f.Info.FlowName), u32(id), 0)
		p.Set(ctx, k.FlowInfo(id), info, 0)
		if len(routes) > 0 {
			p.HSet(ctx, k.FlowRoutes(id), routes...)
		}
		idx.write(ctx, p, k)
		p.SAdd(ctx, k.Flows(), u32(id))
		p.HSet(ctx, k.FlowState(id), "status", StatusActive, "checkpoint_ts", u64(f.CheckpointTS))
	}
	rev := []any{"rev", u64(f.CatalogRev)}
	if d := f.DDL; d != nil {
		rev = append(rev, "ddl_topic", d.Topic, "ddl_partition", i32(d.Partition), "ddl_next", strconv.FormatInt(d.NextOffset, 10))
	}
	if f.Dropped {
		if info != "" {
			rb, _ := json.Marshal(f.Routes)
			rev = append(rev, "info", info, "routes", string(rb))
		}
		rev = append(rev, "checkpoint_ts", u64(f.CheckpointTS))
	}
	p.HSet(ctx, k.CatalogRev(id), rev...)
	p.Set(ctx, k.CatalogWritten(id), u64(f.CatalogRev), 0)
	if len(f.Windows) > 0 {
		vals := make([]any, 0, 2*len(f.Windows))
		for t, w := range f.Windows {
			vals = append(vals, u32(t), encodeWindow(w))
		}
		p.HSet(ctx, k.Coverage(id), vals...)
	}
	if len(f.History) > 0 {
		byTable := map[uint32][]Window{}
		var order []uint32
		for _, w := range f.History {
			if _, ok := byTable[w.TableID]; !ok {
				order = append(order, w.TableID)
			}
			byTable[w.TableID] = append(byTable[w.TableID], w)
		}
		vals := make([]any, 0, 2*len(order))
		for _, t := range order {
			vals = append(vals, u32(t), encodeHistory(byTable[t]))
		}
		p.HSet(ctx, k.CoveragePast(id), vals...)
	}
	for _, st := range f.Pending {
		added, removed := slices.Sorted(slices.Values(st.Added)), slices.Sorted(slices.Values(st.Removed))
		if len(added) > 0 {
			p.Set(ctx, k.CoverageStep(id, st.Seq, stepAdd), packTables(added), 0)
		}
		if len(removed) > 0 {
			p.Set(ctx, k.CoverageStep(id, st.Seq, stepDel), packTables(removed), 0)
		}
		entry, _ := json.Marshal(CoverageEntry{Seq: st.Seq, Added: len(added), Removed: len(removed), Ckpt: st.Ckpt})
		p.RPush(ctx, k.CoveragePending(id), string(entry))
		p.SAdd(ctx, k.CoverageFlows(), u32(id))
	}
	if f.CoverageSeq > 0 {
		p.Set(ctx, k.CoverageSeq(id), u64(f.CoverageSeq), 0)
	}
	if f.TruncatedBefore > 0 {
		p.Set(ctx, k.TruncatedBefore(id), u64(f.TruncatedBefore), 0)
	}
	for _, sn := range f.Snapshots {
		p.ZAdd(ctx, k.Snapshots(id), redis.Z{Score: float64(sn.TS), Member: sn.Path})
	}
}
