package meta

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Rejected DDL and the DLQ: one DLQ record per rejected DDL offset.
//
// Every replica reads every DDL record, so a record that must go to the DLQ
// is seen by all of them at about the same time. Which one sends it is
// decided in Redis: ClaimDDLReject advances ddl:offset past the record and
// writes a claim, ddl:dlq:<topic>:<p> field <offset>, in one MULTI that
// WATCHes ddl:offset. Exactly one replica's EXEC goes through; every other
// one finds the offset advanced and skips the record. The winner then sends
// the DLQ record and deletes the claim (DoneDDLReject).
//
// Why a crash cannot lose the DLQ record: the claim holds what the DLQ
// record needs (the record's key, value and headers, reason and detail) and
// stays in Redis until the DLQ acknowledged it. A replica that finds a claim
// of another owner older than the takeover time (ApplierConfig.ClaimTimeout)
// takes it over (TakeOverDDLReject, compare-and-swap on the claim) and sends
// the record itself; a claim of its own that it failed to send it sends
// again, unless the DLQ had acknowledged it and only the delete failed
// (then it retries only the delete). The price is a possible duplicate,
// never a loss: if the owner crashed after the DLQ acknowledged but before
// it deleted the claim, or its send (or a Redis outage before the delete)
// lasted longer than the takeover time, the record is in the DLQ twice.

// RejectedDDL is a claim on sending one DDL record to the DLQ.
type RejectedDDL struct {
	Topic     string         `json:"-"`
	Partition int32          `json:"-"`
	Offset    int64          `json:"-"`
	Owner     string         `json:"owner"`      // the Applier instance sending it
	ClaimedMS int64          `json:"claimed_ms"` // Redis TIME of the claim, Unix ms
	Reason    string         `json:"reason"`     // DLQ reason (ReasonDDLInvalid, ReasonDDLRejected)
	Detail    string         `json:"detail"`     // the error, for the DLQ header
	Key       []byte         `json:"key"`
	Value     []byte         `json:"value"`
	Headers   []RecordHeader `json:"headers,omitempty"`

	raw string // the stored JSON, for the compare-and-swap of a takeover
}

// RecordHeader is one Kafka record header of a claimed DDL record.
type RecordHeader struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// DDLRejects is the hash of DLQ claims of a DDL partition: the offset of a
// rejected record -> RejectedDDL JSON, present from the claim until the DLQ
// acknowledged the record.
func (k Keys) DDLRejects(topic string, partition int32) string {
	return k.base + "ddl:dlq:" + topic + ":" + i32(partition)
}

// ClaimDDLReject advances ddl:offset of r's partition to r.Offset+1 and
// records the claim r (owner r.Owner, claimed now by Redis' clock) in the
// same MULTI, unless the stored offset is already past the record: then
// another instance handled it and ClaimDDLReject returns false. The caller
// that gets true must send the DLQ record and then call DoneDDLReject.
func (s *Store) ClaimDDLReject(ctx context.Context, r RejectedDDL) (bool, error) {
	k := s.keys
	offKey, rejKey := k.DDLOffset(r.Topic, r.Partition), k.DDLRejects(r.Topic, r.Partition)
	next := r.Offset + 1
	won := false
	err := s.txn(ctx, "claim_ddl_reject", []string{offKey}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		won = false
		off, ok, err := getOffset(ctx, tx, offKey)
		if err != nil {
			return nil, err
		}
		if ok && off >= next {
			return nil, nil
		}
		now, err := tx.Time(ctx).Result()
		if err != nil {
			return nil, fmt.Errorf("time: %w", err)
		}
		c := r
		c.ClaimedMS = now.UnixMilli()
		b, err := json.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("encode dlq claim: %w", err)
		}
		won = true
		return func(p redis.Pipeliner) error {
			p.Set(ctx, offKey, strconv.FormatInt(next, 10), 0)
			p.HSet(ctx, rejKey, strconv.FormatInt(r.Offset, 10), string(b))
			return nil
		}, nil
	})
	if err != nil {
		return false, fmt.Errorf("claim dlq record of ddl %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	return won, nil
}

// PendingDDLRejects returns the claims of a DDL partition whose DLQ record
// is not known to be sent, by offset.
func (s *Store) PendingDDLRejects(ctx context.Context, topic string, partition int32) ([]RejectedDDL, error) {
	key := s.keys.DDLRejects(topic, partition)
	all, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("hgetall %s: %w", key, err)
	}
	out := make([]RejectedDDL, 0, len(all))
	for f, v := range all {
		off, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: field %q is not an offset", key, f)
		}
		var r RejectedDDL
		if err := json.Unmarshal([]byte(v), &r); err != nil {
			return nil, fmt.Errorf("%s: offset %d: %w", key, off, err)
		}
		r.Topic, r.Partition, r.Offset, r.raw = topic, partition, off, v
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b RejectedDDL) int { return cmp.Compare(a.Offset, b.Offset) })
	return out, nil
}

// TakeOverDDLReject makes owner the sender of claim r, as read by
// PendingDDLRejects, if r is still the stored claim and is owner's own or
// older than after (by Redis' clock). It returns the claim as now stored,
// and false if it was not taken (changed, sent meanwhile, or too young).
func (s *Store) TakeOverDDLReject(ctx context.Context, r RejectedDDL, owner string, after time.Duration) (RejectedDDL, bool, error) {
	key := s.keys.DDLRejects(r.Topic, r.Partition)
	field := strconv.FormatInt(r.Offset, 10)
	var taken RejectedDDL
	ok := false
	err := s.txn(ctx, "take_over_ddl_reject", []string{key}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		ok = false
		cur, err := tx.HGet(ctx, key, field).Result()
		if errors.Is(err, redis.Nil) || err == nil && cur != r.raw {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("hget %s %s: %w", key, field, err)
		}
		now, err := tx.Time(ctx).Result()
		if err != nil {
			return nil, fmt.Errorf("time: %w", err)
		}
		if r.Owner != owner && now.UnixMilli()-r.ClaimedMS < after.Milliseconds() {
			return nil, nil
		}
		taken = r
		taken.Owner, taken.ClaimedMS = owner, now.UnixMilli()
		b, err := json.Marshal(taken)
		if err != nil {
			return nil, fmt.Errorf("encode dlq claim: %w", err)
		}
		taken.raw = string(b)
		ok = true
		return func(p redis.Pipeliner) error {
			p.HSet(ctx, key, field, taken.raw)
			return nil
		}, nil
	})
	if err != nil {
		return RejectedDDL{}, false, fmt.Errorf("take over dlq claim of ddl %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	return taken, ok, nil
}

// DoneDDLReject deletes the claim of r: its DLQ record is acknowledged.
// Whoever holds the claim now, it is deleted, so that an instance that took
// it over and has not sent yet does not send a duplicate.
func (s *Store) DoneDDLReject(ctx context.Context, r RejectedDDL) error {
	key := s.keys.DDLRejects(r.Topic, r.Partition)
	if err := s.rdb.HDel(ctx, key, strconv.FormatInt(r.Offset, 10)).Err(); err != nil {
		return fmt.Errorf("hdel %s %d: %w", key, r.Offset, err)
	}
	return nil
}
