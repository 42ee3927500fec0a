package meta

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// CatalogVisitor receives a flow's catalog content from ScanCatalog part
// by part, in the order of the catalog object's JSON (docs/FORMAT.md,
// "Catalog objects"), so that a writer never holds more than a page of it.
// A visit may be repeated from Head on when the revision moved during the
// scan: each Head call starts the content over.
type CatalogVisitor struct {
	// Head is everything but the windows, the history and the pending
	// steps (Windows, History and Pending are nil). An error ends the scan
	// with it.
	Head func(st CatalogState) error
	// Window is called for each current window, in table order.
	Window func(w Window) error
	// History is called for each earlier window, in the order of
	// CatalogState.History.
	History func(w Window) error
	// Pending is called for each pending step with its tables.
	Pending func(p PendingStep) error
}

// catalogPage is how many windows ScanCatalog reads from Redis at a time.
const catalogPage = 2048

// errRevMoved is a catalog revision that moved while ScanCatalog read the
// content in pages. Past its last attempt ScanCatalog returns it: an
// ErrConflict, as a transaction whose keys kept changing.
var errRevMoved = fmt.Errorf("catalog revision moved during the read: %w", ErrConflict)

// ScanCatalog reads flow id's catalog content as CatalogState does, but in
// pages, handing each part to v: the scalars and small parts in one MULTI
// with the revision, then the current windows (HSCAN; only their table ids
// and windows are held, to sort them), the history (the :history list in
// LRANGE pages, then :past by table, HMGET in pages) and the pending steps
// one at a time. Every change of catalog content increments the revision
// (markCatalog), so the revision is read again at the end: if it moved,
// the scan starts over, at most catalogReadAttempts times, and then fails
// (ErrConflict: the flow stays dirty, and the next writer tries again). It returns the head
// of the content it handed over last.
func (s *Store) ScanCatalog(ctx context.Context, id FlowID, v CatalogVisitor) (CatalogState, error) {
	for attempt := 1; ; attempt++ {
		st, err := s.scanCatalog(ctx, id, v)
		if (!errors.Is(err, errStepGone) && !errors.Is(err, errRevMoved)) || attempt == catalogReadAttempts {
			if err != nil {
				err = fmt.Errorf("scan catalog of flow %d: %w", id, err)
			}
			return st, err
		}
	}
}

func (s *Store) scanCatalog(ctx context.Context, id FlowID, v CatalogVisitor) (CatalogState, error) {
	k := s.keys
	st, pend, err := s.catalogHead(ctx, id)
	if err != nil {
		return st, err
	}
	if err := v.Head(st); err != nil {
		return st, err
	}
	// Current windows: HSCAN, then in table order.
	var cur []Window
	var cursor uint64
	for {
		fields, next, err := s.rdb.HScan(ctx, k.Coverage(id), cursor, "*", catalogPage).Result()
		if err != nil {
			return st, fmt.Errorf("hscan %s: %w", k.Coverage(id), err)
		}
		for i := 0; i+1 < len(fields); i += 2 {
			t, err := strconv.ParseUint(fields[i], 10, 32)
			if err != nil {
				return st, fmt.Errorf("%s: table %q: %w", k.Coverage(id), fields[i], err)
			}
			var w Window
			if err := json.Unmarshal([]byte(fields[i+1]), &w); err != nil {
				return st, fmt.Errorf("%s: table %d: %w", k.Coverage(id), t, err)
			}
			w.TableID = uint32(t)
			cur = append(cur, w)
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	// HSCAN may return a field twice; keep one.
	slices.SortFunc(cur, func(a, b Window) int { return cmp.Compare(a.TableID, b.TableID) })
	cur = slices.CompactFunc(cur, func(a, b Window) bool { return a.TableID == b.TableID })
	for _, w := range cur {
		if err := v.Window(w); err != nil {
			return st, err
		}
	}
	cur = nil
	// History: the list of earlier versions, then :past by table.
	for from := int64(0); ; from += catalogPage {
		vals, err := s.rdb.LRange(ctx, k.CoverageHistory(id), from, from+catalogPage-1).Result()
		if err != nil {
			return st, fmt.Errorf("lrange %s: %w", k.CoverageHistory(id), err)
		}
		for _, raw := range vals {
			var w Window
			if err := json.Unmarshal([]byte(raw), &w); err != nil {
				return st, fmt.Errorf("%s: %w", k.CoverageHistory(id), err)
			}
			if err := v.History(w); err != nil {
				return st, err
			}
		}
		if len(vals) < catalogPage {
			break
		}
	}
	// :past in the order CatalogState reads it: by field, as strings.
	var fieldsPast []string
	for cursor = 0; ; {
		fields, next, err := s.rdb.HScan(ctx, k.CoveragePast(id), cursor, "*", catalogPage).Result()
		if err != nil {
			return st, fmt.Errorf("hscan %s: %w", k.CoveragePast(id), err)
		}
		for i := 0; i+1 < len(fields); i += 2 {
			fieldsPast = append(fieldsPast, fields[i])
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	slices.Sort(fieldsPast)
	fieldsPast = slices.Compact(fieldsPast)
	for len(fieldsPast) > 0 {
		page := fieldsPast[:min(len(fieldsPast), catalogPage)]
		fieldsPast = fieldsPast[len(page):]
		vals, err := s.rdb.HMGet(ctx, k.CoveragePast(id), page...).Result()
		if err != nil {
			return st, fmt.Errorf("hmget %s: %w", k.CoveragePast(id), err)
		}
		for i, val := range vals {
			raw, ok := val.(string)
			if !ok {
				return st, errRevMoved // pruned since the scan: the revision moved too
			}
			t, err := strconv.ParseUint(page[i], 10, 32)
			if err != nil {
				return st, fmt.Errorf("%s: table %q: %w", k.CoveragePast(id), page[i], err)
			}
			ws, err := decodeHistory(k.CoveragePast(id), uint32(t), raw)
			if err != nil {
				return st, err
			}
			for _, w := range ws {
				if err := v.History(w); err != nil {
					return st, err
				}
			}
		}
	}
	// Pending steps, one at a time.
	for _, raw := range pend {
		steps, err := s.pendingSteps(ctx, id, []string{raw})
		if err != nil {
			return st, err
		}
		if err := v.Pending(steps[0]); err != nil {
			return st, err
		}
	}
	rev, err := s.rdb.HGet(ctx, k.CatalogRev(id), "rev").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return st, fmt.Errorf("hget %s: %w", k.CatalogRev(id), err)
	}
	if rev != u64(st.Rev) && !(st.Rev == 0 && rev == "") {
		return st, errRevMoved
	}
	return st, nil
}

// catalogHead reads the revision and the small parts of a flow's catalog
// content in one MULTI, and the raw pending list.
func (s *Store) catalogHead(ctx context.Context, id FlowID) (CatalogState, []string, error) {
	var (
		head catalogHeadCmds
		pend *redis.StringSliceCmd
	)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		head, pend = s.queueCatalogHead(ctx, p, id)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return CatalogState{}, nil, fmt.Errorf("read catalog of flow %d: %w", id, err)
	}
	st, err := s.decodeCatalogHead(id, head)
	return st, pend.Val(), err
}
