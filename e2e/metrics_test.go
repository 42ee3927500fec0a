package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricSet is a /metrics scrape: value by series as exposed
// (`name{l1="v1",l2="v2"}`).
type metricSet map[string]float64

// get sums the series of name that carry every one of labels (`k="v"`) and
// returns the sum and the number of such series.
func (m metricSet) get(name string, labels ...string) (float64, int) {
	sum, n := 0.0, 0
	for series, v := range m {
		base, rest, _ := strings.Cut(series, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains("{"+rest, "{"+l+",") && !strings.Contains("{"+rest, ","+l+",") &&
				!strings.Contains("{"+rest, "{"+l+"}") && !strings.Contains("{"+rest, ","+l+"}") {
				ok = false
				break
			}
		}
		if ok {
			sum += v
			n++
		}
	}
	return sum, n
}

// scrapeMetrics scrapes the /metrics of the consumer at base
// ("http://host:port"), failing the test if it cannot.
func scrapeMetrics(t testing.TB, base string) metricSet {
	t.Helper()
	m, err := scrapeMetricsWith(&http.Client{Timeout: 5 * time.Second}, base)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return m
}

// scrapeMetricsWith scrapes the /metrics of the consumer at base with cl.
func scrapeMetricsWith(cl *http.Client, base string) (metricSet, error) {
	resp, err := cl.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	m := metricSet{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}
