package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Flow names the flow whose backup Restore and Verify read. Redis lists a
// flow's meta paths, but what a meta says is only as trustworthy as the
// bucket: a meta of another flow, or one pointing at a data object outside
// the flow's directory, is refused rather than read.
type Flow struct {
	Prefix  string // the bucket prefix (--gcs-prefix)
	Catalog string
	Name    string
	ID      uint32
}

// Dir is the flow's object directory, FlowDir, with a trailing slash.
func (f Flow) Dir() string { return FlowDir(f.Prefix, f.Catalog, f.Name) + "/" }

// String returns catalog/name (id N).
func (f Flow) String() string { return fmt.Sprintf("%s/%s (id %d)", f.Catalog, f.Name, f.ID) }

func (f Flow) validate() error {
	if !ValidName(f.Catalog) || !ValidName(f.Name) {
		return fmt.Errorf("invalid flow %q/%q", f.Catalog, f.Name)
	}
	return nil
}

// check refuses a meta that is not the flow's. A version 1 meta must name
// the flow (name and id) and keep its data_path inside the flow's
// directory; a version 2 meta, shared by the flows of a cycle, must list the
// flow's id among its flows and keep its data_path under the prefix's v2
// log directory (V2LogDir). Of a version 2 meta a reader uses only the files
// that hold the flow (Meta.Holds).
func (f Flow) check(m *Meta) error {
	var errs []error
	dir, what := f.Dir(), "the flow's directory"
	switch m.Version {
	case MetaVersion2:
		if !m.Serves(f.ID) {
			errs = append(errs, fmt.Errorf("does not serve %s", f))
		}
		dir, what = V2LogDir(f.Prefix), "the v2 log directory"
	default:
		if m.Flow != f.Name || m.FlowID != f.ID {
			errs = append(errs, fmt.Errorf("belongs to flow %q (id %d), not %s", m.Flow, m.FlowID, f))
		}
	}
	if m.DataPath != "" && !under(m.DataPath, dir) {
		errs = append(errs, fmt.Errorf("data_path %q lies outside %s %s", m.DataPath, what, dir))
	}
	return errors.Join(errs...)
}

// under reports whether name lies below dir (which ends in a slash), with
// no ".." element on the way.
func under(name, dir string) bool {
	rest, ok := strings.CutPrefix(name, dir)
	return ok && rest != "" && !slices.Contains(strings.Split(rest, "/"), "..")
}

// streamFlowMeta streams meta object path of flow f (see streamMeta),
// calling file for each file that holds f's entries; it checks that the
// meta is f's (Flow.check) before the first. header, if not nil, sees the
// checked meta without its files first; keys keeps a prefix of the files'
// keys (see metaParts). It returns the object's size.
func streamFlowMeta(ctx context.Context, b Bucket, f Flow, path string, keys bool, header func(m *Meta) error, file func(m *Meta, i int, fm *FileMeta) error) (int64, error) {
	var hdr *Meta
	_, _, size, err := streamMeta(ctx, b, path, metaParts{keys: keys}, metaVisitor{
		header: func(m *Meta) error {
			if err := f.check(m); err != nil {
				return &badMetaError{path: path, err: fmt.Errorf("refused: %w", err)}
			}
			hdr = m
			if header != nil {
				return header(m)
			}
			return nil
		},
		file: func(i int, fm *FileMeta) error {
			if file == nil || !hdr.Holds(f.ID, fm) {
				return nil
			}
			return file(hdr, i, fm)
		},
	})
	return size, err
}
