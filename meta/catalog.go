package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Catalog revisions (docs/FORMAT.md, "Layout v2"). A flow's catalog object
// in the bucket is what its backup means without Redis: its definition,
// coverage windows, truncation point and listed snapshots. It is written
// only when that content changes, so that a cycle's cost never grows with
// idle flows:
//
//   - every transaction that changes a flow's catalog content (a DDL that
//     creates, replaces, drops or resumes it, a finalisation of its
//     coverage, a truncate, a listed snapshot) also increments
//     catalog:rev:<id> and adds the id to catalog:dirty, in the same MULTI;
//   - a writer reads the dirty ids (usually none), reads each flow's content
//     at one revision in one MULTI (CatalogState), uploads it under that
//     revision, and then, in a transaction that WATCHes catalog:rev:<id>,
//     records the revision as written and removes the id from the dirty set
//     only if the revision is still the one it uploaded (CatalogWritten).
//
// A change after the read leaves the flow dirty at a higher revision, so
// the last change is always uploaded; two writers of one revision upload
// the same content (revisions never go backwards, names are never
// overwritten), and the highest revision in the bucket is the flow's
// catalog.

// CatalogRev is the hash of a flow's catalog revision: rev (a counter),
// ddl_topic, ddl_partition and ddl_next (where the last DDL that changed
// the flow was applied) and, once the flow is dropped, info, routes and
// checkpoint_ts (its last definition and checkpoint).
func (k Keys) CatalogRev(id uint32) string { return k.base + "catalog:rev:" + u32(id) }

// CatalogDirty is the set of flow ids whose catalog content changed since
// their catalog was last uploaded.
func (k Keys) CatalogDirty() string { return k.base + "catalog:dirty" }

// CatalogWritten is the string holding the last catalog revision of a flow
// uploaded to the bucket.
func (k Keys) CatalogWritten(id uint32) string { return k.base + "catalog:written:" + u32(id) }

// CatalogInit is the string marking that every flow known before catalogs
// existed was made dirty once (InitCatalogs).
func (k Keys) CatalogInit() string { return k.base + "catalog:init" }

// markCatalog queues the catalog revision change of flow id: called in the
// MULTI of every transaction that changes the flow's catalog content.
func markCatalog(ctx context.Context, p redis.Pipeliner, k Keys, id FlowID) {
	p.HIncrBy(ctx, k.CatalogRev(id), "rev", 1)
	p.SAdd(ctx, k.CatalogDirty(), u32(id))
}

// CatalogState is a flow's catalog content as Redis holds it at revision
// Rev, read in one MULTI.
type CatalogState struct {
	ID  FlowID
	Rev uint64
	// Exists is false for a dropped flow; Info and Routes are then its last
	// definition, if its drop recorded one (HasInfo).
	Exists  bool
	HasInfo bool
	Info    FlowInfo
	Routes  map[uint32]Route
	// Windows and History are the current and earlier coverage windows
	// (Store.Windows); Pending are the pending steps with their tables,
	// and CoverageSeq is coverage:<id>:seq.
	Windows     map[uint32]Window
	History     []Window
	Pending     []PendingStep
	CoverageSeq uint64
	// TruncatedBefore is truncated_before:<id> (0: never truncated).
	TruncatedBefore uint64
	Snapshots       []SnapshotRef
	// CheckpointTS is flow:state's checkpoint_ts, or the one recorded at
	// the drop.
	CheckpointTS uint64
	// DDL is where the last DDL that changed the flow was applied; nil if
	// none was recorded.
	DDL *DDLPosition
	// AnyMeta is one listed meta of the flow ("" if none): a dropped flow
	// whose drop recorded no definition is named by its path.
	AnyMeta string
}

// PendingStep is a pending coverage step with its tables: those it adds
// and those it removes, each sorted, and its Ckpt (see CoverageEntry).
type PendingStep struct {
	Seq            uint64
	Added, Removed []uint32
	Ckpt           uint64
}

// catalogReadAttempts bounds CatalogState's reads of a flow whose pending
// steps keep being made final between its read of the steps and of their
// tables.
const catalogReadAttempts = 5

// DirtyCatalogs returns the flow ids whose catalog must be uploaded.
func (s *Store) DirtyCatalogs(ctx context.Context) ([]FlowID, error) {
	vals, err := s.rdb.SMembers(ctx, s.keys.CatalogDirty()).Result()
	if err != nil {
		return nil, fmt.Errorf("smembers %s: %w", s.keys.CatalogDirty(), err)
	}
	out := make([]FlowID, 0, len(vals))
	for _, v := range vals {
		id, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: member %q: %w", s.keys.CatalogDirty(), v, err)
		}
		out = append(out, FlowID(id))
	}
	return out, nil
}

// CatalogState reads flow id's catalog content in one MULTI, so that every
// part of it is of one revision. The tables of the pending steps are read
// after it: a step's table lists never change while the step is pending,
// and a list gone by then means the step was made final since, so the read
// starts over (at most catalogReadAttempts times).
func (s *Store) CatalogState(ctx context.Context, id FlowID) (CatalogState, error) {
	for attempt := 1; ; attempt++ {
		st, err := s.catalogState(ctx, id)
		if !errors.Is(err, errStepGone) || attempt == catalogReadAttempts {
			return st, err
		}
	}
}

// errStepGone is a pending step whose table list was deleted between the
// catalog read and the read of its tables.
var errStepGone = errors.New("pending step made final during the catalog read")

func (s *Store) catalogState(ctx context.Context, id FlowID) (CatalogState, error) {
	k := s.keys
	var (
		head       catalogHeadCmds
		pend, hist *redis.StringSliceCmd
		cov, past  *redis.MapStringStringCmd
	)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		head, pend = s.queueCatalogHead(ctx, p, id)
		cov = p.HGetAll(ctx, k.Coverage(id))
		hist = p.LRange(ctx, k.CoverageHistory(id), 0, -1)
		past = p.HGetAll(ctx, k.CoveragePast(id))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return CatalogState{}, fmt.Errorf("read catalog of flow %d: %w", id, err)
	}
	st, err := s.decodeCatalogHead(id, head)
	if err != nil {
		return st, err
	}
	if st.Windows, st.History, err = s.parseCoverage(id, cov.Val(), hist.Val(), past.Val()); err != nil {
		return st, err
	}
	if st.Pending, err = s.pendingSteps(ctx, id, pend.Val()); err != nil {
		return st, err
	}
	return st, nil
}

// catalogHeadCmds are the replies of a catalog read's small parts.
type catalogHeadCmds struct {
	info, seq, tb *redis.StringCmd
	ckpt          checkpointCmds
	routes, rev   *redis.MapStringStringCmd
	snaps, any    *redis.StringSliceCmd
}

// queueCatalogHead queues on p the reads of a flow's catalog revision and
// the small parts of its content, and of its raw pending list: what both
// catalog reads take in their one MULTI.
func (s *Store) queueCatalogHead(ctx context.Context, p redis.Pipeliner, id FlowID) (catalogHeadCmds, *redis.StringSliceCmd) {
	k := s.keys
	return catalogHeadCmds{
		info:   p.Get(ctx, k.FlowInfo(id)),
		routes: p.HGetAll(ctx, k.FlowRoutes(id)),
		seq:    p.Get(ctx, k.CoverageSeq(id)),
		tb:     p.Get(ctx, k.TruncatedBefore(id)),
		snaps:  p.ZRange(ctx, k.Snapshots(id), 0, -1),
		ckpt:   k.queueCheckpoint(ctx, p, id),
		rev:    p.HGetAll(ctx, k.CatalogRev(id)),
		any:    p.ZRange(ctx, k.Metas(id), 0, 0),
	}, p.LRange(ctx, k.CoveragePending(id), 0, -1)
}

// decodeCatalogHead decodes the small parts of a flow's catalog content:
// all but the windows, the history and the pending steps.
func (s *Store) decodeCatalogHead(id FlowID, c catalogHeadCmds) (CatalogState, error) {
	k := s.keys
	info, seq, tb, ckpt, routes, rev, snaps, any := c.info, c.seq, c.tb, c.ckpt, c.routes, c.rev, c.snaps, c.any
	var err error
	st := CatalogState{ID: id}
	r := rev.Val()
	if st.Rev, err = parseU64Field(k.CatalogRev(id), r, "rev"); err != nil {
		return st, err
	}
	if raw, err := info.Result(); err == nil {
		st.Exists, st.HasInfo = true, true
		if st.Info, err = decodeInfo(k.FlowInfo(id), raw); err != nil {
			return st, err
		}
		if st.Routes, err = parseRoutes(k.FlowRoutes(id), routes.Val()); err != nil {
			return st, err
		}
	} else if raw, ok := r["info"]; ok {
		st.HasInfo = true
		if st.Info, err = decodeInfo(k.CatalogRev(id), raw); err != nil {
			return st, err
		}
		var rm map[uint32]Route
		if v, ok := r["routes"]; ok {
			if err := json.Unmarshal([]byte(v), &rm); err != nil {
				return st, fmt.Errorf("decode %s routes: %w", k.CatalogRev(id), err)
			}
		}
		st.Routes = rm
	}
	if st.CoverageSeq, err = parseU64(k.CoverageSeq(id), seq); err != nil {
		return st, err
	}
	if st.TruncatedBefore, err = parseU64(k.TruncatedBefore(id), tb); err != nil {
		return st, err
	}
	for _, m := range snaps.Val() {
		ts, _, err := SnapshotPathTS(m)
		if err != nil {
			return st, fmt.Errorf("%s: %w", k.Snapshots(id), err)
		}
		st.Snapshots = append(st.Snapshots, SnapshotRef{FlowID: id, TS: ts, Path: m})
	}
	if st.CheckpointTS, err = ckpt.effective(k, id, st.Exists); err != nil {
		return st, err
	}
	if !st.Exists && st.CheckpointTS == 0 {
		if st.CheckpointTS, err = parseU64Field(k.CatalogRev(id), r, "checkpoint_ts"); err != nil {
			return st, err
		}
	}
	if topic, ok := r["ddl_topic"]; ok {
		p, err1 := strconv.ParseInt(r["ddl_partition"], 10, 32)
		next, err2 := strconv.ParseInt(r["ddl_next"], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return st, fmt.Errorf("%s: ddl position: %w", k.CatalogRev(id), err)
		}
		st.DDL = &DDLPosition{Topic: topic, Partition: int32(p), NextOffset: next}
	}
	if v := any.Val(); len(v) > 0 {
		st.AnyMeta = v[0]
	}
	return st, nil
}

// CatalogWritten records that flow id's catalog was uploaded at revision
// rev: if catalog:rev:<id> still holds rev, catalog:written:<id> becomes
// rev and the id leaves catalog:dirty, in one MULTI under a WATCH of the
// revision. It reports false, changing nothing, when the revision moved on
// (the flow stays dirty, and the next writer uploads the newer content).
func (s *Store) CatalogWritten(ctx context.Context, id FlowID, rev uint64) (bool, error) {
	k := s.keys
	done := false
	err := s.txn(ctx, "catalog_written", []string{k.CatalogRev(id)}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		cur, err := tx.HGet(ctx, k.CatalogRev(id), "rev").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("hget %s: %w", k.CatalogRev(id), err)
		}
		if done = cur == u64(rev); !done {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			p.Set(ctx, k.CatalogWritten(id), u64(rev), 0)
			p.SRem(ctx, k.CatalogDirty(), u32(id))
			return nil
		}, nil
	})
	if err != nil {
		return false, fmt.Errorf("record catalog %d of flow %d written: %w", rev, id, err)
	}
	return done, nil
}

// SkipCatalogRev moves flow id's catalog past revision rev if it is still
// there, leaving the flow dirty: the bucket holds another object under
// that revision's name, and the next upload takes the next one.
func (s *Store) SkipCatalogRev(ctx context.Context, id FlowID, rev uint64) error {
	k := s.keys
	err := s.txn(ctx, "skip_catalog_rev", []string{k.CatalogRev(id)}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		cur, err := tx.HGet(ctx, k.CatalogRev(id), "rev").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("hget %s: %w", k.CatalogRev(id), err)
		}
		if cur != u64(rev) {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			markCatalog(ctx, p, k, id)
			return nil
		}, nil
	})
	if err != nil {
		return fmt.Errorf("skip catalog %d of flow %d: %w", rev, id, err)
	}
	return nil
}

// InitCatalogs makes dirty, once per prefix, every flow id the prefix has
// or had (KnownFlowIDs) that has no catalog revision yet: flows created
// before catalogs existed, whose backups then get a catalog too. It SCANs,
// so it runs once (catalog:init marks it done), before a consumer's first
// catalog upload.
func (s *Store) InitCatalogs(ctx context.Context) error {
	k := s.keys
	n, err := s.rdb.Exists(ctx, k.CatalogInit()).Result()
	if err != nil || n > 0 {
		if err != nil {
			err = fmt.Errorf("init catalogs: %w", err)
		}
		return err
	}
	ids, err := s.KnownFlowIDs(ctx)
	if err != nil {
		return fmt.Errorf("init catalogs: %w", err)
	}
	revs := make([]*redis.BoolCmd, len(ids))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			revs[i] = p.HExists(ctx, k.CatalogRev(id), "rev")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("init catalogs: %w", err)
	}
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			if !revs[i].Val() {
				markCatalog(ctx, p, k, id)
			}
		}
		p.Set(ctx, k.CatalogInit(), "1", 0)
		return nil
	})
	if err != nil {
		return fmt.Errorf("init catalogs: %w", err)
	}
	return nil
}

// parseU64 reads an unsigned string value, 0 when absent.
func parseU64(key string, c *redis.StringCmd) (uint64, error) {
	v, err := c.Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", key, err)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s = %q: %w", key, v, err)
	}
	return n, nil
}

// parseU64Field reads an unsigned hash field, 0 when absent.
func parseU64Field(key string, h map[string]string, field string) (uint64, error) {
	v, ok := h[field]
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s %s = %q: %w", key, field, v, err)
	}
	return n, nil
}

// parseRoutes decodes a flow:routes hash read whole.
func parseRoutes(key string, raw map[string]string) (map[uint32]Route, error) {
	return parseIDHash[Route](key, raw)
}

// pendingSteps decodes the pending list raws and reads each step's tables
// (errStepGone if a step's list is gone).
func (s *Store) pendingSteps(ctx context.Context, id FlowID, raws []string) ([]PendingStep, error) {
	out := make([]PendingStep, 0, len(raws))
	for _, raw := range raws {
		e, err := decodeEntry(raw)
		if err != nil {
			return nil, fmt.Errorf("decode %s: %w", s.keys.CoveragePending(id), err)
		}
		step := PendingStep{Seq: e.Seq, Ckpt: e.Ckpt}
		for _, kind := range []string{stepAdd, stepDel} {
			st := s.stepStream(id, e, kind)
			var tables []uint32
			for {
				t, ok, err := st.next(ctx)
				if err != nil {
					if n, xerr := s.rdb.Exists(ctx, st.key).Result(); xerr == nil && n == 0 {
						return nil, errStepGone
					}
					return nil, err
				}
				if !ok {
					break
				}
				tables = append(tables, t)
			}
			if kind == stepAdd {
				step.Added = tables
			} else {
				step.Removed = tables
			}
		}
		out = append(out, step)
	}
	return out, nil
}

// parseIDHash decodes a hash of uint32 ids (partitions, tables) to JSON
// values read whole.
func parseIDHash[T any](key string, raw map[string]string) (map[uint32]T, error) {
	out := make(map[uint32]T, len(raw))
	for f, v := range raw {
		id, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("parse %s field %q: %w", key, f, err)
		}
		var x T
		if err := json.Unmarshal([]byte(v), &x); err != nil {
			return nil, fmt.Errorf("decode %s field %q: %w", key, f, err)
		}
		out[uint32(id)] = x
	}
	return out, nil
}
