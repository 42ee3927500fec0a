package sink

import (
	"context"
	"fmt"
	"io"
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
