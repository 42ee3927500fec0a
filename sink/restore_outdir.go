package sink

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// outDir is a restore's OutDir while the restore runs. The tables are
// written into a staging directory inside it (.flowlog-restore-*, mode
// 0700, which nothing else writes), and only a restore that succeeded moves
// them to their <table_id>.jsonl names (each rename replaces an entry of
// that name, a symbolic link itself and never its target) and then removes
// the <table_id>.jsonl entries it did not write, so that OutDir holds this
// restore's tables. A restore that fails or is interrupted discards the
// staging directory, and OutDir if the restore created it: OutDir is left
// as it was before the run, and no file the restore did not write is
// touched.
type outDir struct {
	dir     string
	staging string
	// created are the directories the restore created for OutDir, OutDir
	// last: removed, if still empty, when the restore fails.
	created []string
}

// openOutDir creates dir (mode 0700, parents included) if it is missing,
// else checks that it is empty unless force, and creates the staging
// directory in it. A <table_id>.jsonl entry that is a directory fails it
// here, before anything is read, since no table can replace it.
func openOutDir(dir string, force bool) (*outDir, error) {
	o := &outDir{dir: dir}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
			if _, err := os.Lstat(d); err == nil || !errors.Is(err, os.ErrNotExist) {
				break
			}
			o.created = append(o.created, d)
			if filepath.Dir(d) == d {
				break
			}
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("restore: output directory: %w", err)
	case len(entries) > 0 && !force:
		return nil, fmt.Errorf("restore: %s holds %d entries (%s, ...): %w", dir, len(entries), entries[0].Name(), ErrOutDirNotEmpty)
	}
	for _, e := range entries {
		if isTableFile(e.Name()) && e.IsDir() {
			return nil, fmt.Errorf("restore: replace %s: is a directory", filepath.Join(dir, e.Name()))
		}
	}
	if o.staging, err = os.MkdirTemp(dir, ".flowlog-restore-"); err != nil {
		o.discard()
		return nil, fmt.Errorf("restore: staging dir: %w", err)
	}
	return o, nil
}

// commit moves the written tables to their names in OutDir and removes the
// other <table_id>.jsonl entries, then the staging directory.
func (o *outDir) commit(written map[int64]bool) error {
	for _, id := range slices.Sorted(mapKeys(written)) {
		name := strconv.FormatInt(id, 10) + ".jsonl"
		if err := os.Rename(filepath.Join(o.staging, name), filepath.Join(o.dir, name)); err != nil {
			return fmt.Errorf("restore: move %s into %s: %w", name, o.dir, err)
		}
	}
	entries, err := os.ReadDir(o.dir)
	if err != nil {
		return fmt.Errorf("restore: output directory: %w", err)
	}
	for _, e := range entries {
		if !isTableFile(e.Name()) || written[tableOf(e.Name())] {
			continue
		}
		// os.Remove unlinks a symbolic link, not its target.
		if err := os.Remove(filepath.Join(o.dir, e.Name())); err != nil {
			return fmt.Errorf("restore: remove %s of an earlier restore: %w", e.Name(), err)
		}
	}
	if err := os.Remove(o.staging); err != nil {
		return fmt.Errorf("restore: remove staging dir: %w", err)
	}
	return nil
}

// discard removes the staging directory with what this restore wrote, and
// the directories it created for OutDir if they are empty now.
func (o *outDir) discard() {
	if o.staging != "" {
		_ = os.RemoveAll(o.staging)
	}
	for _, d := range o.created {
		if os.Remove(d) != nil {
			return // not empty: someone else wrote there
		}
	}
}

// tableOf is the table id of a name isTableFile accepts.
func tableOf(name string) int64 {
	id, _ := strconv.ParseInt(name[:len(name)-len(".jsonl")], 10, 64)
	return id
}
