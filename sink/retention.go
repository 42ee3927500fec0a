package sink

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
)

// TruncateKeepDefault says why PlanTruncate keeps a meta whose events are
// all at or below the truncation point.
const TruncateKeepDefault = "holds default-CF values a later write may need"

// PlanTruncate returns the indexes of the metas a truncate at a snapshot at
// s may drop: those whose files all have max_ts <= s (docs/FORMAT.md,
// "Truncate rule"), except any meta with a default-CF file that may hold a
// value a write after s needs. The metas are summarised for s
// (ReadMetaSummaries with ts = s): of a layout v2 meta only the flow's
// chunks count.
//
// A put committed after s names its value by start ts, and the value was
// logged when it was prewritten, possibly before s and in a meta that is
// otherwise all old. So let b be the minimum of s and of
// min_begin_ts_in_default_cf over every write-CF chunk with max_ts > s (the
// smallest start ts any logged write after s refers to). A meta is dropped
// only if each of its default-CF chunks has max_ts < b. Writes not logged yet
// are covered by the upstream's resolved-ts rule: TiKV does not resolve a
// region past a pending lock's start ts, so a transaction still open at a
// checkpoint >= s has a start ts >= s, and b <= s keeps its value.
//
// kept counts, by reason, the metas with all events at or below s that are
// kept anyway.
func PlanTruncate(metas []MetaSummary, s uint64) (drop []int, kept map[string]int) {
	b := s
	for _, m := range metas {
		b = min(b, m.MinBeginAfter)
	}
	kept = map[string]int{}
	for i, m := range metas {
		switch {
		case m.MaxTS > s:
		case m.HasDefault && m.MaxDefaultTS >= b:
			kept[TruncateKeepDefault]++
		default:
			drop = append(drop, i)
		}
	}
	return drop, kept
}

// MetaSummary is what truncate planning and storage summaries need of one
// listed meta of a flow, as ReadMetaSummaries finds it by streaming the
// meta: a few numbers about the chunks that hold the flow's entries (all of
// a version 1 meta's, those tagged with the flow in a version 2 meta),
// whatever the meta holds.
type MetaSummary struct {
	Path     string
	Size     int64 // bytes of the meta object
	Version  int   // MetaVersion or MetaVersion2
	DataPath string
	DataSize int64   // bytes of the data object up to the end of the flow's last chunk: all of it for v1
	Tables   []int64 // tables of the flow's chunks that are not meta-key chunks, ascending
	// Of the flow's chunks with entries: the largest max_ts, the largest
	// max_ts of a default-CF chunk (0 if none), and the smallest
	// min_begin_ts_in_default_cf of a write-CF chunk with max_ts above the
	// ts the summaries were read for (math.MaxUint64 if none).
	MaxTS         uint64
	MaxDefaultTS  uint64
	HasDefault    bool
	MinBeginAfter uint64
	// LogBytesAfter is the stored bytes of the flow's chunks with an event
	// newer than that ts: what a restore at or above it still reads.
	LogBytesAfter int64
}

// ReadMetaSummaries streams the meta objects of flow f at paths, parallel
// at most at a time, and summarises each for ts (see MetaSummary), in the
// order of paths. Each must decode and belong to f (Flow.check), so that
// nothing acting on the result touches objects outside the flow. Memory is
// that of the summaries, not of the metas.
func ReadMetaSummaries(ctx context.Context, b Bucket, f Flow, paths []string, ts uint64, parallel int) ([]MetaSummary, error) {
	r := ReadSharedMetaSummaries(ctx, b, []SummaryRequest{{Flow: f, Paths: paths, TS: ts}}, parallel)[0]
	return r.Summaries, r.Err
}

// SummaryRequest asks ReadSharedMetaSummaries for the summaries of the
// listed metas Paths of flow Flow, for TS.
type SummaryRequest struct {
	Flow  Flow
	Paths []string
	TS    uint64
}

// SummaryResult is what ReadSharedMetaSummaries found for one request: a
// summary for each of its paths, in their order, or the first error that
// kept one of them from being read (a meta that does not decode, or is not
// the flow's).
type SummaryResult struct {
	Summaries []MetaSummary
	Err       error
}

// ReadSharedMetaSummaries is ReadMetaSummaries for several flows at once. A
// layout v2 meta is shared by the flows it serves: it is read once for
// every request that lists it, not once per flow, so that summarising 300
// flows of one backup reads each meta once. The result has one entry per
// request; an error of one request does not stop the others.
func ReadSharedMetaSummaries(ctx context.Context, b Bucket, reqs []SummaryRequest, parallel int) []SummaryResult {
	type lister struct{ req, idx int }
	out := make([]SummaryResult, len(reqs))
	byPath := map[string][]lister{}
	var paths []string
	for r, q := range reqs {
		out[r].Summaries = make([]MetaSummary, len(q.Paths))
		for i, p := range q.Paths {
			if _, ok := byPath[p]; !ok {
				paths = append(paths, p)
			}
			byPath[p] = append(byPath[p], lister{r, i})
		}
	}
	var mu sync.Mutex
	fail := func(req int, err error) {
		mu.Lock()
		if out[req].Err == nil {
			out[req].Err = err
		}
		mu.Unlock()
	}
	err := forEach(ctx, len(paths), parallel, func(ctx context.Context, i int) error {
		path, ls := paths[i], byPath[paths[i]]
		sums := make([]MetaSummary, len(ls))
		tables := make([]map[int64]bool, len(ls))
		refused := make([]error, len(ls))
		var hdr *Meta
		_, _, size, err := streamMeta(ctx, b, path, metaParts{}, metaVisitor{
			header: func(m *Meta) error {
				hdr = m
				for j, l := range ls {
					if err := reqs[l.req].Flow.check(m); err != nil {
						refused[j] = &badMetaError{path: path, err: fmt.Errorf("refused: %w", err)}
						continue
					}
					sums[j] = MetaSummary{Path: path, Version: m.Version, DataPath: m.DataPath, MinBeginAfter: math.MaxUint64}
					tables[j] = map[int64]bool{}
				}
				return nil
			},
			file: func(_ int, fm *FileMeta) error {
				for j, l := range ls {
					if refused[j] == nil && hdr.Holds(reqs[l.req].Flow.ID, fm) {
						sums[j].file(fm, reqs[l.req].TS, tables[j])
					}
				}
				return nil
			},
		})
		for j, l := range ls {
			switch {
			case err != nil:
				fail(l.req, err)
			case refused[j] != nil:
				fail(l.req, refused[j])
			default:
				sums[j].Size = size
				sums[j].Tables = slices.Sorted(maps.Keys(tables[j]))
				out[l.req].Summaries[l.idx] = sums[j]
			}
		}
		return nil
	})
	if err != nil {
		for r := range out {
			fail(r, err)
		}
	}
	for r := range out {
		if out[r].Err != nil {
			out[r].Summaries = nil
		}
	}
	return out
}

// file adds a chunk of the flow to the summary.
func (s *MetaSummary) file(f *FileMeta, ts uint64, tables map[int64]bool) {
	s.DataSize = max(s.DataSize, f.Offset+f.Length)
	if !f.IsMeta {
		tables[f.TableID] = true
	}
	if f.NumberOfEntries == 0 {
		return
	}
	s.MaxTS = max(s.MaxTS, f.MaxTS)
	if f.CF == CFDefault {
		s.MaxDefaultTS, s.HasDefault = max(s.MaxDefaultTS, f.MaxTS), true
	}
	if f.MaxTS > ts {
		s.LogBytesAfter += f.Length
		if f.CF == CFWrite {
			s.MinBeginAfter = min(s.MinBeginAfter, f.MinBeginTSInDefaultCF)
		}
	}
}
