package sink

import (
	"context"
	"maps"
	"math"
	"slices"
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
	out := make([]MetaSummary, len(paths))
	err := forEach(ctx, len(paths), parallel, func(ctx context.Context, i int) error {
		s := MetaSummary{Path: paths[i], MinBeginAfter: math.MaxUint64}
		tables := map[int64]bool{}
		size, err := streamFlowMeta(ctx, b, f, paths[i], false, func(m *Meta) error {
			s.Version, s.DataPath = m.Version, m.DataPath
			return nil
		}, func(_ *Meta, _ int, fm *FileMeta) error {
			s.file(fm, ts, tables)
			return nil
		})
		if err != nil {
			return err
		}
		s.Size = size
		s.Tables = slices.Sorted(maps.Keys(tables))
		out[i] = s
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
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
