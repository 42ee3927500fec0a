package meta

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrTruncatedPast is returned by Truncate when the flow was already
// truncated at a later snapshot: truncated_before never moves backwards.
var ErrTruncatedPast = errors.New("flow already truncated at a later ts")

// ErrSnapshotNotListed is returned by Truncate when the snapshot it was
// asked to truncate at is not (or no longer) listed in snapshots:<flow_id>.
var ErrSnapshotNotListed = errors.New("snapshot not listed")

// TruncateDrop is what one truncate removes from Redis.
type TruncateDrop struct {
	// Metas are meta object paths to remove from metas:<flow_id>.
	Metas []string
	// Snapshots are snapshot.meta paths to remove from snapshots:<flow_id>;
	// each must be of a ts below the truncation point.
	Snapshots []string
	// HistoryPruned is how many earlier coverage windows Truncate dropped
	// after moving the truncation point (windows that end below it: no
	// restore can choose them); HistoryErr is why that stopped short, if it
	// did. Either way the truncation itself is done, and the next truncate
	// prunes what is left.
	HistoryPruned int
	HistoryErr    error
}

// TruncatePlan decides what a truncate drops from the flow's listed metas
// and snapshots as they are inside the transaction. It may be called more
// than once (a watched key changed before EXEC) and must have no side
// effects outside Redis; reading objects is fine.
type TruncatePlan func(ctx context.Context, metas []MetaRef, snapshots []SnapshotRef) (TruncateDrop, error)

// Truncate truncates flow id's log at the listed snapshot snap
// (docs/FORMAT.md, "Truncate rule").
//
// Why a restore at or above snap.TS stays whole: it is one transaction that
// WATCHes metas:<id>, snapshots:<id> and truncated_before:<id>, reads them,
// lets plan choose the metas and older snapshots to drop from exactly what it
// read, and then, in one MULTI, removes them and sets truncated_before to
// snap.TS. A cycle committed between the read and EXEC changes metas:<id>, so
// EXEC fails and plan sees the new meta on the retry: no plan decides on a
// list it did not see. The objects of the dropped entries are deleted by the
// caller after Truncate returns; a crash before that leaves only
// unreferenced objects, which gc removes.
//
// It fails with ErrSnapshotNotListed if snap is not listed, and with
// ErrTruncatedPast if truncated_before is already above snap.TS. It returns
// what it removed (entries a concurrent truncate had removed already are
// left out).
func (s *Store) Truncate(ctx context.Context, id FlowID, snap SnapshotRef, plan TruncatePlan) (TruncateDrop, error) {
	k := s.keys
	metasKey, snapsKey, tbKey := k.Metas(id), k.Snapshots(id), k.TruncatedBefore(id)
	var done TruncateDrop
	err := s.txn(ctx, "truncate", []string{metasKey, snapsKey, tbKey}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		done = TruncateDrop{}
		tb, ok, err := getString(ctx, tx, tbKey)
		if err != nil {
			return nil, err
		}
		if ok {
			cur, err := strconv.ParseUint(tb, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("parse %s = %q: %w", tbKey, tb, err)
			}
			if cur > snap.TS {
				return nil, fmt.Errorf("%w: truncated_before is %d, above %d", ErrTruncatedPast, cur, snap.TS)
			}
		}
		snaps, err := snapshotsOf(ctx, tx, snapsKey, id)
		if err != nil {
			return nil, err
		}
		listedSnap := map[string]uint64{}
		for _, r := range snaps {
			listedSnap[r.Path] = r.TS
		}
		if _, ok := listedSnap[snap.Path]; !ok {
			return nil, fmt.Errorf("%w: %s", ErrSnapshotNotListed, snap.Path)
		}
		metas, err := metasOf(ctx, tx, metasKey, id)
		if err != nil {
			return nil, err
		}
		listedMeta := make(map[string]bool, len(metas))
		for _, m := range metas {
			listedMeta[m.Path] = true
		}
		drop, err := plan(ctx, metas, snaps)
		if err != nil {
			return nil, err
		}
		for _, p := range drop.Metas {
			if listedMeta[p] {
				done.Metas = append(done.Metas, p)
				listedMeta[p] = false // listed twice in the plan
			}
		}
		for _, p := range drop.Snapshots {
			ts, ok := listedSnap[p]
			if !ok {
				continue
			}
			if ts >= snap.TS {
				return nil, fmt.Errorf("truncate plan drops snapshot %s at %d, not below %d", p, ts, snap.TS)
			}
			done.Snapshots = append(done.Snapshots, p)
			delete(listedSnap, p)
		}
		if ok && tb == u64(snap.TS) && len(done.Metas) == 0 && len(done.Snapshots) == 0 {
			return nil, nil
		}
		return func(p redis.Pipeliner) error {
			if len(done.Metas) > 0 {
				p.ZRem(ctx, metasKey, toAny(done.Metas)...)
			}
			if len(done.Snapshots) > 0 {
				p.ZRem(ctx, snapsKey, toAny(done.Snapshots)...)
			}
			p.Set(ctx, tbKey, u64(snap.TS), 0)
			markCatalog(ctx, p, k, id)
			return nil
		}, nil
	})
	if err != nil {
		return TruncateDrop{}, fmt.Errorf("truncate flow %d at %d: %w", id, snap.TS, err)
	}
	done.HistoryPruned, done.HistoryErr = s.PruneHistory(ctx, id)
	return done, nil
}

// metasOf reads metas:<id> through c, as Metas does.
func metasOf(ctx context.Context, c redis.Cmdable, key string, id FlowID) ([]MetaRef, error) {
	zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("zrange %s: %w", key, err)
	}
	out := make([]MetaRef, 0, len(zs))
	for _, z := range zs {
		path, _ := z.Member.(string)
		out = append(out, MetaRef{FlowID: id, Path: path, MinResolvedTS: uint64(z.Score)})
	}
	slices.SortFunc(out, func(a, b MetaRef) int {
		return cmp.Or(cmp.Compare(a.MinResolvedTS, b.MinResolvedTS), cmp.Compare(a.Path, b.Path))
	})
	return out, nil
}

// snapshotsOf reads snapshots:<id> through c, as Snapshots does.
func snapshotsOf(ctx context.Context, c redis.Cmdable, key string, id FlowID) ([]SnapshotRef, error) {
	members, err := c.ZRange(ctx, key, 0, -1).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("zrange %s: %w", key, err)
	}
	out := make([]SnapshotRef, 0, len(members))
	for _, m := range members {
		ts, _, err := SnapshotPathTS(m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		out = append(out, SnapshotRef{FlowID: id, TS: ts, Path: m})
	}
	slices.SortFunc(out, func(a, b SnapshotRef) int { return cmp.Or(cmp.Compare(a.TS, b.TS), cmp.Compare(a.Path, b.Path)) })
	return out, nil
}

// BackupIDs returns, sorted, every flow id that has a metas:<id> or
// snapshots:<id> key: the live flows and the dropped ones whose backup is
// still listed. Unlike every other lookup it SCANs (on every master of a
// cluster), so it is for operator commands such as gc, not for the
// consume loop.
func (s *Store) BackupIDs(ctx context.Context) ([]FlowID, error) {
	return s.scanIDs(ctx, "metas:", "snapshots:")
}

// KnownFlowIDs returns, sorted, every flow id this prefix has or had: the
// flows set and the ids with a metas:, snapshots: or coverage: key (flow ids
// are never reused, so these are all of them). gc leaves alone objects of any
// other id: they belong to another deployment on the same GCS prefix. It
// SCANs, as BackupIDs does.
func (s *Store) KnownFlowIDs(ctx context.Context) ([]FlowID, error) {
	ids, err := s.scanIDs(ctx, "metas:", "snapshots:", "coverage:")
	if err != nil {
		return nil, err
	}
	live, err := s.AllFlows(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range live {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// scanIDs returns the ids <id> of the keys <base><kind><id>, for each kind.
func (s *Store) scanIDs(ctx context.Context, kinds ...string) ([]FlowID, error) {
	ids := map[FlowID]bool{}
	base := globEscape(s.keys.base)
	scan := func(ctx context.Context, c *redis.Client) error {
		for _, kind := range kinds {
			it := c.Scan(ctx, 0, base+kind+"*", 1000).Iterator()
			for it.Next(ctx) {
				rest := strings.TrimPrefix(it.Val(), s.keys.base+kind)
				if n, err := strconv.ParseUint(rest, 10, 32); err == nil {
					ids[FlowID(n)] = true
				}
			}
			if err := it.Err(); err != nil {
				return fmt.Errorf("scan %s%s*: %w", s.keys.base, kind, err)
			}
		}
		return nil
	}
	var err error
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex // the per-master scans share ids
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, n)
		})
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("scan for flow ids: unsupported redis client %T", s.rdb)
	}
	if err != nil {
		return nil, err
	}
	out := make([]FlowID, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	slices.Sort(out)
	return out, nil
}

// globEscape escapes the glob metacharacters of a Redis SCAN MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// References is everything Redis references in the bucket, as gc needs it.
type References struct {
	Metas     []string        // every member of every metas:<id>
	Snapshots []string        // every member of every snapshots:<id>
	KnownIDs  map[uint32]bool // KnownFlowIDs
}

// References reads every listed meta and snapshot of every flow id that
// has any, live or dropped, and the flow ids this prefix has or had.
func (s *Store) References(ctx context.Context) (References, error) {
	var l References
	known, err := s.KnownFlowIDs(ctx)
	if err != nil {
		return l, err
	}
	l.KnownIDs = make(map[uint32]bool, len(known))
	for _, id := range known {
		l.KnownIDs[uint32(id)] = true
	}
	ids, err := s.BackupIDs(ctx)
	if err != nil {
		return l, err
	}
	for _, id := range ids {
		metas, err := s.Metas(ctx, id)
		if err != nil {
			return l, err
		}
		for _, m := range metas {
			l.Metas = append(l.Metas, m.Path)
		}
		snaps, err := s.Snapshots(ctx, id)
		if err != nil {
			return l, err
		}
		for _, sn := range snaps {
			l.Snapshots = append(l.Snapshots, sn.Path)
		}
	}
	return l, nil
}
