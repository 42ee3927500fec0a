package pipeline

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/flowlog/flowlog/sink"
)

// tempMarker is the file flowlog writes at the top of --temp-dir once it
// has adopted the directory. Without it, a non-empty directory is only
// adopted when everything in it has the layout flowlog writes, so a
// mistaken --temp-dir (a home directory, /tmp, a data volume) is refused
// instead of cleaned.
const tempMarker = ".flowlog-temp"

const tempMarkerText = "This directory is flowlog's --temp-dir: its temp files are removed at start.\n"

// Names of the files flowlog writes under <temp-dir>/<catalog>/<flow>/, each
// with an optional "f<flow id>-" prefix:
//
//	g<gen>-p<partition>-t<table>-r<region>-<cf>-<op>[-meta].tmp   temp files (earlier versions)
//	<unix ms>-<store id>-<seq>.spool                             spool files (earlier versions)
//
// and directly under <temp-dir>:
//
//	g<gen>.seg   a generation's segment: its temp files' bytes (segment.go)
//	g<gen>.pack  the frames its cycle packed from their raw runs (pack.go)
//	spare<n>.seg a released segment's file, kept to be written over (spare.go)
//	catalog-<digits>.json  a flow catalog's JSON before its upload (catalog.TempPattern)
var (
	segFileRE  = regexp.MustCompile(`^(?:g[0-9]+\.(?:seg|pack)|` + spareNameExpr + `|catalog-[0-9]+\.json)$`)
	tempFileRE = regexp.MustCompile(`^(?:f[0-9]+-)?g[0-9]+-p[0-9]+-t[0-9]+-r[0-9]+-(?:` +
		sink.CFDefault + `|` + sink.CFWrite + `)-(?:` + sink.OpPut + `|` + sink.OpDelete + `)(?:-meta)?\.tmp$`)
	spoolFileRE = regexp.MustCompile(`^(?:f[0-9]+-)?[0-9]+-[A-Za-z0-9_-]{1,128}-[0-9]+\.spool$`)
)

// generatedName reports whether name is one of a temp or spool file as
// flowlog names them.
func generatedName(name string) bool {
	return tempFileRE.MatchString(name) || spoolFileRE.MatchString(name)
}

// cleanTempDir removes leftovers of an earlier process: the segments in
// <root>, and the temp and spool files of earlier versions in
// <root>/<catalog>/<flow>/. Their data was never committed, so it is
// consumed again from the committed offsets.
//
// Only regular files whose names match generatedName, in real directories
// (never a symlink) whose names pass sink.ValidName, are removed, and every
// path is resolved inside root through os.Root, so nothing outside root is
// ever touched. A root without the tempMarker is adopted (the marker is
// written) only if it is empty or holds nothing but that layout; otherwise
// cleanTempDir refuses with a one-line error naming --temp-dir and removes
// nothing.
func cleanTempDir(root string) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("--temp-dir %s: create: %w", root, err)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("--temp-dir %s: open: %w", root, err)
	}
	defer r.Close()
	leftovers, foreign, err := scanTempDir(r)
	if err != nil {
		return fmt.Errorf("--temp-dir %s: list leftover temp files: %w", root, err)
	}
	marked, err := hasTempMarker(r)
	if err != nil {
		return fmt.Errorf("--temp-dir %s: %w", root, err)
	}
	if !marked {
		if foreign != "" {
			return fmt.Errorf("--temp-dir %s is not empty and not flowlog's (no %s marker; it holds %q): point --temp-dir at an empty directory of its own",
				root, tempMarker, foreign)
		}
		if err := r.WriteFile(tempMarker, []byte(tempMarkerText), 0o600); err != nil {
			return fmt.Errorf("--temp-dir %s: write marker: %w", root, err)
		}
	}
	for _, name := range leftovers {
		// Remove does not follow a final symlink, and os.Root keeps every
		// other path element inside root even if the tree changed since
		// the scan.
		if err := r.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("--temp-dir %s: remove leftover temp file: %w", root, err)
		}
	}
	return nil
}

// hasTempMarker reports whether r holds the marker as a regular file.
func hasTempMarker(r *os.Root) (bool, error) {
	fi, err := r.Lstat(tempMarker)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("check marker: %w", err)
	}
	return fi.Mode().IsRegular(), nil
}

// scanTempDir lists r's generated files (paths relative to r) and the first
// entry, if any, that is not part of flowlog's layout: anything but the
// marker, segments and ValidName directories at the first level, anything
// but ValidName directories at the second, anything but a regular file
// with a generated name at the third. Symlinks are never followed: a
// directory entry's type comes from the directory itself.
func scanTempDir(r *os.Root) (leftovers []string, foreign string, err error) {
	cats, err := readDir(r, ".")
	if err != nil {
		return nil, "", err
	}
	for _, cat := range cats {
		if cat.Name() == tempMarker && cat.Type().IsRegular() {
			continue
		}
		if segFileRE.MatchString(cat.Name()) && cat.Type().IsRegular() {
			leftovers = append(leftovers, cat.Name())
			continue
		}
		if !cat.IsDir() || !sink.ValidName(cat.Name()) {
			foreign = firstOf(foreign, cat.Name())
			continue
		}
		flows, err := readDir(r, cat.Name())
		if err != nil {
			return nil, "", err
		}
		for _, flow := range flows {
			dir := path.Join(cat.Name(), flow.Name())
			if !flow.IsDir() || !sink.ValidName(flow.Name()) {
				foreign = firstOf(foreign, dir)
				continue
			}
			files, err := readDir(r, dir)
			if err != nil {
				return nil, "", err
			}
			for _, f := range files {
				name := path.Join(dir, f.Name())
				if !f.Type().IsRegular() || !generatedName(f.Name()) {
					foreign = firstOf(foreign, name)
					continue
				}
				leftovers = append(leftovers, name)
			}
		}
	}
	return leftovers, foreign, nil
}

func firstOf(have, name string) string {
	if have != "" {
		return have
	}
	return name
}

// readDir lists the directory name inside r.
func readDir(r *os.Root, name string) ([]fs.DirEntry, error) {
	f, err := r.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, nil
}
