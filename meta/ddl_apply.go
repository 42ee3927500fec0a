package meta

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxIDProbe bounds how many taken ids a create without flow_id skips past
// flow:seq (ids given explicitly by earlier DDL may sit above it).
const maxIDProbe = 1024

// DDLPosition is where a DDL record sits in the DDL topic.
type DDLPosition struct {
	Topic      string
	Partition  int32
	NextOffset int64 // the record's offset + 1
}

// Applied is the outcome of ApplyDDL.
type Applied struct {
	Op      string
	FlowID  FlowID // the flow the DDL resolved to (0 when skipped or absent)
	Catalog string
	Name    string
	Changed bool // flow metadata changed
	Skipped bool // ddl:offset was already >= NextOffset: applied before, nothing written
}

// ApplyDDL applies d, the DDL record at pos, exactly once: in one
// transaction that WATCHes ddl:offset:<topic>:<partition> and the flow's
// keys, it does nothing if the stored offset is already >= pos.NextOffset
// (Skipped), and otherwise applies d and sets the offset to pos.NextOffset
// in the same MULTI, whether or not the metadata changed.
//
//   - create: an existing name succeeds unchanged with IfNotExists, else
//     ErrFlowAlreadyExists; a new flow takes *d.FlowID or the next id of
//     flow:seq.
//   - replace: creates a missing flow, else updates it keeping its id and
//     created_time (ErrDifferentFlowID if d.FlowID names another id).
//   - drop: destroys the flow; a missing flow succeeds unchanged.
//   - resume: a fatal flow becomes active with its error cleared; another
//     flow is unchanged; a missing flow is ErrFlowNotFound.
//
// A store that claimed the prefix applies nothing once the owner key no
// longer names its group (*OwnerLostError): a flushed Redis would hand out
// flow ids the bucket already holds.
//
// created_time and updated_time are set here. An invalid d returns a
// *ValidationError, and semantic failures their errors, without writing
// anything: the caller claims the record for the DLQ with ClaimDDLReject,
// which advances the offset.
func (s *Store) ApplyDDL(ctx context.Context, d DDL, pos DDLPosition) (Applied, error) {
	if err := d.normalize(); err != nil {
		return Applied{Op: d.Op}, err
	}
	k := s.keys
	offKey := k.DDLOffset(pos.Topic, pos.Partition)
	nameKey := k.FlowName(d.Flow.CatalogName, d.Flow.FlowName)
	now := time.Now().UTC()
	var res Applied
	err := s.txn(ctx, "apply_ddl", []string{offKey, nameKey}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		res = Applied{Op: d.Op, Catalog: d.Flow.CatalogName, Name: d.Flow.FlowName}
		off, ok, err := getOffset(ctx, tx, offKey)
		if err != nil {
			return nil, err
		}
		if ok && off >= pos.NextOffset {
			res.Skipped = true
			return nil, nil
		}
		writes, err := s.ddlTx(ctx, tx, &d, now, &res)
		if err != nil {
			return nil, err
		}
		res.Changed = writes != nil
		return func(p redis.Pipeliner) error {
			if writes != nil {
				if err := writes(p); err != nil {
					return err
				}
				// The flow's catalog records where the DDL that changed it
				// was applied (create, replace and drop make it dirty
				// themselves; a resume here).
				p.HSet(ctx, k.CatalogRev(res.FlowID), "ddl_topic", pos.Topic, "ddl_partition", i32(pos.Partition),
					"ddl_next", strconv.FormatInt(pos.NextOffset, 10))
				if d.Op == OpResume {
					markCatalog(ctx, p, k, res.FlowID)
				}
			}
			p.Set(ctx, offKey, strconv.FormatInt(pos.NextOffset, 10), 0)
			return nil
		}, nil
	})
	if err != nil {
		return res, fmt.Errorf("apply %s of flow %s/%s: %w", d.Op, d.Flow.CatalogName, d.Flow.FlowName, err)
	}
	return res, nil
}

// ddlTx is the read/compare half of one DDL inside tx; nil writes mean no
// metadata change.
func (s *Store) ddlTx(ctx context.Context, tx *redis.Tx, d *DDL, now time.Time, res *Applied) (func(redis.Pipeliner) error, error) {
	k := s.keys
	id, named, err := getFlowID(ctx, tx, k.FlowName(d.Flow.CatalogName, d.Flow.FlowName))
	if err != nil {
		return nil, err
	}
	res.FlowID = id
	switch d.Op {
	case OpCreate:
		if named && d.IfNotExists {
			return nil, nil
		}
		if named {
			return nil, fmt.Errorf("name maps to flow %d: %w", id, ErrFlowAlreadyExists)
		}
		return s.createDDLTx(ctx, tx, d, now, res)
	case OpReplace:
		if !named {
			return s.createDDLTx(ctx, tx, d, now, res)
		}
		if d.FlowID != nil && *d.FlowID != id {
			return nil, fmt.Errorf("flow_id %d but name maps to flow %d: %w", *d.FlowID, id, ErrDifferentFlowID)
		}
		current, ok, err := s.watchInfo(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, &UnexpectedValueError{Key: k.FlowInfo(id), Expected: "stored info of flow " + u32(id)}
		}
		next, routes := d.routes()
		next.CreatedTime, next.UpdatedTime = current.CreatedTime, now
		return s.updateTx(ctx, tx, id, current, next, routes)
	case OpDrop:
		if !named {
			return nil, nil
		}
		info, ok, err := s.watchInfo(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		if !ok {
			info = FlowInfo{CatalogName: d.Flow.CatalogName, FlowName: d.Flow.FlowName}
		}
		return s.destroyTx(ctx, tx, id, info)
	case OpResume:
		if !named {
			return nil, ErrFlowNotFound
		}
		key := k.FlowState(id)
		if err := tx.Watch(ctx, key).Err(); err != nil {
			return nil, fmt.Errorf("watch: %w", err)
		}
		status, err := tx.HGet(ctx, key, "status").Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("hget %s: %w", key, err)
		}
		if status != StatusFatal {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			p.HSet(ctx, key, "status", StatusActive)
			p.HDel(ctx, key, "error")
			return nil
		}, nil
	}
	return nil, &ValidationError{Field: "op", Reason: fmt.Sprintf("unknown op %q", d.Op)}
}

// createDDLTx creates the flow of d under a new id: *d.FlowID, else the
// first free id after flow:seq. flow:seq is raised to the id in the same
// MULTI, so ids are never handed out twice.
func (s *Store) createDDLTx(ctx context.Context, tx *redis.Tx, d *DDL, now time.Time, res *Applied) (func(redis.Pipeliner) error, error) {
	k := s.keys
	seqKey := k.FlowSeq()
	if err := tx.Watch(ctx, seqKey).Err(); err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	seqStr, _, err := getString(ctx, tx, seqKey)
	if err != nil {
		return nil, err
	}
	var seq uint64
	if seqStr != "" {
		if seq, err = strconv.ParseUint(seqStr, 10, 64); err != nil {
			return nil, fmt.Errorf("parse %s = %q: %w", seqKey, seqStr, err)
		}
	}
	var id FlowID
	if d.FlowID != nil {
		id = *d.FlowID
	} else {
		found := false
		for cand := seq + 1; cand <= seq+maxIDProbe && cand <= uint64(^uint32(0)); cand++ {
			infoKey := k.FlowInfo(FlowID(cand))
			used := []string{infoKey, k.Metas(FlowID(cand)), k.Coverage(FlowID(cand))}
			if err := tx.Watch(ctx, used...).Err(); err != nil {
				return nil, fmt.Errorf("watch: %w", err)
			}
			n, err := tx.Exists(ctx, used...).Result()
			if err != nil {
				return nil, fmt.Errorf("exists %s: %w", infoKey, err)
			}
			if n == 0 {
				id, found = FlowID(cand), true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("no free flow id after %s = %d", seqKey, seq)
		}
	}
	res.FlowID = id
	info, routes := d.routes()
	info.CreatedTime, info.UpdatedTime = now, now
	writes, err := s.createTx(ctx, tx, id, info, routes)
	if err != nil || writes == nil {
		return writes, err
	}
	return func(p redis.Pipeliner) error {
		if err := writes(p); err != nil {
			return err
		}
		if uint64(id) > seq {
			p.Set(ctx, seqKey, u32(id), 0)
		}
		return nil
	}, nil
}

// watchInfo WATCHes and reads flow id's info.
func (s *Store) watchInfo(ctx context.Context, tx *redis.Tx, id FlowID) (FlowInfo, bool, error) {
	key := s.keys.FlowInfo(id)
	if err := tx.Watch(ctx, key).Err(); err != nil {
		return FlowInfo{}, false, fmt.Errorf("watch: %w", err)
	}
	v, ok, err := getString(ctx, tx, key)
	if err != nil || !ok {
		return FlowInfo{}, ok, err
	}
	info, err := decodeInfo(key, v)
	return info, err == nil, err
}

// AdvanceDDLOffset sets ddl:offset of pos's partition to pos.NextOffset if
// that is larger than the stored one. The Applier advances past a rejected
// DDL with ClaimDDLReject instead, so that one instance sends it to the DLQ.
func (s *Store) AdvanceDDLOffset(ctx context.Context, pos DDLPosition) error {
	key := s.keys.DDLOffset(pos.Topic, pos.Partition)
	err := s.txn(ctx, "advance_ddl_offset", []string{key}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		off, ok, err := getOffset(ctx, tx, key)
		if err != nil {
			return nil, err
		}
		if ok && off >= pos.NextOffset {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			p.Set(ctx, key, strconv.FormatInt(pos.NextOffset, 10), 0)
			return nil
		}, nil
	})
	if err != nil {
		return fmt.Errorf("advance ddl offset %s/%d: %w", pos.Topic, pos.Partition, err)
	}
	return nil
}

// DDLOffset returns the next DDL offset applied for a partition of the DDL
// topic, and false if none was recorded.
func (s *Store) DDLOffset(ctx context.Context, topic string, partition int32) (int64, bool, error) {
	return getOffset(ctx, s.rdb, s.keys.DDLOffset(topic, partition))
}

func getOffset(ctx context.Context, c redis.Cmdable, key string) (int64, bool, error) {
	v, ok, err := getString(ctx, c, key)
	if err != nil || !ok {
		return 0, ok, err
	}
	off, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s = %q: %w", key, v, err)
	}
	return off, true, nil
}
