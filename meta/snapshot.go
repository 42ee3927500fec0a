package meta

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Snapshots and truncation in Redis (docs/FORMAT.md, "Snapshot rule" and
// "Truncate rule").
//
// A snapshot counts only once listed in snapshots:<flow_id>, a sorted set
// whose members are the full object names of the snapshots' snapshot.meta
// objects, scored by the snapshot ts. The score is a float64 and rounds real
// TSOs, so the exact ts is taken from the member's name
// (".../snapshot/<ts:020d>-<flow_id>/snapshot.meta"), which the zero padding
// also makes sort in ts order. truncated_before:<flow_id> holds the ts S of
// the snapshot the last truncate used: the log before S is gone, and a
// restore below S is refused. It never moves backwards.

// Snapshots is the sorted set of a flow's listed snapshots.
func (k Keys) Snapshots(id uint32) string { return k.base + "snapshots:" + u32(id) }

// TruncatedBefore is the string holding the ts below which a flow's log was
// truncated.
func (k Keys) TruncatedBefore(id uint32) string { return k.base + "truncated_before:" + u32(id) }

// ErrBadSnapshotPath is returned for a snapshot member whose name does not
// carry its ts as ".../snapshot/<ts:020d>-<flow_id>/snapshot.meta".
var ErrBadSnapshotPath = errors.New("snapshot path does not name its ts")

// SnapshotRef is one listed snapshot of a flow.
type SnapshotRef struct {
	FlowID FlowID
	TS     uint64 // exact, from the path
	Path   string // full object name of snapshot.meta
}

// SnapshotPathTS returns the ts and flow id a snapshot.meta object name
// carries.
func SnapshotPathTS(path string) (ts uint64, id FlowID, err error) {
	i := strings.LastIndex(path, "/snapshot/")
	if i < 0 {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadSnapshotPath, path)
	}
	rest := path[i+len("/snapshot/"):]
	dir, file, ok := strings.Cut(rest, "/")
	if !ok || file != "snapshot.meta" {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadSnapshotPath, path)
	}
	tsPart, idPart, ok := strings.Cut(dir, "-")
	if !ok || len(tsPart) != 20 {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadSnapshotPath, path)
	}
	ts, err = strconv.ParseUint(tsPart, 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadSnapshotPath, path)
	}
	n, err := strconv.ParseUint(idPart, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %q", ErrBadSnapshotPath, path)
	}
	return ts, FlowID(n), nil
}

// AddSnapshot lists the snapshot whose snapshot.meta is path in
// snapshots:<id>, in one MULTI. Call it only after every object of the
// snapshot is uploaded. Listing the same path again is a no-op.
func (s *Store) AddSnapshot(ctx context.Context, id FlowID, path string) error {
	ts, pid, err := SnapshotPathTS(path)
	if err != nil {
		return err
	}
	if pid != id {
		return fmt.Errorf("%w: %q is not of flow id %d", ErrBadSnapshotPath, path, id)
	}
	key := s.keys.Snapshots(uint32(id))
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, key, redis.Z{Score: float64(ts), Member: path})
		markCatalog(ctx, p, s.keys, id)
		return nil
	}); err != nil {
		return fmt.Errorf("list snapshot in %s: %w", key, err)
	}
	return nil
}

// Snapshots returns the listed snapshots of flow id, oldest first.
func (s *Store) Snapshots(ctx context.Context, id FlowID) ([]SnapshotRef, error) {
	return snapshotsOf(ctx, s.rdb, s.keys.Snapshots(uint32(id)), id)
}

// TruncatedBefore returns the ts below which flow id's log was truncated,
// and false if it never was.
func (s *Store) TruncatedBefore(ctx context.Context, id FlowID) (uint64, bool, error) {
	key := s.keys.TruncatedBefore(uint32(id))
	str, ok, err := getString(ctx, s.rdb, key)
	if err != nil || !ok {
		return 0, false, err
	}
	ts, err := strconv.ParseUint(str, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse %s = %q: %w", key, str, err)
	}
	return ts, true, nil
}
