package sink

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sync"
)

// LoggedMeta is one listed meta of a flow with its decoded content.
type LoggedMeta struct {
	Path string
	Meta Meta
	Size int64 // bytes of the meta object itself
}

// DataSize is the size of the meta's data object: its chunks lie back to
// back from offset 0.
func (m LoggedMeta) DataSize() int64 {
	var end int64
	for _, f := range m.Meta.Files {
		end = max(end, f.Offset+f.Length)
	}
	return end
}

// LogBytesAfter is the stored bytes of the meta's chunks that hold an event
// newer than ts: what a restore at or above ts still reads of it.
func (m LoggedMeta) LogBytesAfter(ts uint64) int64 {
	var n int64
	for _, f := range m.Meta.Files {
		if f.MaxTS > ts && f.NumberOfEntries > 0 {
			n += f.Length
		}
	}
	return n
}

// TruncateKeep says why PlanTruncate keeps a meta whose events are all at or
// below the truncation point.
const TruncateKeepDefault = "holds default-CF values a later write may need"

// PlanTruncate returns the indexes of the metas a truncate at a snapshot at
// s may drop: those whose files all have max_ts <= s (docs/FORMAT.md,
// "Truncate rule"), except any
// meta with a default-CF file that may hold a value a write after s needs.
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
func PlanTruncate(metas []LoggedMeta, s uint64) (drop []int, kept map[string]int) {
	b := s
	for _, m := range metas {
		for _, f := range m.Meta.Files {
			if f.CF == CFWrite && f.MaxTS > s && f.NumberOfEntries > 0 {
				b = min(b, f.MinBeginTSInDefaultCF)
			}
		}
	}
	kept = map[string]int{}
	for i, m := range metas {
		old, needed := true, false
		for _, f := range m.Meta.Files {
			if f.NumberOfEntries == 0 {
				continue
			}
			if f.MaxTS > s {
				old = false
				break
			}
			if f.CF == CFDefault && f.MaxTS >= b {
				needed = true
			}
		}
		switch {
		case !old:
		case needed:
			kept[TruncateKeepDefault]++
		default:
			drop = append(drop, i)
		}
	}
	return drop, kept
}

// ReadMetas reads the meta objects of flow f at paths, parallel at most at
// a time, in the order of paths. Each must decode and belong to f (its
// data_path inside f's directory), so that nothing acting on the result
// touches objects outside the flow.
func ReadMetas(ctx context.Context, b Bucket, f Flow, paths []string, parallel int) ([]LoggedMeta, error) {
	out := make([]LoggedMeta, len(paths))
	errs := make([]error, len(paths))
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = readLoggedMeta(ctx, b, f, p)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func readLoggedMeta(ctx context.Context, b Bucket, f Flow, path string) (LoggedMeta, error) {
	rc, err := b.Get(ctx, path)
	if err != nil {
		return LoggedMeta{}, fmt.Errorf("read meta: %w", err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, maxMetaSize+1))
	if err != nil {
		return LoggedMeta{}, fmt.Errorf("read meta %s: %w", path, err)
	}
	if len(raw) > maxMetaSize {
		return LoggedMeta{}, &badMetaError{path: path, err: fmt.Errorf("larger than %d MiB", maxMetaSize>>20)}
	}
	m, err := DecodeMeta(raw)
	if err != nil {
		return LoggedMeta{}, &badMetaError{path: path, err: err}
	}
	if err := f.check(&m); err != nil {
		return LoggedMeta{}, &badMetaError{path: path, err: fmt.Errorf("refused: %w", err)}
	}
	return LoggedMeta{Path: path, Meta: m, Size: int64(len(raw))}, nil
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
	DataSize int64   // bytes of the data object: its chunks lie back to back from 0
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
		size, err := streamFlowMeta(ctx, b, f, paths[i], func(m *Meta) error {
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

// file adds a chunk of the flow to the summary; a chunk of another flow
// still counts toward the data object's size.
func (s *MetaSummary) file(f *FileMeta, ts uint64, tables map[int64]bool) {
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

// PlanTruncateSummaries is PlanTruncate on metas summarised for s
// (ReadMetaSummaries with ts = s).
func PlanTruncateSummaries(metas []MetaSummary, s uint64) (drop []int, kept map[string]int) {
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
