package pipeline

import "github.com/prometheus/client_golang/prometheus"

// MaxSpares is how many released segment files a running consumer keeps.
const MaxSpares = maxSpares

// SpareName reports whether name is a spare segment file's.
func SpareName(name string) bool { return spareRE.MatchString(name) }

// MetricEventsWritten exposes events_total{result="written"} to tests.
func (c *Consumer) MetricEventsWritten() prometheus.Collector {
	return c.m.events.WithLabelValues(resultWritten, "")
}

// MetricFlowFatal exposes flow_fatal{flow} to tests.
func (c *Consumer) MetricFlowFatal(flow string) prometheus.Collector {
	return c.m.flowFatal.WithLabelValues(flow)
}

// MetricTempWriteErrors exposes temp_write_errors_total to tests.
func (c *Consumer) MetricTempWriteErrors() prometheus.Collector { return c.m.tempWriteErrors }

func (c *Consumer) MetricRedisStateLost() prometheus.Collector { return c.m.ownerLost }

// MetricLateEvents exposes late_events_total to tests.
func (c *Consumer) MetricLateEvents() prometheus.Collector { return c.m.lateEvents }

// MetricEvents is events_total{result, reason}.
func (c *Consumer) MetricEvents(result, reason string) prometheus.Collector {
	return c.m.events.WithLabelValues(result, reason)
}

// MetricCycles is flush_cycles_total{trigger, result}.
func (c *Consumer) MetricCycles(trigger, result string) prometheus.Collector {
	return c.m.cyclesTotal.WithLabelValues(trigger, result)
}

// SetMaxCycleRuns lowers the region runs a cycle's files hold before it
// is frozen, and returns the function that restores it.
func SetMaxCycleRuns(n int) (restore func()) {
	old := maxCycleRuns
	maxCycleRuns = n
	return func() { maxCycleRuns = old }
}
