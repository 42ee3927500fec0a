package deploy_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/flowlog/flowlog/internal/cli"
)

// TestComposeConsumerLimits: the consumer replicas run with a memory limit
// of their --max-memory plus 32 MiB (the sizing rule of docs/SIZING.md,
// "Sizing per MB/s of input: the measurements"), both set, and their
// health check asks /readyz, which fails while Kafka, Redis or GCS is
// unreachable, not /healthz, which only says the process runs.
func TestComposeConsumerLimits(t *testing.T) {
	_, svcs := composeServices(t)
	cons := asMap(svcs["consumer"])
	maxMem := scalar(asMap(cons["environment"])["FLOWLOG_MAX_MEMORY"])
	if maxMem == "" {
		t.Fatal("consumer: FLOWLOG_MAX_MEMORY not set")
	}
	want, err := cli.ParseSize(maxMem)
	if err != nil {
		t.Fatalf("FLOWLOG_MAX_MEMORY=%q: %v", maxMem, err)
	}
	limit := scalar(asMap(asMap(asMap(cons["deploy"])["resources"])["limits"])["memory"])
	got, err := composeBytes(limit)
	if err != nil {
		t.Fatalf("consumer deploy.resources.limits.memory %q: %v", limit, err)
	}
	if got != want+32<<20 {
		t.Errorf("consumer memory limit %q = %d B, want FLOWLOG_MAX_MEMORY (%s) + 32 MiB = %d B", limit, got, maxMem, want+32<<20)
	}
	hc := asList(asMap(cons["healthcheck"])["test"])
	if len(hc) == 0 || !strings.HasSuffix(asString(hc[len(hc)-1]), "/readyz") {
		t.Errorf("consumer health check %v does not ask /readyz", hc)
	}
}

// composeBytes parses a compose byte value ("160M", "1g", "512k", a
// number of bytes): binary units.
func composeBytes(s string) (int64, error) {
	m := regexp.MustCompile(`^(\d+)([bkmg]?)b?$`).FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, strconv.ErrSyntax
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	return n << map[string]uint{"": 0, "b": 0, "k": 10, "m": 20, "g": 30}[m[2]], err
}

// TestComposeRetention: every topic the init job creates has its retention
// set, the retention job runs snapshot, truncate and gc pushing to the
// stack's Pushgateway, and Prometheus scrapes that Pushgateway.
func TestComposeRetention(t *testing.T) {
	_, svcs := composeServices(t)
	init := commandText(asMap(svcs["kafka-init"]))
	creates := 0
	for _, line := range strings.Split(init, "\n") {
		if !strings.Contains(line, "--create") {
			continue
		}
		creates++
		if !regexp.MustCompile(`--config retention\.ms=-?\d+`).MatchString(line) {
			t.Errorf("kafka-init creates a topic without retention.ms: %s", strings.TrimSpace(line))
		}
	}
	if creates == 0 {
		t.Fatal("kafka-init creates no topic")
	}
	ret := asMap(svcs["retention"])
	if ret == nil {
		t.Fatal("no retention service")
	}
	script := commandText(ret)
	for _, cmd := range []string{"/consumer snapshot", "/consumer truncate", "/consumer gc"} {
		if !strings.Contains(script, cmd) {
			t.Errorf("retention job does not run %s", cmd)
		}
	}
	if push := scalar(asMap(ret["environment"])["FLOWLOG_METRICS_PUSH_URL"]); push != "http://pushgateway:9091" {
		t.Errorf("retention job pushes to %q, want http://pushgateway:9091", push)
	}
	if _, ok := svcs["pushgateway"]; !ok {
		t.Error("no pushgateway service")
	}
	found := false
	for _, j := range asList(readYAML(t, "deploy/prometheus.yml")["scrape_configs"]) {
		for _, sc := range asList(asMap(j)["static_configs"]) {
			for _, tg := range asList(asMap(sc)["targets"]) {
				if asString(tg) == "pushgateway:9091" {
					found = true
					if asMap(j)["honor_labels"] != true {
						t.Error("the pushgateway scrape job lacks honor_labels: true (the pushed job and command labels would be overwritten)")
					}
				}
			}
		}
	}
	if !found {
		t.Error("deploy/prometheus.yml does not scrape pushgateway:9091")
	}
}

// scalar renders a YAML scalar of any type as its text.
func scalar(v any) string { return asString(v) + anyScalar(v) }
