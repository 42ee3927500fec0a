package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/flowlog/flowlog/internal/testenv"
)

// lookTool returns the path of a service binary from a Debian package,
// failing the test when it is missing (.ci/run installs them).
func lookTool(t testing.TB, name, pkg string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not on PATH (apt-get install %s): %v", name, pkg, err)
	}
	return bin
}

// freeAddr is a free loopback host:port.
func freeAddr(t testing.TB) string {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// startPushgateway starts prometheus-pushgateway on a free loopback port;
// its address is p.Addr.
func startPushgateway(t testing.TB) *proc {
	t.Helper()
	addr := freeAddr(t)
	p := newProc(t, "pushgateway", lookTool(t, "prometheus-pushgateway", "prometheus-pushgateway"),
		"--web.listen-address="+addr)
	p.ready = waitForHTTP(addr, "/-/ready")
	p.Start()
	return p
}

// repoFile reads a file of the repository (relative to its root).
func repoFile(t testing.TB, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", rel))
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	return b
}

// promConfig is deploy/prometheus.yml made to run here: every scrape and
// rule evaluation each second, the rule file at rules, and each scrape
// job's targets replaced by the loopback address targets gives for the
// job (the compose stack finds the consumers through Docker's DNS).
func promConfig(t testing.TB, rules string, targets map[string]string) []byte {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal(repoFile(t, "deploy/prometheus.yml"), &cfg); err != nil {
		t.Fatalf("deploy/prometheus.yml: %v", err)
	}
	cfg["global"] = map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"}
	cfg["rule_files"] = []any{rules}
	for _, j := range asAnyList(cfg["scrape_configs"]) {
		job, _ := j.(map[string]any)
		name, _ := job["job_name"].(string)
		target, ok := targets[name]
		if !ok {
			t.Fatalf("deploy/prometheus.yml: scrape job %q has no loopback target in the test", name)
		}
		delete(job, "dns_sd_configs")
		job["static_configs"] = []any{map[string]any{"targets": []any{target}}}
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func asAnyList(v any) []any { l, _ := v.([]any); return l }

// durationRE matches a PromQL or rule duration such as 10m, 15m:1m or 1h.
var durationRE = regexp.MustCompile(`\b(\d+)(ms|s|m|h|d)\b`)

// scaleDurations divides every duration in s by k (rounding to whole
// seconds, at least 1s), so that an alert's windows and `for` fit in a test.
func scaleDurations(s string, k int) string {
	unit := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}
	return durationRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := durationRE.FindStringSubmatch(m)
		n, _ := strconv.Atoi(sub[1])
		d := time.Duration(n) * unit[sub[2]] / time.Duration(k)
		return strconv.Itoa(max(1, int(d.Round(time.Second)/time.Second))) + "s"
	})
}

// scaledAlerts is deploy/prometheus/alerts.yml with the windows and `for`
// of each rule in scaled divided by k; the expressions are otherwise
// unchanged.
func scaledAlerts(t testing.TB, k int, scaled ...string) []byte {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(repoFile(t, "deploy/prometheus/alerts.yml"), &doc); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	found := 0
	for _, g := range asAnyList(doc["groups"]) {
		for _, r := range asAnyList(g.(map[string]any)["rules"]) {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			for _, s := range scaled {
				if name != s {
					continue
				}
				found++
				rule["expr"] = scaleDurations(rule["expr"].(string), k)
				if f, ok := rule["for"].(string); ok {
					rule["for"] = scaleDurations(f, k)
				}
			}
		}
	}
	if found != len(scaled) {
		t.Fatalf("alerts.yml: found %d of the alerts %v", found, scaled)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startPrometheus starts prometheus with config and the rule file rules
// (written next to it as alerts.yml) on a free loopback port; its address
// is p.Addr.
func startPrometheus(t testing.TB, rules []byte, targets func(self string) map[string]string) *proc {
	t.Helper()
	dir := t.TempDir()
	addr := freeAddr(t)
	rulesPath := filepath.Join(dir, "alerts.yml")
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(rulesPath, rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, promConfig(t, rulesPath, targets(addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newProc(t, "prometheus", lookTool(t, "prometheus", "prometheus"),
		"--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	p.ready = waitForHTTP(addr, "/-/ready")
	p.Start()
	return p
}

// promAPI gets path (with query) from the Prometheus HTTP API at addr and
// decodes its data into v; an "error" status is returned as an error.
func promAPI(addr, path string, query url.Values, v any) error {
	cl := &http.Client{Timeout: 10 * time.Second}
	resp, err := cl.Get("http://" + addr + path + "?" + query.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: decode: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, body.ErrorType, body.Error)
	}
	return json.Unmarshal(body.Data, v)
}

// promQuery runs an instant query and returns the number of series of its
// result (a scalar or string result counts as one).
func promQuery(addr, expr string) (int, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := promAPI(addr, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return 0, err
	}
	if data.ResultType == "scalar" || data.ResultType == "string" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(data.Result, &series); err != nil {
		return 0, fmt.Errorf("result of %q: %w", expr, err)
	}
	return len(series), nil
}

// promAlertState is the state of alert name in Prometheus's
// /api/v1/alerts: "firing", "pending" or "" (inactive).
func promAlertState(addr, name string) (string, error) {
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := promAPI(addr, "/api/v1/alerts", nil, &data); err != nil {
		return "", err
	}
	state := ""
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == name && (state == "" || a.State == "firing") {
			state = a.State
		}
	}
	return state, nil
}

// grafanaExpr is a dashboard expression with Grafana's variables as
// Grafana would send them here: every flow, and a rate interval of a few
// 1 s scrapes.
func grafanaExpr(expr string) string {
	return strings.NewReplacer("$__rate_interval", "20s", "${flow}", ".*", "$flow", ".*").Replace(expr)
}

// dashboardPanels returns every PromQL expression of every panel of every
// dashboard in deploy/grafana/dashboards, by "file: panel title #n".
func dashboardPanels(t testing.TB) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "deploy", "grafana", "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards (%v)", err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	out := map[string]string{}
	for _, f := range files {
		var d struct {
			Panels []json.RawMessage `json:"panels"`
		}
		if err := json.Unmarshal(repoFile(t, filepath.Join("deploy", "grafana", "dashboards", filepath.Base(f))), &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var walk func([]json.RawMessage)
		walk = func(ps []json.RawMessage) {
			for _, raw := range ps {
				var p panel
				if err := json.Unmarshal(raw, &p); err != nil {
					t.Fatalf("%s: panel: %v", f, err)
				}
				for i, tg := range p.Targets {
					if tg.Expr != "" {
						out[fmt.Sprintf("%s: %s #%d", filepath.Base(f), p.Title, i+1)] = tg.Expr
					}
				}
				walk(p.Panels)
			}
		}
		walk(d.Panels)
	}
	return out
}
