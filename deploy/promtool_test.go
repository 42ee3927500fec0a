package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// promtool returns the path of promtool (Debian package prometheus),
// failing the test when it is missing: .ci/run installs it.
func promtool(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not on PATH (apt-get install prometheus): %v", err)
	}
	return bin
}

// ruleTests are the unit test files of alerts.yml, in deploy/prometheus.
var ruleTests = []string{"alerts_test.yml", "alerts_retention_test.yml"}

// alertRule is one rule of alerts.yml.
type alertRule struct{ name, expr string }

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var out []alertRule
	for _, g := range asList(readYAML(t, "deploy/prometheus/alerts.yml")["groups"]) {
		for _, r := range asList(asMap(g)["rules"]) {
			if name := asString(asMap(r)["alert"]); name != "" {
				out = append(out, alertRule{name, asString(asMap(r)["expr"])})
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("alerts.yml: no alert rules")
	}
	return out
}

// TestPromtoolRules runs `promtool check rules` on alerts.yml and `promtool
// test rules` on its unit tests.
func TestPromtoolRules(t *testing.T) {
	bin := promtool(t)
	dir := filepath.Join(repoRoot, "deploy", "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, append([]string{"test", "rules"}, ruleTests...)} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestEveryAlertHasUnitTests: each alert of alerts.yml has a unit test in
// which it fires and one in which it stays silent, and those tests decide:
// with every alert's expression replaced by one that never fires, each
// firing test fails, and with one that always fires, each silent test
// fails.
func TestEveryAlertHasUnitTests(t *testing.T) {
	bin := promtool(t)
	fires, silent := map[string][]string{}, map[string][]string{} // alert -> test names
	tests := map[string][]byte{}
	for _, file := range ruleTests {
		for _, tc := range asList(readYAML(t, "deploy/prometheus/"+file)["tests"]) {
			name := asString(asMap(tc)["name"])
			for _, a := range asList(asMap(tc)["alert_rule_test"]) {
				alert := asString(asMap(a)["alertname"])
				if len(asList(asMap(a)["exp_alerts"])) > 0 {
					fires[alert] = append(fires[alert], name)
				} else {
					silent[alert] = append(silent[alert], name)
				}
			}
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", file))
		if err != nil {
			t.Fatal(err)
		}
		tests[file] = b
	}
	rules := alertRules(t)
	for _, r := range rules {
		if len(fires[r.name]) == 0 {
			t.Errorf("alert %s: no unit test in which it fires", r.name)
		}
		if len(silent[r.name]) == 0 {
			t.Errorf("alert %s: no unit test in which it stays silent", r.name)
		}
	}

	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	exprLine := regexp.MustCompile(`(?m)^(\s+expr:) .*$`)
	for _, m := range []struct {
		name, expr string
		mustFail   map[string][]string
	}{
		{"never fires", "vector(1) < 0", fires},
		{"always fires", "vector(1)", silent},
	} {
		t.Run(m.name, func(t *testing.T) {
			dir := t.TempDir()
			mutated := exprLine.ReplaceAllString(string(raw), "$1 "+m.expr)
			if err := os.WriteFile(filepath.Join(dir, "alerts.yml"), []byte(mutated), 0o644); err != nil {
				t.Fatal(err)
			}
			for file, b := range tests {
				if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(bin, append([]string{"test", "rules"}, ruleTests...)...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("promtool test rules passed with every alert's expr set to %q", m.expr)
			}
			for _, r := range rules {
				for _, name := range m.mustFail[r.name] {
					if !strings.Contains(string(out), "name: "+name+",") {
						t.Errorf("with every expr %q, unit test %q still passes", m.expr, name)
					}
				}
			}
		})
	}
}
