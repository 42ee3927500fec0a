package pipeline_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowlog/flowlog/pipeline"
)

// TestMaxTempBytesExported: --max-temp-bytes is a gauge, so alerts can use
// the ratio temp_bytes / max_temp_bytes.
func TestMaxTempBytesExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := idleConfig(t.TempDir())
	cfg.MaxTempBytes = 3 << 30
	if _, err := pipeline.New(cfg, pipeline.Deps{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "flowlog_max_temp_bytes" {
			if got := mf.GetMetric()[0].GetGauge().GetValue(); got != 3<<30 {
				t.Errorf("flowlog_max_temp_bytes = %v, want %v", got, 3<<30)
			}
			return
		}
	}
	t.Error("flowlog_max_temp_bytes not registered")
}
