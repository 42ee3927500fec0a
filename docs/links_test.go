package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// linkRE is a Markdown link to a page of docs/ or to a section of one:
// (PAGE.md), (PAGE.md#anchor), (docs/PAGE.md#anchor) or (#anchor).
var linkRE = regexp.MustCompile(`\]\(((?:docs/)?[A-Z_]+\.md)?(?:#([a-z0-9_-]+))?\)`)

// slugRE is what GitHub drops from a heading to make its anchor.
var slugRE = regexp.MustCompile(`[^\p{L}\p{N} _-]`)

// anchorOf is the anchor GitHub gives a heading: lower case, punctuation
// dropped, each space a hyphen.
func anchorOf(title string) string {
	return strings.ReplaceAll(slugRE.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
}

// TestLinksResolve checks every link of the README and of docs/*.md to a
// docs page or to a section: the page exists and has a heading with that
// anchor, so that a renamed section or page does not leave a reader at the
// top of a long page, or at a missing one.
func TestLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("list the docs pages: %v (found %d)", err, len(pages))
	}
	anchors := map[string]map[string]bool{}
	texts := map[string]string{}
	for _, page := range append(pages, "../README.md") {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		texts[page] = string(b)
		anchors[page] = map[string]bool{}
		fenced := false
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
			}
			if title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") && !fenced {
				anchors[page][anchorOf(strings.TrimSpace(title))] = true
			}
		}
	}
	links := 0
	for from, text := range texts {
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target, anchor := from, m[2]
			if m[1] != "" {
				target = strings.TrimPrefix(m[1], "docs/")
			}
			if m[1] == "" && anchor == "" {
				continue
			}
			links++
			switch {
			case anchors[target] == nil:
				t.Errorf("%s links to %s, which is not a docs page", from, m[1])
			case anchor != "" && !anchors[target][anchor]:
				t.Errorf("%s links to %s#%s: no heading there has that anchor", from, target, anchor)
			}
		}
	}
	if links < 20 {
		t.Errorf("found %d links to docs pages; the pages have more (is linkRE still right?)", links)
	}
}
