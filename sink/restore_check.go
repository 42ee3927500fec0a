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

// check refuses a meta that is not the flow's: another flow name or id in
// its JSON, or a data_path outside the flow's directory.
func (f Flow) check(m *Meta) error {
	var errs []error
	if m.Flow != f.Name || m.FlowID != f.ID {
		errs = append(errs, fmt.Errorf("belongs to flow %q (id %d), not %s", m.Flow, m.FlowID, f))
	}
	if m.DataPath != "" {
		dir := f.Dir()
		rest, ok := strings.CutPrefix(m.DataPath, dir)
		if !ok || rest == "" || slices.Contains(strings.Split(rest, "/"), "..") {
			errs = append(errs, fmt.Errorf("data_path %q lies outside the flow's directory %s", m.DataPath, dir))
		}
	}
	return errors.Join(errs...)
}

// readFlowMeta reads a meta object of flow f: it must decode, validate and
// belong to f. Any problem is a *badMetaError naming the object.
func readFlowMeta(ctx context.Context, b Bucket, f Flow, path string) (Meta, error) {
	m, err := readMeta(ctx, b, path)
	if err != nil {
		return Meta{}, err
	}
	if err := f.check(&m); err != nil {
		return Meta{}, &badMetaError{path: path, err: fmt.Errorf("refused: %w", err)}
	}
	return m, nil
}
