package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// The reference and the sections whose backticked names must cover the
// code: Redis keys are looked up in redisSection only, object names in
// bucketSection only, so a name mentioned in passing elsewhere does not
// count as documented.
const (
	reference     = "FORMAT.md"
	redisSection  = "Redis keys"
	bucketSection = "Bucket layout"
	redisBase     = "<prefix>:{flowlog}:"
)

// Sample arguments of the builders. Strings are placeholders and integers
// are numbers, so that shape turns the code's names and the reference's
// <placeholder> names into the same pattern.
const (
	samplePrefix  = "<prefix>"
	sampleCatalog = "<catalog>"
	sampleFlow    = "<flow>"
	sampleU32     = uint32(4000000001)
	sampleU64     = uint64(9000000000000000001)
	sampleI32     = int32(2000000001)
	sampleI64     = int64(3000000001)
	sampleTS      = uint64(431656320867237891) // 2022-03-07 07h UTC
)

var (
	placeholderRE = regexp.MustCompile(`<[^<>]*>`)
	digitsRE      = regexp.MustCompile(`[0-9]+`)
	spanRE        = regexp.MustCompile("`([^`\n]+)`")
)

// shape reduces a key or object name to its pattern: every <placeholder>
// and every run of digits becomes "*". "flow:info:<flow_id>" and
// "flow:info:4000000001" both become "flow:info:*".
func shape(s string) string {
	return digitsRE.ReplaceAllString(placeholderRE.ReplaceAllString(s, "*"), "*")
}

// objectSamples builds one name with each path builder of sink. A builder
// the AST scan finds without an entry here fails the test: add a sample
// call, and document the object kind in FORMAT.md.
var objectSamples = map[string]func() string{
	"FlowDir":   func() string { return sink.FlowDir(samplePrefix, sampleCatalog, sampleFlow) },
	"ProbePath": func() string { return sink.ProbePath(samplePrefix, "<random>") },
	"DataPath": func() string {
		return sink.DataPath(samplePrefix, sampleCatalog, sampleFlow, sampleU32, sampleTS, "<cycle_id>")
	},
	"MetaPath": func() string {
		return sink.MetaPath(samplePrefix, sampleCatalog, sampleFlow, sampleU32, sampleTS, "<cycle_id>")
	},
	"CheckpointPath": func() string {
		return sink.CheckpointPath(samplePrefix, sampleCatalog, sampleFlow, "<group>", sampleU32)
	},
	"SnapshotDir": func() string {
		return sink.SnapshotDir(samplePrefix, sampleCatalog, sampleFlow, sampleU32, sampleTS)
	},
	"SnapshotMetaPath": func() string {
		return sink.SnapshotMetaPath(samplePrefix, sampleCatalog, sampleFlow, sampleU32, sampleTS)
	},
	"SnapshotTablePath": func() string {
		return sink.SnapshotTablePath(samplePrefix, sampleCatalog, sampleFlow, sampleU32, sampleTS, sampleI64)
	},
	"V2LogDir":  func() string { return sink.V2LogDir(samplePrefix) },
	"V2MetaDir": func() string { return sink.V2MetaDir(samplePrefix) },
	"DataPathV2": func() string {
		return sink.DataPathV2(samplePrefix, "<store_id>", sampleTS, "<cycle_id>")
	},
	"MetaPathV2": func() string {
		return sink.MetaPathV2(samplePrefix, "<store_id>", sampleTS, "<cycle_id>")
	},
	"CheckpointPathV2": func() string { return sink.CheckpointPathV2(samplePrefix, "<group>") },
	"CatalogDir":       func() string { return sink.CatalogDir(samplePrefix, sampleCatalog, sampleFlow) },
	"CatalogPath": func() string {
		return sink.CatalogPath(samplePrefix, sampleCatalog, sampleFlow, "<group>", sampleU32, sampleU64)
	},
}

// TestReferenceNamesEveryRedisKeyFamily checks that every key family that
// meta.Keys builds (each exported method, found by reflection, so a new one
// is checked without touching this test) appears in the Redis keys section,
// and that every key that section's table lists is one the code builds.
// A key family that exists only in code is storage that nobody outside the
// code can read or repair.
func TestReferenceNamesEveryRedisKeyFamily(t *testing.T) {
	doc := readReference(t)
	sec := section(t, doc, redisSection)
	families := keyFamilies(t)
	if len(families) < 20 {
		t.Fatalf("found %d key families in meta.Keys; the reflection scan is broken", len(families))
	}
	for _, m := range undocumented(families, spanShapes(sec, redisBase)) {
		t.Errorf("meta.Keys.%s builds %q, which %s, %q does not name", m, families[m], reference, redisSection)
	}
	known := valueSet(families)
	for _, key := range tableColumn(t, sec, "key") {
		if !known[shape(strings.TrimPrefix(key, redisBase))] {
			t.Errorf("%s, %q lists key %q, which no meta.Keys method builds", reference, redisSection, key)
		}
	}
}

// TestEveryRedisKeyHasABuilder checks that meta builds no key outside
// meta.Keys' methods: every string literal appended to the key prefix
// (x.base + "...") in meta's code starts a family that a method builds, so
// that the reflection scan above sees every key.
func TestEveryRedisKeyHasABuilder(t *testing.T) {
	families := keyFamilies(t)
	lits := baseLiterals(t, filepath.Join("..", "meta"))
	if len(lits) < 20 {
		t.Fatalf("found %d key literals in meta; the source scan is broken", len(lits))
	}
	for _, lit := range lits {
		ok := false
		for _, f := range families {
			if strings.HasPrefix(f, shape(lit.value)) {
				ok = true
				break
			}
		}
		if !ok {
			t.Errorf("%s: key %q is built from the prefix without a meta.Keys method", lit.pos, lit.value)
		}
	}
}

// TestReferenceNamesEveryObjectKind checks that every kind of object that
// a path builder of sink names (exported functions returning one string
// whose name holds Path or Dir, found by parsing sink) appears in the
// Bucket layout section, and that every name that section's table lists is
// one a builder makes.
func TestReferenceNamesEveryObjectKind(t *testing.T) {
	doc := readReference(t)
	sec := section(t, doc, bucketSection)
	kinds := objectKinds(t)
	for _, b := range undocumented(kinds, spanShapes(sec, "")) {
		t.Errorf("sink.%s names %q, which %s, %q does not name", b, kinds[b], reference, bucketSection)
	}
	known := valueSet(kinds)
	for _, name := range tableColumn(t, sec, "name") {
		if !known[shape(name)] {
			t.Errorf("%s, %q lists object %q, which no sink path builder names", reference, bucketSection, name)
		}
	}
}

// TestUndocumentedIsFound checks the checks themselves: with the owner key
// and the data object taken out of the reference, they must be reported.
// A checker that matched everything would pass the tests above on any
// reference.
func TestUndocumentedIsFound(t *testing.T) {
	doc := readReference(t)
	redis := strings.ReplaceAll(section(t, doc, redisSection), "`owner`", "`(removed)`")
	if got := undocumented(keyFamilies(t), spanShapes(redis, redisBase)); !slices.Equal(got, []string{"Owner"}) {
		t.Errorf("undocumented key families with owner removed = %v, want [Owner]", got)
	}
	bucket := section(t, doc, bucketSection)
	var kept []string
	for _, line := range strings.Split(bucket, "\n") {
		if !strings.Contains(line, "-<flow_id>-<cycle_id>.log`") {
			kept = append(kept, line)
		}
	}
	if got := undocumented(objectKinds(t), spanShapes(strings.Join(kept, "\n"), "")); !slices.Equal(got, []string{"DataPath"}) {
		t.Errorf("undocumented object kinds with the data object removed = %v, want [DataPath]", got)
	}
}

// TestCitedSectionsExist checks that every citation of a docs page by
// section in the code, `docs/<PAGE>.md, "<Title>"` (in a comment or a string,
// also across comment lines), names a heading that page has. Code comments
// point readers there for the reason behind a rule: a renamed section must
// not leave them pointing at nothing.
func TestCitedSectionsExist(t *testing.T) {
	headings := map[string]map[string]bool{}
	pages, err := filepath.Glob("*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("list the docs pages: %v (found %d)", err, len(pages))
	}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		headings[page] = map[string]bool{}
		for _, line := range strings.Split(string(b), "\n") {
			if title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
				headings[page][strings.TrimSpace(title)] = true
			}
		}
	}
	cites := 0
	err = filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".proto") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text := commentBreakRE.ReplaceAllString(string(b), " ")
		for _, m := range citationRE.FindAllStringSubmatch(text, -1) {
			page := m[1] + ".md"
			for _, q := range titleRE.FindAllStringSubmatch(m[2], -1) {
				cites++
				if headings[page] == nil {
					t.Errorf("%s cites docs/%s, which does not exist", path, page)
				} else if !headings[page][q[1]] {
					t.Errorf("%s cites docs/%s, %q, which is not a heading there", path, page, q[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cites < 40 {
		t.Fatalf("found %d section citations in the code; the scan is broken", cites)
	}
}

var (
	// commentBreakRE joins a comment's lines, so that a citation broken
	// over two lines reads as one.
	commentBreakRE = regexp.MustCompile(`\s*\n\s*//\s*`)
	// citationRE matches docs/PAGE.md, followed by one or more quoted
	// titles separated by ",", ";" or "and"; quotes may be escaped (a Go
	// string).
	citationRE = regexp.MustCompile(`docs/([A-Z_]+)\.md,\s*((?:\\?"[^"\\]+\\?"(?:\s*(?:,|;|and)\s*)?)+)`)
	titleRE    = regexp.MustCompile(`\\?"([^"\\]+)\\?"`)
)

func readReference(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(reference)
	if err != nil {
		t.Fatalf("read the reference: %v", err)
	}
	return string(b)
}

// section returns the text of the "## title" section up to the next "## "
// heading (its "###" subsections included).
func section(t *testing.T, doc, title string) string {
	t.Helper()
	head := "\n## " + title + "\n"
	i := strings.Index(doc, head)
	if i < 0 {
		t.Fatalf("%s has no section %q", reference, title)
	}
	rest := doc[i+len(head):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// spanShapes returns the shapes of the backticked spans of text, each
// without a leading strip. Fenced code blocks are left out: they are
// examples, and their fences would pair backticks across lines.
func spanShapes(text, strip string) map[string]bool {
	out := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range spanRE.FindAllStringSubmatch(line, -1) {
			out[shape(strings.TrimPrefix(m[1], strip))] = true
		}
	}
	return out
}

// undocumented returns, sorted, the builders whose shape is not among
// shapes.
func undocumented(built map[string]string, shapes map[string]bool) []string {
	var out []string
	for name, s := range built {
		if !shapes[s] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func valueSet(m map[string]string) map[string]bool {
	out := make(map[string]bool, len(m))
	for _, v := range m {
		out[v] = true
	}
	return out
}

// tableColumn returns the backticked spans in the column named header of
// every markdown table of text that has one.
func tableColumn(t *testing.T, text, header string) []string {
	t.Helper()
	var out []string
	col := -1
	found := false
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "|") {
			col = -1
			continue
		}
		// A \| inside a cell is part of it, not a column break.
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|")
		if col < 0 {
			col = slices.IndexFunc(cells, func(c string) bool { return strings.TrimSpace(c) == header })
			found = found || col >= 0
			continue
		}
		if col >= len(cells) {
			continue
		}
		for _, m := range spanRE.FindAllStringSubmatch(cells[col], -1) {
			out = append(out, strings.ReplaceAll(m[1], "\x00", "|"))
		}
	}
	if !found {
		t.Fatalf("%s: no table with a %q column", reference, header)
	}
	return out
}

// keyFamilies calls every exported method of meta.Keys but Base with
// sample arguments and returns each one's key shape, without the prefix,
// by method name.
func keyFamilies(t *testing.T) map[string]string {
	t.Helper()
	k := meta.NewKeys(samplePrefix)
	v := reflect.ValueOf(k)
	out := map[string]string{}
methods:
	for i := range v.NumMethod() {
		m := v.Type().Method(i)
		if m.Name == "Base" {
			continue
		}
		fn := v.Method(i)
		ft := fn.Type()
		if ft.NumOut() != 1 || ft.Out(0).Kind() != reflect.String {
			t.Errorf("meta.Keys.%s does not return one string: this test cannot check it", m.Name)
			continue
		}
		args := make([]reflect.Value, ft.NumIn())
		for j := range args {
			a, ok := sampleArg(ft.In(j))
			if !ok {
				t.Errorf("meta.Keys.%s: parameter %d of type %s has no sample value in this test", m.Name, j, ft.In(j))
				continue methods
			}
			args[j] = a
		}
		key := fn.Call(args)[0].String()
		rest, ok := strings.CutPrefix(key, k.Base())
		if !ok {
			t.Errorf("meta.Keys.%s builds %q, outside the prefix %q", m.Name, key, k.Base())
			continue
		}
		out[m.Name] = shape(rest)
	}
	return out
}

func sampleArg(t reflect.Type) (reflect.Value, bool) {
	var v any
	switch t.Kind() {
	case reflect.String:
		v = "<x>"
	case reflect.Uint32:
		v = sampleU32
	case reflect.Uint64:
		v = sampleU64
	case reflect.Int32:
		v = sampleI32
	case reflect.Int64:
		v = sampleI64
	default:
		return reflect.Value{}, false
	}
	return reflect.ValueOf(v).Convert(t), true
}

// objectKinds finds sink's path builders by parsing the package and
// returns the shape of each one's sample name, by function name.
func objectKinds(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range pathBuilders(t, filepath.Join("..", "sink")) {
		sample, ok := objectSamples[name]
		if !ok {
			t.Errorf("sink.%s is a path builder without a sample call in objectSamples: add one, and document the object kind in %s", name, reference)
			continue
		}
		out[name] = shape(sample())
	}
	for name := range objectSamples {
		if _, ok := out[name]; !ok && !t.Failed() {
			t.Errorf("objectSamples has %s, which the scan of sink did not find as a path builder", name)
		}
	}
	return out
}

// pathBuilders returns the exported functions (not methods) of the Go files
// in dir, tests excluded, that return exactly one string and whose name
// holds Path or Dir (DataPath, SnapshotDir, DataPathV2, V2LogDir, ...).
func pathBuilders(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, f := range parseDir(t, dir) {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !fd.Name.IsExported() {
				continue
			}
			if n := fd.Name.Name; !strings.Contains(n, "Path") && !strings.Contains(n, "Dir") {
				continue
			}
			res := fd.Type.Results
			if res == nil || res.NumFields() != 1 {
				continue
			}
			if id, ok := res.List[0].Type.(*ast.Ident); ok && id.Name == "string" {
				out = append(out, fd.Name.Name)
			}
		}
	}
	if len(out) < 5 {
		t.Fatalf("found %d path builders in %s; the source scan is broken", len(out), dir)
	}
	return out
}

type literal struct {
	pos   string
	value string
}

// baseLiterals returns the string literals that the Go files of dir, tests
// excluded, append directly to a key prefix: the "lit" of x.base + "lit".
func baseLiterals(t *testing.T, dir string) []literal {
	t.Helper()
	fset := token.NewFileSet()
	var out []literal
	for _, f := range parseDirSet(t, fset, dir) {
		ast.Inspect(f, func(n ast.Node) bool {
			be, ok := n.(*ast.BinaryExpr)
			if !ok || be.Op != token.ADD {
				return true
			}
			sel, ok := be.X.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "base" {
				return true
			}
			lit, ok := be.Y.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Errorf("%s: %v", fset.Position(lit.Pos()), err)
				return true
			}
			out = append(out, literal{pos: fset.Position(lit.Pos()).String(), value: s})
			return true
		})
	}
	return out
}

func parseDir(t *testing.T, dir string) []*ast.File {
	t.Helper()
	return parseDirSet(t, token.NewFileSet(), dir)
}

func parseDirSet(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(names) == 0 {
		t.Fatalf("list Go files of %s: %v (found %d)", dir, err, len(names))
	}
	var out []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		out = append(out, f)
	}
	return out
}
