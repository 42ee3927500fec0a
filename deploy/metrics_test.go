package deploy_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"
)

// repoRoot is the module root, relative to this package's directory.
const repoRoot = ".."

// promBuiltins are series Prometheus itself writes for every target or rule.
var promBuiltins = []string{
	"up", "scrape_duration_seconds", "scrape_samples_scraped",
	"scrape_samples_post_metric_relabeling", "scrape_series_added", "ALERTS", "ALERTS_FOR_STATE",
}

// sourceMetrics returns the names of every metric the repository's non-test
// Go code defines through prometheus.{Counter,Gauge,Histogram,Summary}Opts
// literals, with the _bucket/_sum/_count series of histograms and summaries.
// An Opts literal whose name cannot be resolved to a constant fails the test,
// so a metric cannot slip past the scan.
func sourceMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			base := d.Name()
			if path != repoRoot && (strings.HasPrefix(base, ".") || base == "testdata" || base == "vendor" || base == "deploy") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		for _, n := range fileMetrics(t, path) {
			names[n] = true
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", repoRoot, err)
	}
	return names
}

// fileMetrics returns the metric series names defined in one Go file.
func fileMetrics(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	consts := map[string]string{} // string constants anywhere in the file
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			for i, id := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := stringLit(vs.Values[i]); ok {
						consts[id.Name] = s
					}
				}
			}
		}
		return true
	})
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		sel, ok := lit.Type.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		if !ok || pkg.Name != "prometheus" {
			return true
		}
		kind := strings.TrimSuffix(sel.Sel.Name, "Opts")
		if kind != "Counter" && kind != "Gauge" && kind != "Histogram" && kind != "Summary" {
			return true
		}
		parts := map[string]string{}
		for _, el := range lit.Elts {
			kv, ok := el.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			key, ok := kv.Key.(*ast.Ident)
			if !ok || (key.Name != "Namespace" && key.Name != "Subsystem" && key.Name != "Name") {
				continue
			}
			v, ok := stringLit(kv.Value)
			if !ok {
				if id, isID := kv.Value.(*ast.Ident); isID {
					v, ok = consts[id.Name]
				}
			}
			if !ok {
				t.Errorf("%s: %s.%s of prometheus.%sOpts is not a string constant", path, kind, key.Name, kind)
				return true
			}
			parts[key.Name] = v
		}
		if parts["Name"] == "" {
			t.Errorf("%s: prometheus.%sOpts without a Name", path, kind)
			return true
		}
		var fq []string
		for _, k := range []string{"Namespace", "Subsystem", "Name"} {
			if parts[k] != "" {
				fq = append(fq, parts[k])
			}
		}
		out = append(out, seriesNames(strings.Join(fq, "_"), kind)...)
		return true
	})
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(bl.Value)
	return s, err == nil
}

// seriesNames returns the series a metric of kind exposes.
func seriesNames(name, kind string) []string {
	switch kind {
	case "Histogram":
		return []string{name, name + "_bucket", name + "_sum", name + "_count"}
	case "Summary":
		return []string{name, name + "_sum", name + "_count"}
	}
	return []string{name}
}

// recorder is a prometheus.Registerer that records the names of what is
// registered on it instead of collecting anything.
type recorder struct{ names map[string]bool }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	kind := ""
	switch m := c.(type) {
	case *prometheus.HistogramVec:
		kind = "Histogram"
	case *prometheus.SummaryVec:
		kind = "Summary"
	case prometheus.Metric: // a plain histogram or summary: ask the metric itself
		var pb dto.Metric
		if err := m.Write(&pb); err == nil {
			switch {
			case pb.Histogram != nil:
				kind = "Histogram"
			case pb.Summary != nil:
				kind = "Summary"
			}
		}
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			for _, n := range seriesNames(m[1], kind) {
				r.names[n] = true
			}
		}
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// libraryMetrics returns the names registered by what the consumer adds to
// its registry besides its own metrics: the Go and process collectors and
// franz-go's kprom plugin, configured as cmd/consumer/run.go does.
func libraryMetrics(t *testing.T) map[string]bool {
	t.Helper()
	rec := &recorder{names: map[string]bool{}}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	kmetrics := kprom.NewMetrics("flowlog", kprom.Registerer(rec), kprom.Gatherer(prometheus.NewRegistry()))
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.WithHooks(kmetrics))
	if err != nil {
		t.Fatalf("kafka client for kprom: %v", err)
	}
	cl.Close()
	return rec.names
}

// exportedMetrics is every series name the consumer can expose, plus the
// series Prometheus adds itself.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := sourceMetrics(t)
	for n := range libraryMetrics(t) {
		names[n] = true
	}
	for _, n := range promBuiltins {
		names[n] = true
	}
	return names
}

// PromQL words that are not metric names when not followed by '('.
var promKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true,
}

var promAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// metricNames returns the metric names a PromQL expression selects. It is a
// small lexer, not a parser: it skips strings, label matchers, range and
// subquery brackets, Grafana variables, numbers, function calls, keywords
// and the label lists of by/without/on/ignoring/group_left/group_right.
func metricNames(expr string) []string {
	var names []string
	s := expr
	i := 0
	isIdent := func(c byte, first bool) bool {
		return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
	}
	skipSpace := func(j int) int {
		for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r') {
			j++
		}
		return j
	}
	// closing returns the index after the bracket matching s[j], skipping strings.
	closing := func(j int, open, close byte) int {
		depth := 0
		for ; j < len(s); j++ {
			switch c := s[j]; {
			case c == '"' || c == '\'' || c == '`':
				j = endOfString(s, j) - 1
			case c == open:
				depth++
			case c == close:
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(s)
	}
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = endOfString(s, i)
		case c == '{':
			i = closing(i, '{', '}')
		case c == '[':
			i = closing(i, '[', ']')
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				i = closing(i, '{', '}')
			}
			for i < len(s) && isIdent(s[i], false) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i], false) || s[i] == '.') {
				i++
			}
		case isIdent(c, true):
			j := i
			for j < len(s) && isIdent(s[j], false) {
				j++
			}
			word := s[i:j]
			i = j
			next := skipSpace(j)
			switch lw := strings.ToLower(word); {
			case promKeywords[lw]:
				if lw == "offset" {
					for next < len(s) && (isIdent(s[next], false) || s[next] == '-') {
						next++
					}
					i = next
				} else if next < len(s) && s[next] == '(' && lw != "and" && lw != "or" && lw != "unless" && lw != "bool" {
					i = closing(next, '(', ')')
				}
			case next < len(s) && s[next] == '(':
				// a function call or an aggregation
			case promAggregations[lw] && (strings.HasPrefix(s[next:], "by") || strings.HasPrefix(s[next:], "without")):
				// an aggregation with its grouping first
			default:
				names = append(names, word)
			}
		default:
			i++
		}
	}
	return names
}

// endOfString returns the index after the string literal starting at s[j].
func endOfString(s string, j int) int {
	q := s[j]
	for k := j + 1; k < len(s); k++ {
		if s[k] == '\\' && q != '`' {
			k++
			continue
		}
		if s[k] == q {
			return k + 1
		}
	}
	return len(s)
}

// templateExpr returns the PromQL inside a Grafana variable query:
// label_values(expr, label) -> expr; label_values(label) and other helpers
// with no selector -> "".
func templateExpr(q string) string {
	q = strings.TrimSpace(q)
	if inner, ok := strings.CutPrefix(q, "label_values("); ok {
		inner = strings.TrimSuffix(inner, ")")
		if k := strings.LastIndex(inner, ","); k >= 0 {
			return inner[:k]
		}
		return ""
	}
	if inner, ok := strings.CutPrefix(q, "query_result("); ok {
		return strings.TrimSuffix(inner, ")")
	}
	if strings.HasPrefix(q, "label_names(") || strings.HasPrefix(q, "metrics(") {
		return ""
	}
	return q
}

// unknownMetrics returns the metric names of expr that known lacks.
func unknownMetrics(expr string, known map[string]bool) []string {
	var out []string
	for _, n := range metricNames(expr) {
		if !known[n] {
			out = append(out, n)
		}
	}
	return out
}
