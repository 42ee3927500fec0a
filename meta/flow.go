package meta

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// CreateFlow creates flow id with info and routes (docs/FORMAT.md, "Flow
// metadata transactions"): if the
// name is free and flow:info:<id> is absent it writes the name, info,
// routes, flownode and table indexes, flow:state (status active) and adds id
// to the flows set. If the name maps to another id it returns
// ErrFlowAlreadyExists. If it maps to id and the stored info equals info
// (canonical JSON) it succeeds without writing; with different info, or
// when the name is free but the id is taken, it returns an
// *UnexpectedValueError.
func (s *Store) CreateFlow(ctx context.Context, id FlowID, info FlowInfo, routes map[uint32]Route) error {
	keys := []string{s.keys.FlowName(info.CatalogName, info.FlowName), s.keys.FlowInfo(id)}
	err := s.txn(ctx, "create_flow", keys, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		return s.createTx(ctx, tx, id, info, routes)
	})
	if err != nil {
		return fmt.Errorf("create flow %d (%s/%s): %w", id, info.CatalogName, info.FlowName, err)
	}
	return nil
}

// UpdateFlow replaces flow id's info current with next and its routes
// (docs/FORMAT.md, "Flow metadata transactions"). The name of next must be
// free or map to id, else ErrDifferentFlowID; the stored info must equal
// current, else an *UnexpectedValueError. The old routes, flownode and table
// entries are removed and the new ones written in the same transaction. If
// the name changes, the old name is released.
func (s *Store) UpdateFlow(ctx context.Context, id FlowID, current, next FlowInfo, routes map[uint32]Route) error {
	keys := []string{s.keys.FlowName(next.CatalogName, next.FlowName), s.keys.FlowInfo(id)}
	err := s.txn(ctx, "update_flow", keys, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		return s.updateTx(ctx, tx, id, current, next, routes)
	})
	if err != nil {
		return fmt.Errorf("update flow %d (%s/%s): %w", id, next.CatalogName, next.FlowName, err)
	}
	return nil
}

// DestroyFlow deletes every key and index entry of flow id (docs/FORMAT.md,
// "Flow metadata transactions"): name (if it still maps to id), info, routes,
// state, its flownode and table entries (those of info and of the stored
// info) and its member of the flows set. metas:<id> stays so a dropped flow's
// backup remains restorable. Destroying a flow that is already gone succeeds.
func (s *Store) DestroyFlow(ctx context.Context, id FlowID, info FlowInfo) error {
	keys := []string{s.keys.FlowName(info.CatalogName, info.FlowName), s.keys.FlowInfo(id)}
	err := s.txn(ctx, "destroy_flow", keys, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		return s.destroyTx(ctx, tx, id, info)
	})
	if err != nil {
		return fmt.Errorf("destroy flow %d (%s/%s): %w", id, info.CatalogName, info.FlowName, err)
	}
	return nil
}

// createTx is the read/compare half of CreateFlow inside tx. It returns nil
// writes when the flow already exists exactly as asked.
func (s *Store) createTx(ctx context.Context, tx *redis.Tx, id FlowID, info FlowInfo, routes map[uint32]Route) (func(redis.Pipeliner) error, error) {
	k := s.keys
	nameKey, infoKey := k.FlowName(info.CatalogName, info.FlowName), k.FlowInfo(id)
	if err := tx.Watch(ctx, nameKey, infoKey, k.Metas(id), k.Coverage(id)).Err(); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	want, err := encodeInfo(info)
	if err != nil {
		return nil, err
	}
	nameID, named, err := getFlowID(ctx, tx, nameKey)
	if err != nil {
		return nil, err
	}
	if named && nameID != id {
		return nil, fmt.Errorf("name maps to flow %d: %w", nameID, ErrFlowAlreadyExists)
	}
	stored, has, err := getString(ctx, tx, infoKey)
	if err != nil {
		return nil, err
	}
	switch {
	case named && !has:
		return nil, &UnexpectedValueError{Key: infoKey, Expected: want}
	case named:
		got, err := canonical(infoKey, stored)
		if err != nil {
			return nil, err
		}
		if got != want {
			return nil, &UnexpectedValueError{Key: infoKey, Expected: want, Actual: stored}
		}
		return nil, nil // created before with the same info: idempotent
	case has:
		return nil, &UnexpectedValueError{Key: infoKey, Actual: stored}
	}
	// A new flow under an id that a dropped flow had: its restore would
	// read the old flow's chunks.
	used, err := tx.Exists(ctx, k.Metas(id), k.Coverage(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("exists %s: %w", k.Metas(id), err)
	}
	if used > 0 {
		return nil, fmt.Errorf("flow %d has a backup catalog: %w", id, ErrFlowIDInUse)
	}
	added, _ := tableDiff(nil, info.SourceTableIDs)
	cov, err := s.coverageTx(ctx, tx, id, added, nil)
	if err != nil {
		return nil, err
	}
	idx := newIndexSet()
	idx.add(id, info, routes)
	return func(p redis.Pipeliner) error {
		cov(p)
		p.Set(ctx, nameKey, u32(id), 0)
		p.Set(ctx, infoKey, want, 0)
		p.Del(ctx, k.FlowRoutes(id), k.FlowState(id))
		if len(routes) > 0 {
			p.HSet(ctx, k.FlowRoutes(id), routeArgs(routes)...)
		}
		idx.write(ctx, p, k)
		p.SAdd(ctx, k.Flows(), u32(id))
		p.HSet(ctx, k.FlowState(id), "status", StatusActive)
		markCatalog(ctx, p, k, id)
		return nil
	}, nil
}

// updateTx is the read/compare half of UpdateFlow inside tx.
func (s *Store) updateTx(ctx context.Context, tx *redis.Tx, id FlowID, current, next FlowInfo, routes map[uint32]Route) (func(redis.Pipeliner) error, error) {
	k := s.keys
	nameKey, oldNameKey := k.FlowName(next.CatalogName, next.FlowName), k.FlowName(current.CatalogName, current.FlowName)
	infoKey, routesKey := k.FlowInfo(id), k.FlowRoutes(id)
	if err := tx.Watch(ctx, nameKey, oldNameKey, infoKey, routesKey).Err(); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	nameID, named, err := getFlowID(ctx, tx, nameKey)
	if err != nil {
		return nil, err
	}
	if named && nameID != id {
		return nil, fmt.Errorf("name maps to flow %d, not %d: %w", nameID, id, ErrDifferentFlowID)
	}
	expect, err := encodeInfo(current)
	if err != nil {
		return nil, err
	}
	want, err := encodeInfo(next)
	if err != nil {
		return nil, err
	}
	stored, has, err := getString(ctx, tx, infoKey)
	if err != nil {
		return nil, err
	}
	if !has {
		return nil, &UnexpectedValueError{Key: infoKey, Expected: expect}
	}
	got, err := canonical(infoKey, stored)
	if err != nil {
		return nil, err
	}
	if got != expect {
		return nil, &UnexpectedValueError{Key: infoKey, Expected: expect, Actual: stored}
	}
	releaseOld := false
	if oldNameKey != nameKey {
		oldID, ok, err := getFlowID(ctx, tx, oldNameKey)
		if err != nil {
			return nil, err
		}
		releaseOld = ok && oldID == id
	}
	oldRoutes, err := readRoutes(ctx, tx, routesKey)
	if err != nil {
		return nil, err
	}
	added, removed := tableDiff(current.SourceTableIDs, next.SourceTableIDs)
	cov, err := s.coverageTx(ctx, tx, id, added, removed)
	if err != nil {
		return nil, err
	}
	old, idx := newIndexSet(), newIndexSet()
	old.add(id, current, oldRoutes)
	idx.add(id, next, routes)
	return func(p redis.Pipeliner) error {
		cov(p)
		if releaseOld {
			p.Del(ctx, oldNameKey)
		}
		p.Set(ctx, nameKey, u32(id), 0)
		p.Set(ctx, infoKey, want, 0)
		old.removeFlownodes(ctx, p, k)
		if old.sameFields(idx) {
			// The routes stay: only the tables that changed are touched,
			// so a replace costs what it changes, not the flow's size.
			old.removeTables(ctx, p, k, removed)
		} else {
			old.removeTables(ctx, p, k, old.tables)
		}
		p.Del(ctx, routesKey)
		if len(routes) > 0 {
			p.HSet(ctx, routesKey, routeArgs(routes)...)
		}
		idx.writeFlownodes(ctx, p, k)
		if old.sameFields(idx) {
			idx.writeTables(ctx, p, k, added)
		} else {
			idx.writeTables(ctx, p, k, idx.tables)
		}
		p.SAdd(ctx, k.Flows(), u32(id))
		p.HSetNX(ctx, k.FlowState(id), "status", StatusActive)
		markCatalog(ctx, p, k, id)
		return nil
	}, nil
}

// destroyTx is the read half of DestroyFlow inside tx; it always writes.
func (s *Store) destroyTx(ctx context.Context, tx *redis.Tx, id FlowID, info FlowInfo) (func(redis.Pipeliner) error, error) {
	k := s.keys
	infoKey, routesKey := k.FlowInfo(id), k.FlowRoutes(id)
	if err := tx.Watch(ctx, infoKey, routesKey).Err(); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	infos := []FlowInfo{info}
	stored, has, err := getString(ctx, tx, infoKey)
	if err != nil {
		return nil, err
	}
	cov := func(redis.Pipeliner) {}
	if has {
		si, err := decodeInfo(infoKey, stored)
		if err != nil {
			return nil, err
		}
		infos = append(infos, si)
		_, removed := tableDiff(si.SourceTableIDs, nil)
		if cov, err = s.coverageTx(ctx, tx, id, nil, removed); err != nil {
			return nil, err
		}
	}
	routes, err := readRoutes(ctx, tx, routesKey)
	if err != nil {
		return nil, err
	}
	var last []any
	if has {
		if last, err = s.lastDefinition(ctx, tx, id, stored, routes); err != nil {
			return nil, err
		}
	}
	var names []string // name keys that still map to id
	idx := newIndexSet()
	for _, fi := range infos {
		idx.add(id, fi, routes)
		nameKey := k.FlowName(fi.CatalogName, fi.FlowName)
		if err := tx.Watch(ctx, nameKey).Err(); err != nil {
			return nil, fmt.Errorf("watch: %w", err)
		}
		nameID, ok, err := getFlowID(ctx, tx, nameKey)
		if err != nil {
			return nil, err
		}
		if ok && nameID == id {
			names = append(names, nameKey)
		}
	}
	return func(p redis.Pipeliner) error {
		cov(p)
		if len(names) > 0 {
			p.Del(ctx, names...)
		}
		p.Del(ctx, infoKey, routesKey, k.FlowState(id))
		p.HDel(ctx, k.LastFlush(), lastFlushField(id))
		idx.remove(ctx, p, k)
		p.SRem(ctx, k.Flows(), u32(id))
		if has { // a flow destroyed before changes nothing of its catalog
			p.HSet(ctx, k.CatalogRev(id), last...)
			markCatalog(ctx, p, k, id)
		}
		return nil
	}, nil
}

// lastDefinition is what a drop keeps of flow id in catalog:rev:<id>, as
// HSET arguments: its stored info, routes and effective checkpoint (the one
// value it keeps from now on, checkpoint.go), so that its catalog still
// names and describes it.
func (s *Store) lastDefinition(ctx context.Context, tx *redis.Tx, id FlowID, stored string, routes map[uint32]Route) ([]any, error) {
	rb, err := json.Marshal(routes)
	if err != nil {
		return nil, fmt.Errorf("encode routes of flow %d: %w", id, err)
	}
	last := []any{"info", stored, "routes", string(rb)}
	ck, err := s.readCheckpoint(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if ck > 0 {
		last = append(last, "checkpoint_ts", u64(ck))
	}
	return last, nil
}
