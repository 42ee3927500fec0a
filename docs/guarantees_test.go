package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// guaranteeSection is the section of the reference that maps each
// guarantee to the section explaining it and the one file holding it.
const guaranteeSection = "Where each guarantee lives"

// guarantees are the rows that section must have, by the start of their
// first cell.
var guarantees = []string{
	"DDL barrier", "Exactly-once commit", "Checkpoint", "Coverage", "Backpressure",
	"Restore completeness", "Truncate no-loss", "gc",
}

var (
	sectionLinkRE = regexp.MustCompile(`^\[([^\]]+)\]\(#[^)]+\)$`)
	goFileRE      = regexp.MustCompile("`([^`]+\\.go)`")
)

// guaranteeRow is one row of the guarantee table.
type guaranteeRow struct {
	guarantee, section, files string
}

// guaranteeRows parses the table of the guarantee section of text.
func guaranteeRows(t *testing.T, text string) []guaranteeRow {
	t.Helper()
	_, body, ok := strings.Cut(text, "\n## "+guaranteeSection+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", reference, guaranteeSection)
	}
	if next := strings.Index(body, "\n## "); next >= 0 {
		body = body[:next]
	}
	var rows []guaranteeRow
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| Guarantee |") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Errorf("row %q has %d cells, want 3 (guarantee, section, file)", line, len(cells))
			continue
		}
		rows = append(rows, guaranteeRow{strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])})
	}
	return rows
}

// checkGuaranteeRow returns what is wrong with row: its section is not a
// heading of the reference, or it names no file of the repository root,
// several, or one that does not exist.
func checkGuaranteeRow(row guaranteeRow, headings map[string]bool, root string) []string {
	var bad []string
	if m := sectionLinkRE.FindStringSubmatch(row.section); m == nil || !headings[m[1]] {
		bad = append(bad, "its section "+row.section+" is not a link to a heading of "+reference)
	}
	files := goFileRE.FindAllStringSubmatch(row.files, -1)
	switch {
	case len(files) == 0:
		bad = append(bad, "it names no file")
	case len(files) > 1 || strings.Count(row.files, "`") != 2:
		bad = append(bad, "it names several files: "+row.files)
	default:
		if fi, err := os.Stat(filepath.Join(root, files[0][1])); err != nil || fi.IsDir() {
			bad = append(bad, "it names "+files[0][1]+", which is not a file of the repository")
		}
	}
	return bad
}

// headingsOf returns the titles of text's headings.
func headingsOf(text string) map[string]bool {
	h := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			h[strings.TrimSpace(title)] = true
		}
	}
	return h
}

// TestGuaranteeFilesExist checks the reference's guarantee table: each
// guarantee has a row, each row links a section of the reference and names
// exactly one file, and that file exists. A newcomer asked where a
// guarantee lives answers from that one file; a row naming a moved file,
// or two, would send them looking again.
func TestGuaranteeFilesExist(t *testing.T) {
	text := readReference(t)
	rows := guaranteeRows(t, text)
	headings := headingsOf(text)
	for _, want := range guarantees {
		found := 0
		for _, r := range rows {
			if strings.HasPrefix(r.guarantee, want+":") {
				found++
			}
		}
		if found != 1 {
			t.Errorf("%s, %q: %d rows for the guarantee %q, want 1", reference, guaranteeSection, found, want)
		}
	}
	for _, r := range rows {
		for _, b := range checkGuaranteeRow(r, headings, "..") {
			t.Errorf("%s, %q: the row of %q: %s", reference, guaranteeSection, r.guarantee, b)
		}
	}
}

// TestGuaranteeRowCheckFindsFaults: the row check refuses a row that names
// no file, several files or a missing one, and one whose section is no
// heading: a check that passed them would keep nothing true.
func TestGuaranteeRowCheckFindsFaults(t *testing.T) {
	headings := map[string]bool{"Commit protocol": true}
	for _, tc := range []struct {
		name  string
		row   guaranteeRow
		wants string
	}{
		{"no file", guaranteeRow{"x: y", "[Commit protocol](#commit-protocol)", "the flusher"}, "no file"},
		{"several files", guaranteeRow{"x: y", "[Commit protocol](#commit-protocol)", "`pipeline/cycle.go`, `meta/commit.go`"}, "several files"},
		{"missing file", guaranteeRow{"x: y", "[Commit protocol](#commit-protocol)", "`pipeline/nosuch.go`"}, "not a file"},
		{"no heading", guaranteeRow{"x: y", "[Commit rules](#commit-rules)", "`pipeline/cycle.go`"}, "not a link to a heading"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := checkGuaranteeRow(tc.row, headings, "..")
			if len(bad) != 1 || !strings.Contains(bad[0], tc.wants) {
				t.Errorf("faults %q, want one saying %q", bad, tc.wants)
			}
		})
	}
	if bad := checkGuaranteeRow(guaranteeRow{"x: y", "[Commit protocol](#commit-protocol)", "`pipeline/cycle.go`"}, headings, ".."); len(bad) != 0 {
		t.Errorf("a good row has faults %q", bad)
	}
}
