package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// coreMetrics are the series the dashboard, the alerts and the operator
// docs' metrics list are built on (histograms by a series of theirs). The
// source scan must find them all, or it is broken.
var coreMetrics = []string{
	"flowlog_events_total", "flowlog_batch_handle_seconds_bucket", "flowlog_tempfile_write_seconds_bucket",
	"flowlog_temp_bytes", "flowlog_flush_duration_seconds_bucket", "flowlog_flush_object_bytes_bucket",
	"flowlog_flush_failures_total", "flowlog_flow_fatal", "flowlog_checkpoint_ts",
	"flowlog_checkpoint_lag_seconds", "flowlog_ddl_applied_total", "flowlog_redis_txn_retries_total",
	"flowlog_dlq_records_total", "flowlog_consumer_lag_records",
}

func TestSourceMetrics(t *testing.T) {
	names := sourceMetrics(t)
	for _, want := range coreMetrics {
		if !names[want] {
			t.Errorf("core metric %s not found in the source", want)
		}
	}
	for n := range names {
		if !strings.HasPrefix(n, "flowlog_") {
			t.Errorf("metric %s lacks the flowlog_ prefix", n)
		}
	}
	lib := libraryMetrics(t)
	for _, want := range []string{"flowlog_connects_total", "go_goroutines", "process_resident_memory_bytes"} {
		if !lib[want] {
			t.Errorf("library metric %s not registered (kprom or runtime collectors changed?)", want)
		}
	}
}

func TestMetricNames(t *testing.T) {
	known := map[string]bool{"flowlog_events_total": true, "flowlog_flush_duration_seconds_bucket": true, "up": true}
	for _, tc := range []struct {
		name, expr string
		want       []string // metric names selected
		unknown    []string
	}{
		{"rate", `sum by (result, reason) (rate(flowlog_events_total[$__rate_interval]))`,
			[]string{"flowlog_events_total"}, nil},
		{"bogus", `rate(flowlog_bogus_total[5m])`, []string{"flowlog_bogus_total"}, []string{"flowlog_bogus_total"}},
		{"histogram", `histogram_quantile(0.99, sum(rate(flowlog_flush_duration_seconds_bucket{stage="total"}[5m])) by (le, stage))`,
			[]string{"flowlog_flush_duration_seconds_bucket"}, nil},
		{"matchers are not metrics", `flowlog_events_total{result="dlq", reason=~"not_a_metric|x"} offset 5m`,
			[]string{"flowlog_events_total"}, nil},
		{"binary ops", `up{job="flowlog-consumer"} == bool 0 and on(instance) flowlog_nope unless ignoring (flow) up`,
			[]string{"up", "flowlog_nope", "up"}, []string{"flowlog_nope"}},
		{"subquery and grafana vars", `deriv(sum(flowlog_events_total{flow=~"$flow"})[15m:1m]) > 1e6 * ${factor}`,
			[]string{"flowlog_events_total"}, nil},
		{"aggregation with grouping first", `max without (instance) (flowlog_typo)`, []string{"flowlog_typo"}, []string{"flowlog_typo"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
				t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
			}
			if got := unknownMetrics(tc.expr, known); !slices.Equal(got, tc.unknown) {
				t.Errorf("unknownMetrics(%q) = %q, want %q", tc.expr, got, tc.unknown)
			}
		})
	}
}

// dashboard is the parts of the Grafana dashboard JSON the tests read.
type dashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Datasource json.RawMessage `json:"datasource"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []panelTarget  `json:"targets"`
	Panels     []panel        `json:"panels"`
}

type panelTarget struct {
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy/grafana/dashboards/flowlog.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	return d
}

// dashboardExprs returns every PromQL expression of the dashboard, named by
// where it is.
func dashboardExprs(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, tg := range p.Targets {
				out[p.Title+"#"+string(rune('A'+i))] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		var q string
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var obj struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				t.Fatalf("variable %s: query: %v", v.Name, err)
			}
			q = obj.Query
		}
		out["variable "+v.Name] = templateExpr(q)
	}
	return out
}

func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	known := exportedMetrics(t)
	exprs := dashboardExprs(t, d)
	used := map[string]bool{}
	for where, expr := range exprs {
		t.Run(where, func(t *testing.T) {
			if strings.TrimSpace(expr) == "" && !strings.HasPrefix(where, "variable ") {
				t.Fatal("empty expression")
			}
			for _, n := range metricNames(expr) {
				used[n] = true
			}
			if u := unknownMetrics(expr, known); len(u) > 0 {
				t.Errorf("%q queries metrics the code does not export: %v", expr, u)
			}
		})
	}
	for _, want := range []string{
		"flowlog_events_total", "flowlog_consumer_lag_records", "flowlog_temp_bytes",
		"flowlog_flush_duration_seconds_bucket", "flowlog_checkpoint_lag_seconds",
		"flowlog_flow_fatal", "flowlog_dlq_records_total", "flowlog_ddl_applied_total",
	} {
		if !used[want] {
			t.Errorf("no dashboard panel shows %s", want)
		}
	}
	uid := provisionedDatasourceUID(t)
	var check func(ps []panel)
	check = func(ps []panel) {
		for _, p := range ps {
			if p.Type != "row" && (p.Datasource == nil || p.Datasource.UID != uid) {
				t.Errorf("panel %q: datasource %+v, want uid %q", p.Title, p.Datasource, uid)
			}
			for _, tg := range p.Targets {
				if tg.Datasource != nil && tg.Datasource.UID != uid {
					t.Errorf("panel %q: target datasource uid %q, want %q", p.Title, tg.Datasource.UID, uid)
				}
			}
			check(p.Panels)
		}
	}
	check(d.Panels)
}

// provisionedDatasourceUID returns the uid of the provisioned Prometheus
// datasource, checking that it points at the compose service.
func provisionedDatasourceUID(t *testing.T) string {
	t.Helper()
	c := readYAML(t, "deploy/grafana/provisioning/datasources/prometheus.yml")
	for _, v := range asList(c["datasources"]) {
		ds := asMap(v)
		if asString(ds["type"]) == "prometheus" {
			if u := asString(ds["url"]); u != "http://prometheus:9090" {
				t.Errorf("datasource url %q, want the compose service http://prometheus:9090", u)
			}
			return asString(ds["uid"])
		}
	}
	t.Fatal("no prometheus datasource provisioned")
	return ""
}

func TestGrafanaProvisioning(t *testing.T) {
	compose, svcs := composeServices(t)
	mounts := bindMounts(t, compose, asMap(svcs["grafana"]))
	if mounts["./deploy/grafana/provisioning"] != "/etc/grafana/provisioning" {
		t.Errorf("grafana: provisioning not mounted at /etc/grafana/provisioning: %v", mounts)
	}
	c := readYAML(t, "deploy/grafana/provisioning/dashboards/flowlog.yml")
	providers := asList(c["providers"])
	if len(providers) == 0 {
		t.Fatal("no dashboard provider")
	}
	path := asString(asMap(asMap(providers[0])["options"])["path"])
	host := ""
	for src, dst := range mounts {
		if dst == path {
			host = src
		}
	}
	if host == "" {
		t.Fatalf("dashboard provider path %s is not a mount of the grafana service (%v)", path, mounts)
	}
	if _, err := os.Stat(filepath.Join(repoRoot, host, "flowlog.json")); err != nil {
		t.Errorf("dashboard provider path %s -> %s: %v", path, host, err)
	}
}

func TestPrometheusConfig(t *testing.T) {
	compose, svcs := composeServices(t)
	mounts := bindMounts(t, compose, asMap(svcs["prometheus"]))
	hostOf := map[string]string{}
	for src, dst := range mounts {
		hostOf[dst] = src
	}
	if hostOf["/etc/prometheus/prometheus.yml"] != "./deploy/prometheus.yml" {
		t.Errorf("prometheus: deploy/prometheus.yml not mounted as its config: %v", mounts)
	}
	c := readYAML(t, "deploy/prometheus.yml")
	rules := asList(c["rule_files"])
	if len(rules) == 0 {
		t.Error("prometheus.yml loads no rule files")
	}
	known := exportedMetrics(t)
	for _, r := range rules {
		host, ok := hostOf[asString(r)]
		if !ok {
			t.Errorf("rule file %s is not mounted into the prometheus service", r)
			continue
		}
		checkAlerts(t, strings.TrimPrefix(host, "./"), known)
	}
	scrapesConsumers := false
	for _, v := range asList(c["scrape_configs"]) {
		for _, sd := range asList(asMap(v)["dns_sd_configs"]) {
			m := asMap(sd)
			if slices.Contains(asList(m["names"]), any("consumer")) && m["port"] == 8080 {
				scrapesConsumers = true
			}
		}
	}
	if !scrapesConsumers {
		t.Error("prometheus.yml: no dns_sd_configs of the consumer service on port 8080")
	}
}

// checkAlerts checks that every rule of an alert file has a name and an
// expression whose metrics are all known.
func checkAlerts(t *testing.T, path string, known map[string]bool) {
	t.Helper()
	c := readYAML(t, path)
	n := 0
	for _, g := range asList(c["groups"]) {
		for _, r := range asList(asMap(g)["rules"]) {
			rule := asMap(r)
			name, expr := asString(rule["alert"])+asString(rule["record"]), asString(rule["expr"])
			n++
			t.Run(name, func(t *testing.T) {
				if name == "" || expr == "" {
					t.Fatalf("%s: rule %v lacks a name or an expression", path, rule)
				}
				if len(metricNames(expr)) == 0 {
					t.Errorf("%q selects no metric", expr)
				}
				if u := unknownMetrics(expr, known); len(u) > 0 {
					t.Errorf("%q queries metrics the code does not export: %v", expr, u)
				}
			})
		}
	}
	if n == 0 {
		t.Errorf("%s: no rules", path)
	}
}
