package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Making pending steps final (the protocol is in coverage.go). A cell's
// net changes are written finChunk tables per MULTI, each MULTI also
// moving the cursor coverage:<id>:fin ("<first>:<last>:<table>") past its
// last table, and only the cell's last MULTI removes its steps, their
// tables and reports. A crash, or another replica racing this one, leaves
// the cursor where the last MULTI put it, and whoever comes next goes on
// from there: every table of the cell gets its new window exactly once,
// from the same reports. Until the cell's last chunk, a table whose chunk
// is not written yet shows its window as before the cell, which is what it
// was while the cell's steps were pending.
const (
	// finChunk is how many tables one MULTI of a cell writes.
	finChunk = 2048
	// finBudget bounds the table windows one FinalizeCoverage call writes;
	// the rest wait for the next call (the flusher calls it after every
	// commit), so that a storm's cells do not hold a flush cycle up.
	finBudget = 64 * finChunk
	// maxCellSteps bounds the steps merged at once: two streams of a
	// chunk of tables each (coverage_steps.go).
	maxCellSteps = 64
)

// beforeFirstChunk, if set, runs before a cell's first chunk is written:
// tests race another finalizer there.
var beforeFirstChunk func()

// errFinMoved stops a finalizer whose cursor another one moved: that one
// goes on with the cell.
var errFinMoved = errors.New("coverage cursor moved by another finalizer")

// cell is a run of pending steps crossed at once by every partition, with
// the values its tables get and where its writing stands.
type cell struct {
	steps  []CoverageEntry
	since  uint64 // max of the non-idle since reports (0: none)
	until  uint64 // min of the non-idle until reports
	live   bool   // some partition reported a non-idle until
	cursor uint32 // tables up to this one are written
	fin    string // the cursor as stored, "" before the first chunk
	tb     uint64 // the flow's truncation point, for the history
}

func (c *cell) first() uint64 { return c.steps[0].Seq }
func (c *cell) last() uint64  { return c.steps[len(c.steps)-1].Seq }

func (c *cell) finValue(cursor uint32) string {
	return u64(c.first()) + ":" + u64(c.last()) + ":" + u32(cursor)
}

// FinalizeCoverage makes final the pending steps that every partition of
// topic in withRecords has reported, in order, a cell at a time, each flow
// on its own, finParallel flows at once, writing about finBudget table
// windows at most (the rest on the next call). It returns how many table
// windows it wrote.
//
// Flows are finalized side by side because each costs a few round trips
// whatever it holds: a session's first advance after 300 flows were
// created finalized their first windows one flow after the other in 5 s.
// A flow's cell touches only that flow's keys, so flows never contend.
func (s *Store) FinalizeCoverage(ctx context.Context, topic string, withRecords []int32) (int, error) {
	k := s.keys
	ids, err := s.rdb.SMembers(ctx, k.CoverageFlows()).Result()
	if err != nil {
		return 0, fmt.Errorf("smembers %s: %w", k.CoverageFlows(), err)
	}
	flows := make([]FlowID, 0, len(ids))
	for _, v := range ids {
		if id64, err := strconv.ParseUint(v, 10, 32); err == nil {
			flows = append(flows, FlowID(id64))
		}
	}
	slices.Sort(flows)
	var (
		total atomic.Int64
		next  atomic.Int64
		errs  = make([]error, len(flows))
		wg    sync.WaitGroup
	)
	for range min(finParallel, len(flows)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				left := finBudget - int(total.Load())
				if i >= len(flows) || left <= 0 {
					return
				}
				n, err := s.finalizeFlow(ctx, flows[i], topic, withRecords, left)
				total.Add(int64(n))
				if err != nil {
					errs[i] = fmt.Errorf("finalize coverage of flow %d: %w", flows[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	return int(total.Load()), errors.Join(errs...)
}

// finParallel is how many flows FinalizeCoverage finalizes at once.
const finParallel = 8

// finalizeFlow makes final the complete cells of one flow, up to budget
// table windows.
func (s *Store) finalizeFlow(ctx context.Context, id FlowID, topic string, withRecords []int32, budget int) (int, error) {
	n := 0
	for n < budget {
		c, err := s.nextCell(ctx, id, topic, withRecords)
		if err != nil || c == nil {
			return n, err
		}
		m, err := s.writeCell(ctx, id, c, budget-n)
		n += m
		if errors.Is(err, errFinMoved) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// nextCell returns the cell in progress (coverage:<id>:fin), else the
// first complete cell of the pending steps, else nil. A flow without
// pending steps leaves coverage:flows.
func (s *Store) nextCell(ctx context.Context, id FlowID, topic string, withRecords []int32) (*cell, error) {
	k := s.keys
	fin, hasFin, err := getString(ctx, s.rdb, k.CoverageFin(id))
	if err != nil {
		return nil, err
	}
	raws, err := s.rdb.LRange(ctx, k.CoveragePending(id), 0, maxCellSteps-1).Result()
	if err != nil {
		return nil, fmt.Errorf("lrange %s: %w", k.CoveragePending(id), err)
	}
	if len(raws) == 0 {
		if hasFin {
			if err := s.dropStaleFin(ctx, id, fin, 0); err != nil {
				return nil, err
			}
		}
		return nil, s.forgetPending(ctx, id)
	}
	entries := make([]CoverageEntry, 0, len(raws))
	for _, raw := range raws {
		e, err := decodeEntry(raw)
		if err != nil {
			return nil, fmt.Errorf("decode %s: %w", k.CoveragePending(id), err)
		}
		entries = append(entries, e)
	}
	c := &cell{}
	if hasFin {
		first, last, cursor, err := parseFin(fin)
		if err != nil {
			return nil, fmt.Errorf("%s = %q: %w", k.CoverageFin(id), fin, err)
		}
		i := slices.IndexFunc(entries, func(e CoverageEntry) bool { return e.Seq == last })
		if last < entries[0].Seq {
			// The cursor's cell was ended: a finalizer that read the
			// cell before that wrote the cursor after it (as versions
			// before this one could). Its steps are gone, so the cursor
			// means nothing; drop it and take the next cell.
			if err := s.dropStaleFin(ctx, id, fin, entries[0].Seq); err != nil {
				return nil, err
			}
			return s.nextCell(ctx, id, topic, withRecords)
		}
		if entries[0].Seq != first || i < 0 {
			return nil, fmt.Errorf("%s = %q: the pending steps start at %d", k.CoverageFin(id), fin, entries[0].Seq)
		}
		c.steps, c.cursor, c.fin = entries[:i+1], cursor, fin
	}
	reports, err := s.cellReports(ctx, id, topic, withRecords, entries)
	if err != nil {
		return nil, err
	}
	if len(reports) == 0 {
		if hasFin {
			return nil, fmt.Errorf("%s = %q: the cell's reports are gone", k.CoverageFin(id), fin)
		}
		return nil, nil // not every partition reported the first step
	}
	if !hasFin {
		c.steps = entries[:len(reports)]
	}
	for _, r := range reports[0] {
		if !r.since.Idle {
			c.since = max(c.since, r.since.TS)
		}
		if !r.until.Idle {
			if !c.live || r.until.TS < c.until {
				c.until = r.until.TS
			}
			c.live = true
		}
	}
	if c.tb, _, err = s.TruncatedBefore(ctx, id); err != nil {
		return nil, err
	}
	return c, nil
}

// cellReports returns, for the longest run of entries from the first that
// every partition of withRecords reported with the same values and crossed
// at once, each step's reports by partition; nil if a partition has not
// reported the first step.
func (s *Store) cellReports(ctx context.Context, id FlowID, topic string, withRecords []int32, entries []CoverageEntry) ([][]partReport, error) {
	k := s.keys
	if len(withRecords) == 0 {
		// No partition has records: nothing is routed, and every step is
		// final at once with no value (partitions without records are left
		// out of every cell).
		return make([][]partReport, len(entries)), nil
	}
	fields := make([]string, 0, len(entries)*len(withRecords))
	for _, e := range entries {
		for _, p := range withRecords {
			fields = append(fields, partField(e.Seq, topic, p))
		}
	}
	vals, err := s.rdb.HMGet(ctx, k.CoverageParts(id), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("hmget %s: %w", k.CoverageParts(id), err)
	}
	var out [][]partReport
	end := uint64(0) // the cell's last step: the least upto of the first step's reports
	for i, e := range entries {
		row := make([]partReport, len(withRecords))
		for j := range withRecords {
			v, ok := vals[i*len(withRecords)+j].(string)
			if !ok {
				return out, nil
			}
			r, err := parseReport(e.Seq, v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k.CoverageParts(id), err)
			}
			switch {
			case i == 0:
				if j == 0 || r.upto < end {
					end = r.upto
				}
			case e.Seq > end || r.raw != out[0][j].raw:
				return out, nil
			}
			row[j] = r
		}
		if i > 0 && e.Seq > end {
			return out, nil
		}
		out = append(out, row)
		if e.Seq >= end {
			return out, nil
		}
	}
	return out, nil
}

func parseFin(v string) (first, last uint64, cursor uint32, err error) {
	parts := strings.Split(v, ":")
	if len(parts) != 3 {
		return 0, 0, 0, errors.New("want first:last:table")
	}
	if first, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return 0, 0, 0, err
	}
	if last, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return 0, 0, 0, err
	}
	t, err := strconv.ParseUint(parts[2], 10, 32)
	return first, last, uint32(t), err
}

// dropStaleFin deletes the cursor fin of a cell whose steps are no longer
// pending (head: the first pending step, 0 for none), if it is still fin.
func (s *Store) dropStaleFin(ctx context.Context, id FlowID, fin string, head uint64) error {
	k := s.keys
	err := s.txn(ctx, "finalize_coverage", []string{k.CoverageFin(id)}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		if err := checkFin(ctx, tx, k.CoverageFin(id), fin); err != nil {
			return nil, err
		}
		return func(p redis.Pipeliner) error { p.Del(ctx, k.CoverageFin(id)); return nil }, nil
	})
	if err != nil && !errors.Is(err, errFinMoved) {
		return fmt.Errorf("remove %s = %q of an ended cell (first pending step %d): %w", k.CoverageFin(id), fin, head, err)
	}
	return nil
}

// forgetPending takes a flow without pending steps out of coverage:flows.
func (s *Store) forgetPending(ctx context.Context, id FlowID) error {
	k := s.keys
	return s.txn(ctx, "finalize_coverage", []string{k.CoveragePending(id)}, func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
		n, err := tx.LLen(ctx, k.CoveragePending(id)).Result()
		if err != nil || n > 0 {
			return nil, err
		}
		return func(p redis.Pipeliner) error { p.SRem(ctx, k.CoverageFlows(), u32(id)); return nil }, nil
	})
}

// writeCell writes the net changes of c, finChunk tables per MULTI, then
// removes the cell's steps; it stops after budget tables, the cursor
// saved. It returns how many table windows it wrote.
func (s *Store) writeCell(ctx context.Context, id FlowID, c *cell, budget int) (int, error) {
	merge, err := s.newCellMerge(ctx, id, c.steps, c.cursor)
	if err != nil {
		return 0, err
	}
	n := 0
	chunk := make([]tableChange, 0, finChunk)
	for {
		chunk = chunk[:0]
		for len(chunk) < finChunk {
			ch, ok, err := merge.next(ctx)
			if err != nil {
				return n, err
			}
			if !ok {
				break
			}
			chunk = append(chunk, ch)
		}
		if len(chunk) == 0 {
			return n, s.endCell(ctx, id, c)
		}
		if c.fin == "" && beforeFirstChunk != nil {
			beforeFirstChunk()
		}
		wrote, err := s.writeChunk(ctx, id, c, chunk)
		n += wrote
		if err != nil {
			return n, err
		}
		if n >= budget {
			return n, nil
		}
	}
}

// writeChunk writes one chunk of a cell's changes and moves the cursor
// past it, in one MULTI that checks the cursor is still c.fin.
func (s *Store) writeChunk(ctx context.Context, id FlowID, c *cell, chunk []tableChange) (int, error) {
	k := s.keys
	fields := make([]string, len(chunk))
	for i, ch := range chunk {
		fields[i] = u32(ch.table)
	}
	next := c.finValue(chunk[len(chunk)-1].table)
	wrote := 0
	err := s.txn(ctx, "finalize_coverage", []string{k.CoverageFin(id), k.Coverage(id), k.CoveragePast(id), k.CoveragePending(id)},
		func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
			if err := checkFin(ctx, tx, k.CoverageFin(id), c.fin); err != nil {
				return nil, err
			}
			if c.fin == "" {
				// No cursor yet: another finalizer may have written and
				// ended this very cell since it was read, and an absent
				// cursor looks the same before a cell as after it.
				if err := checkHead(ctx, tx, k.CoveragePending(id), c.first()); err != nil {
					return nil, err
				}
			}
			curs, err := tx.HMGet(ctx, k.Coverage(id), fields...).Result()
			if err != nil {
				return nil, fmt.Errorf("hmget %s: %w", k.Coverage(id), err)
			}
			pasts, err := tx.HMGet(ctx, k.CoveragePast(id), fields...).Result()
			if err != nil {
				return nil, fmt.Errorf("hmget %s: %w", k.CoveragePast(id), err)
			}
			set := make([]any, 0, 2*len(chunk))
			var past []any
			var emptied []string
			for i, ch := range chunk {
				var cur *Window
				if v, ok := curs[i].(string); ok {
					var w Window
					if err := json.Unmarshal([]byte(v), &w); err != nil {
						return nil, fmt.Errorf("%s: table %d: %w", k.Coverage(id), ch.table, err)
					}
					cur = &w
				}
				switch ch.net {
				case netAdded:
					w := Window{Since: c.since}
					set = append(set, fields[i], encodeWindow(w))
					if cur == nil {
						continue
					}
					var hist []Window
					if v, ok := pasts[i].(string); ok {
						if hist, err = decodeHistory(k.CoveragePast(id), ch.table, v); err != nil {
							return nil, err
						}
					}
					cur.TableID = ch.table
					had := len(hist)
					hist = pruneHistory(append(hist, *cur), &w, c.tb)
					switch {
					case len(hist) > 0:
						past = append(past, fields[i], encodeHistory(hist))
					case had > 0:
						emptied = append(emptied, fields[i])
					}
				case netRemoved:
					if cur == nil || cur.Until != nil {
						continue // never established, or closed already
					}
					until := cur.Since // no live partition: an empty window
					if c.live {
						until = c.until
					}
					cur.Until = &until
					set = append(set, fields[i], encodeWindow(*cur))
				}
			}
			wrote = len(set) / 2
			return func(p redis.Pipeliner) error {
				if len(set) > 0 {
					p.HSet(ctx, k.Coverage(id), set...)
				}
				if len(past) > 0 {
					p.HSet(ctx, k.CoveragePast(id), past...)
				}
				if len(emptied) > 0 {
					p.HDel(ctx, k.CoveragePast(id), emptied...)
				}
				if len(set) > 0 || len(past) > 0 || len(emptied) > 0 {
					markCatalog(ctx, p, k, id)
				}
				p.Set(ctx, k.CoverageFin(id), next, 0)
				return nil
			}, nil
		})
	if err != nil {
		return 0, err
	}
	c.fin = next
	return wrote, nil
}

// endCell removes a cell whose tables are written: its steps, their table
// lists and reports, and the cursor, in one MULTI that checks the cursor
// is still c.fin.
func (s *Store) endCell(ctx context.Context, id FlowID, c *cell) error {
	k := s.keys
	return s.txn(ctx, "finalize_coverage", []string{k.CoverageFin(id), k.CoveragePending(id)},
		func(ctx context.Context, tx *redis.Tx) (func(redis.Pipeliner) error, error) {
			if err := checkFin(ctx, tx, k.CoverageFin(id), c.fin); err != nil {
				return nil, err
			}
			if err := checkHead(ctx, tx, k.CoveragePending(id), c.first()); err != nil {
				return nil, err
			}
			left, err := tx.LLen(ctx, k.CoveragePending(id)).Result()
			if err != nil {
				return nil, fmt.Errorf("llen %s: %w", k.CoveragePending(id), err)
			}
			reported, err := tx.HKeys(ctx, k.CoverageParts(id)).Result()
			if err != nil {
				return nil, fmt.Errorf("hkeys %s: %w", k.CoverageParts(id), err)
			}
			var hdel []string
			for _, f := range reported {
				seq, _, _ := strings.Cut(f, "/")
				if n, err := strconv.ParseUint(seq, 10, 64); err == nil && n <= c.last() {
					hdel = append(hdel, f)
				}
			}
			var steps []string
			for _, e := range c.steps {
				steps = append(steps, k.CoverageStep(id, e.Seq, stepAdd), k.CoverageStep(id, e.Seq, stepDel))
			}
			return func(p redis.Pipeliner) error {
				p.LTrim(ctx, k.CoveragePending(id), int64(len(c.steps)), -1)
				p.Del(ctx, steps...)
				if len(hdel) > 0 {
					p.HDel(ctx, k.CoverageParts(id), hdel...)
				}
				p.Del(ctx, k.CoverageFin(id))
				if left == int64(len(c.steps)) {
					p.SRem(ctx, k.CoverageFlows(), u32(id))
				}
				markCatalog(ctx, p, k, id) // the steps leave the catalog's pending
				return nil
			}, nil
		})
}

// checkHead returns errFinMoved unless the first pending step is seq.
func checkHead(ctx context.Context, tx *redis.Tx, key string, seq uint64) error {
	head, err := tx.LIndex(ctx, key, 0).Result()
	if errors.Is(err, redis.Nil) {
		return errFinMoved
	}
	if err != nil {
		return fmt.Errorf("lindex %s: %w", key, err)
	}
	if e, err := decodeEntry(head); err != nil || e.Seq != seq {
		return errFinMoved
	}
	return nil
}

// checkFin returns errFinMoved unless the cursor is want ("" : absent).
func checkFin(ctx context.Context, tx *redis.Tx, key, want string) error {
	got, ok, err := getString(ctx, tx, key)
	if err != nil {
		return err
	}
	if ok != (want != "") || got != want {
		return errFinMoved
	}
	return nil
}

// encodeWindow is a table's field of coverage:<id>.
func encodeWindow(w Window) string {
	b, _ := json.Marshal(Window{Since: w.Since, Until: w.Until})
	return string(b)
}
