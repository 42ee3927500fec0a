package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Store is flowlog's metadata in Redis (docs/FORMAT.md, "Redis keys").
//
// Why the flow metadata stays consistent: every operation that changes it is
// one WATCH -> read/compare -> MULTI/EXEC transaction. Each key is WATCHed
// before it is read (keys that are only known after a read, such as
// flow:info:<id> after flow:name, are WATCHed at that point, still before
// the read), so if any key an operation decided on changed before EXEC, the
// EXEC fails and the operation runs again from its reads (bounded, jittered;
// ErrConflict when the bound is hit). The writes of one operation — name,
// info, routes, flownode and table indexes, flows set, state, and for a DDL
// the ddl:offset — are queued in a single MULTI, so readers never see half a
// flow and a crash never leaves one. Index entries of a flow are only ever
// written or removed by a transaction that also writes that flow's
// flow:info key, so two transactions on one flow always conflict and cannot
// interleave their index changes.
//
// All keys share the hash tag {flowlog}, so the same transactions work on a
// Redis Cluster.
type Store struct {
	rdb  redis.UniversalClient
	keys Keys
	tx   *txner
	// owner is the group ClaimOwner recorded; once set, the consumer's
	// writes check that the owner key still names it (owner.go).
	owner atomic.Pointer[string]
}

// NewStore returns a Store on rdb whose keys start with prefix ("" means
// DefaultPrefix). Its metrics (redis_txn_retries_total) are registered on
// reg; reg may be nil.
func NewStore(rdb redis.UniversalClient, prefix string, reg prometheus.Registerer) *Store {
	return &Store{rdb: rdb, keys: NewKeys(prefix), tx: newTxner(rdb, reg)}
}

// Keys returns the key builder of this store's prefix.
func (s *Store) Keys() Keys { return s.keys }

// Client returns the Redis client the store uses.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// txn runs fn as one WATCH/MULTI transaction on keys with bounded retries.
//
// The reads of one attempt are not a snapshot: a key read early may change
// before a key read later. That is harmless when fn writes (EXEC fails and
// the attempt is retried), but a decision not to write — an error such as
// ErrFlowAlreadyExists, or a no-op — could rest on a torn view. So such an
// outcome is confirmed with an empty MULTI/EXEC (a PING): if a watched key
// changed, EXEC fails and the attempt is retried from its reads; otherwise
// every read was current at that EXEC and the outcome stands.
//
// A store that claimed its prefix (ClaimOwner) guards every transaction:
// the owner key is WATCHed and checked before fn runs, so no write of a
// replica recreates keys in a Redis that was flushed or taken over
// (docs/OPERATING.md, "Losing Redis"). A caller whose keys hold the owner
// key already checks it itself, with reads it batches (the commit).
func (s *Store) txn(ctx context.Context, op string, keys []string, fn TxnFunc) error {
	guard := s.owner.Load() != nil && !slices.Contains(keys, s.keys.Owner())
	if guard {
		keys = append(slices.Clip(keys), s.keys.Owner())
	}
	return s.tx.run(ctx, op, keys, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		var writes func(redis.Pipeliner) error
		var err error
		if guard {
			err = s.checkOwner(ctx, tx)
		}
		if err == nil {
			writes, err = fn(ctx, tx)
		}
		if err == nil && writes != nil {
			return writes, nil
		}
		_, verr := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Ping(ctx)
			return nil
		})
		if errors.Is(verr, redis.TxFailedErr) {
			return nil, verr
		}
		if err == nil && verr != nil {
			return nil, fmt.Errorf("confirm reads: %w", verr)
		}
		return nil, err
	})
}

// writeGuarded runs writes, which read nothing first, as one MULTI/EXEC:
// guarded by the owner key like every transaction once the store claimed
// its prefix, else as it is (a WATCH of no key is refused by Redis Cluster).
func (s *Store) writeGuarded(ctx context.Context, op string, writes func(redis.Pipeliner) error) error {
	if s.owner.Load() == nil {
		_, err := s.rdb.TxPipelined(ctx, writes)
		return err
	}
	return s.txn(ctx, op, nil, func(context.Context, *redis.Tx) (func(redis.Pipeliner) error, error) {
		return writes, nil
	})
}

// encodeInfo is the canonical JSON of a FlowInfo: encoding/json with its
// sorted map keys. Two infos are equal when these bytes are.
func encodeInfo(info FlowInfo) (string, error) {
	b, err := json.Marshal(info)
	if err != nil {
		return "", fmt.Errorf("encode flow info: %w", err)
	}
	return string(b), nil
}

// decodeInfo parses stored FlowInfo JSON.
func decodeInfo(key, s string) (FlowInfo, error) {
	var info FlowInfo
	if err := json.Unmarshal([]byte(s), &info); err != nil {
		return FlowInfo{}, fmt.Errorf("decode %s: %w", key, err)
	}
	return info, nil
}

// canonical re-encodes stored FlowInfo JSON so that a value written by any
// encoder compares by content.
func canonical(key, stored string) (string, error) {
	info, err := decodeInfo(key, stored)
	if err != nil {
		return "", err
	}
	return encodeInfo(info)
}

func encodeRoute(r Route) string {
	b, _ := json.Marshal(r) // Route has only strings and integers: cannot fail
	return string(b)
}

// getString reads a string key, reporting absence as ok=false.
func getString(ctx context.Context, c redis.Cmdable, key string) (string, bool, error) {
	v, err := c.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("get %s: %w", key, err)
	}
	return v, true, nil
}

// getFlowID reads a flow:name key.
func getFlowID(ctx context.Context, c redis.Cmdable, key string) (FlowID, bool, error) {
	v, ok, err := getString(ctx, c, key)
	if err != nil || !ok {
		return 0, ok, err
	}
	id, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s = %q: %w", key, v, err)
	}
	return FlowID(id), true, nil
}

// readRoutes reads a flow:routes hash.
func readRoutes(ctx context.Context, c redis.Cmdable, key string) (map[uint32]Route, error) {
	raw, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("hgetall %s: %w", key, err)
	}
	return parseRoutes(key, raw)
}

// routeArgs is routes as HSET field/value arguments.
func routeArgs(routes map[uint32]Route) []any {
	args := make([]any, 0, 2*len(routes))
	for p, r := range routes {
		args = append(args, u32(p), encodeRoute(r))
	}
	return args
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
