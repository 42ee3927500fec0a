// Package catalog writes the catalog objects of layout v2 (docs/FORMAT.md,
// "Layout v2"): for each flow, what its backup means without Redis (its
// definition, coverage windows, truncation point and listed snapshots), as
// sink.Catalog JSON under a new revision each time that content changes.
//
// meta tracks which flows' catalogs are out of date (meta.Store's catalog
// revisions); this package reads their content from Redis and uploads it.
// The consumer calls WriteDirty on every checkpoint advance, before it
// writes the global checkpoint object, and the operator commands that
// change catalog content (snapshot, truncate, gc) call it after their Redis
// change and before they delete any object, so that the bucket never lacks
// the reason an object is gone.
package catalog

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Writer uploads the catalogs of dirty flows.
type Writer struct {
	Store  *meta.Store
	Bucket sink.Bucket
	Prefix string // the bucket prefix (--gcs-prefix)
	Group  string // the consumer group owning the prefix
	Log    *slog.Logger
	// Parallel is how many catalogs are uploaded at once (default 4).
	Parallel int
	// TempDir is where a catalog's JSON is written before its upload (the
	// consumer's --temp-dir); empty: the system's temp directory.
	TempDir string
}

// ErrForeignCatalog marks a catalog name that holds an object this writer
// did not write: the flow's revision moves past it (meta.Store.SkipCatalogRev)
// and the next WriteDirty uploads under the next one.
var ErrForeignCatalog = errors.New("catalog object exists with other content")

// WriteDirty uploads the catalog of every flow whose catalog content
// changed since its last upload, and returns how many it uploaded. A flow
// whose upload fails stays dirty; the error joins every failure. With no
// dirty flow (the usual case) it costs one Redis round trip.
func (w *Writer) WriteDirty(ctx context.Context) (int, error) {
	ids, err := w.Store.DirtyCatalogs(ctx)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	slices.Sort(ids)
	par := w.Parallel
	if par <= 0 {
		par = 4
	}
	sem := make(chan struct{}, par)
	errs := make([]error, len(ids))
	done := make([]bool, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			done[i], errs[i] = w.write(ctx, id)
		})
	}
	wg.Wait()
	n := 0
	for _, ok := range done {
		if ok {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// write uploads flow id's catalog at its current revision and records it
// written. It reports whether it uploaded one (a flow with nothing to
// describe is only recorded).
//
// A catalog of a wide flow is tens of MB of JSON: it is never held whole.
// The content is read from Redis in pages (meta.Store.ScanCatalog, which
// checks that the revision did not move meanwhile), streamed as JSON into a
// temp file (sink.CatalogEncoder) with its size and CRC32C, and uploaded
// from the file.
func (w *Writer) write(ctx context.Context, id meta.FlowID) (bool, error) {
	f, err := os.CreateTemp(w.TempDir, TempPattern)
	if err != nil {
		return false, fmt.Errorf("catalog of flow %d: %w", id, err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	bw := bufio.NewWriterSize(f, 64<<10)
	var (
		sum sumWriter
		enc *sink.CatalogEncoder
		c   sink.Catalog
	)
	st, err := w.Store.ScanCatalog(ctx, id, meta.CatalogVisitor{
		Head: func(st meta.CatalogState) error {
			// A scan that starts over writes the file again.
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return err
			}
			if err := f.Truncate(0); err != nil {
				return err
			}
			bw.Reset(f)
			sum = sumWriter{w: bw, crc: crc32.New(crc32.MakeTable(crc32.Castagnoli))}
			var ok bool
			if c, ok = w.catalogOf(st); !ok {
				return errNothingToDescribe
			}
			var err error
			enc, err = sink.NewCatalogEncoder(&sum, c)
			return err
		},
		Window: func(x meta.Window) error {
			return enc.Window(sink.CatalogWindow{TableID: x.TableID, Since: x.Since, Until: x.Until})
		},
		History: func(x meta.Window) error {
			return enc.History(sink.CatalogWindow{TableID: x.TableID, Since: x.Since, Until: x.Until})
		},
		Pending: func(p meta.PendingStep) error {
			return enc.Pending(sink.CatalogPending{Seq: p.Seq, Added: p.Added, Removed: p.Removed, Ckpt: p.Ckpt})
		},
	})
	if errors.Is(err, errNothingToDescribe) {
		// No definition and no v1 meta to take a name from: a flow dropped
		// before catalogs existed, with no backup. Nothing to describe.
		_, err := w.Store.CatalogWritten(ctx, id, st.Rev)
		return false, err
	}
	if err != nil {
		return false, err
	}
	if err := errors.Join(enc.Close(), bw.Flush()); err != nil {
		return false, fmt.Errorf("catalog of flow %d: write %s: %w", id, f.Name(), err)
	}
	if sum.n > sink.MaxCatalogSize {
		return false, fmt.Errorf("catalog of flow %d: %d bytes, more than %d MiB", id, sum.n, sink.MaxCatalogSize>>20)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("catalog of flow %d: %w", id, err)
	}
	name := sink.CatalogPath(w.Prefix, c.Catalog, c.Name, w.Group, id, st.Rev)
	err = w.Bucket.Upload(ctx, sink.Object{Name: name, Body: bufio.NewReaderSize(f, 64<<10), Size: sum.n, CRC32C: sum.crc.Sum32()})
	if errors.Is(err, sink.ErrExists) {
		err = w.sameCatalog(ctx, name, f)
		if errors.Is(err, ErrForeignCatalog) {
			if serr := w.Store.SkipCatalogRev(ctx, id, st.Rev); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}
	if err != nil {
		return false, fmt.Errorf("upload catalog %s: %w", name, err)
	}
	if _, err := w.Store.CatalogWritten(ctx, id, st.Rev); err != nil {
		return true, err
	}
	return true, nil
}

// TempPattern is the os.CreateTemp pattern of the files catalogs are
// written to before their upload.
const TempPattern = "catalog-*.json"

// errNothingToDescribe ends the scan of a flow with no name to file its
// catalog under.
var errNothingToDescribe = errors.New("no name to file the catalog under")

// sumWriter counts and checksums (CRC32C) what it writes on to w.
type sumWriter struct {
	w   io.Writer
	n   int64
	crc hash.Hash32
}

func (s *sumWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.n += int64(n)
	s.crc.Write(p[:n])
	return n, err
}

// sameCatalog reports nil if name holds the catalog of file f as another
// writer of the same revision wrote it: the same content, whatever
// checkpoint it read. (Two writers of one revision are rare: this reads
// both whole.)
func (w *Writer) sameCatalog(ctx context.Context, name string, f *os.File) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	ours, err := io.ReadAll(f)
	if err != nil {
		return err
	}
	c, err := sink.DecodeCatalog(ours)
	if err != nil {
		return err
	}
	rc, err := w.Bucket.Get(ctx, name)
	if err != nil {
		return fmt.Errorf("exists, and reading it back failed: %w", err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, sink.MaxCatalogSize+1))
	if err != nil {
		return fmt.Errorf("exists, and reading it back failed: %w", err)
	}
	got, err := sink.DecodeCatalog(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrForeignCatalog, err)
	}
	got.CheckpointTS, c.CheckpointTS = 0, 0
	a, _ := sink.EncodeCatalog(got)
	b, _ := sink.EncodeCatalog(c)
	if !bytes.Equal(a, b) {
		return ErrForeignCatalog
	}
	return nil
}

// catalogOf turns a flow's catalog state into its catalog object, and
// false if the flow has no name to file it under.
func (w *Writer) catalogOf(st meta.CatalogState) (sink.Catalog, bool) {
	info := st.Info
	if !st.HasInfo {
		cat, name, ok := sink.SplitFlowPath(w.Prefix, st.AnyMeta)
		if !ok {
			return sink.Catalog{}, false
		}
		info = meta.FlowInfo{CatalogName: cat, FlowName: name}
	}
	if !sink.ValidName(info.CatalogName) || !sink.ValidName(info.FlowName) {
		return sink.Catalog{}, false
	}
	rawInfo, _ := json.Marshal(info) // strings, numbers, maps and times: cannot fail
	c := sink.Catalog{
		Version: sink.CatalogVersion, Group: w.Group, FlowID: st.ID, Catalog: info.CatalogName, Name: info.FlowName,
		Rev: st.Rev, Dropped: !st.Exists, Info: rawInfo, CoverageSeq: st.CoverageSeq,
		TruncatedBefore: st.TruncatedBefore, CheckpointTS: st.CheckpointTS,
	}
	if len(st.Routes) > 0 {
		c.Routes = make(map[string]json.RawMessage, len(st.Routes))
		for p, r := range st.Routes {
			b, _ := json.Marshal(r)
			c.Routes[strconv.FormatUint(uint64(p), 10)] = b
		}
	}
	for t, win := range st.Windows {
		c.Windows = append(c.Windows, sink.CatalogWindow{TableID: t, Since: win.Since, Until: win.Until})
	}
	slices.SortFunc(c.Windows, func(a, b sink.CatalogWindow) int { return cmp.Compare(a.TableID, b.TableID) })
	for _, win := range st.History {
		c.History = append(c.History, sink.CatalogWindow{TableID: win.TableID, Since: win.Since, Until: win.Until})
	}
	for _, e := range st.Pending {
		c.Pending = append(c.Pending, sink.CatalogPending{Seq: e.Seq, Added: e.Added, Removed: e.Removed, Ckpt: e.Ckpt})
	}
	for _, s := range st.Snapshots {
		c.Snapshots = append(c.Snapshots, sink.CatalogSnapshot{TS: s.TS, Path: s.Path})
	}
	slices.SortFunc(c.Snapshots, func(a, b sink.CatalogSnapshot) int {
		return cmp.Or(cmp.Compare(a.TS, b.TS), cmp.Compare(a.Path, b.Path))
	})
	if d := st.DDL; d != nil {
		c.DDL = &sink.CatalogDDL{Topic: d.Topic, Partition: d.Partition, Next: d.NextOffset}
	}
	return c, true
}
