package deploy_test

import (
	"slices"
	"testing"
)

// TestTempBytesAlertIsARatio: the temp-bytes alert compares the temp bytes
// with the exported --max-temp-bytes instead of a fixed size, so it stays
// right when an operator changes the flag.
func TestTempBytesAlertIsARatio(t *testing.T) {
	c := readYAML(t, "deploy/prometheus/alerts.yml")
	found := false
	for _, g := range asList(c["groups"]) {
		for _, r := range asList(asMap(g)["rules"]) {
			rule := asMap(r)
			if asString(rule["alert"]) != "FlowlogTempBytesHigh" {
				continue
			}
			found = true
			names := metricNames(asString(rule["expr"]))
			for _, want := range []string{"flowlog_temp_bytes", "flowlog_max_temp_bytes"} {
				if !slices.Contains(names, want) {
					t.Errorf("FlowlogTempBytesHigh %q does not use %s", asString(rule["expr"]), want)
				}
			}
		}
	}
	if !found {
		t.Fatal("no FlowlogTempBytesHigh alert")
	}
	if !exportedMetrics(t)["flowlog_max_temp_bytes"] {
		t.Error("flowlog_max_temp_bytes is not exported")
	}
}
