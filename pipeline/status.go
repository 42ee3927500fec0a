package pipeline

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// CycleStatus describes the last committed flush cycle.
type CycleStatus struct {
	ID       string    `json:"id,omitempty"`
	Trigger  string    `json:"trigger,omitempty"`
	Files    int       `json:"files"`
	Bytes    int64     `json:"bytes"`
	Flows    int       `json:"flows"`
	Finished time.Time `json:"finished,omitempty"`
	Duration float64   `json:"duration_seconds"`
}

// PartitionStatus is one assigned apply partition.
type PartitionStatus struct {
	Partition     int32 `json:"partition"`
	LeaseEpoch    int64 `json:"lease_epoch"`
	Next          int64 `json:"next_offset"`
	HighWatermark int64 `json:"high_watermark"`
	Lag           int64 `json:"lag"`
	Regions       int   `json:"regions"`
}

// FlowStatus is one flow as this instance sees it.
type FlowStatus struct {
	ID      uint32   `json:"id"`
	Catalog string   `json:"catalog"`
	Name    string   `json:"name"`
	Tables  []uint32 `json:"tables"`
	Fatal   bool     `json:"fatal"`
	// Windows are the tables' current coverage windows; absent
	// while they are being established or when Redis did not answer.
	Windows []meta.Window `json:"windows,omitempty"`
	// SnapshotTS is the ts of the newest listed snapshot and
	// TruncatedBefore the truncation point; 0 for none or when
	// Redis did not answer. `consumer flows` also shows the log bytes
	// after the snapshot, which takes reading the metas from GCS.
	SnapshotTS      uint64 `json:"snapshot_ts"`
	TruncatedBefore uint64 `json:"truncated_before"`
}

// Status is the /status document.
type Status struct {
	Running bool `json:"running"`
	// Stopped is why the consumer stopped for good while the process
	// runs: Redis lost the prefix's state (Consumer.OwnerLost).
	Stopped        string            `json:"stopped,omitempty"`
	Paused         bool              `json:"fetching_paused"`
	Partitions     []PartitionStatus `json:"partitions"`
	Flows          []FlowStatus      `json:"flows"`
	TempBytes      int64             `json:"temp_bytes"`
	InflightBytes  int64             `json:"inflight_bytes"`
	InflightCycles int               `json:"inflight_cycles"`
	LastCycle      CycleStatus       `json:"last_cycle"`
	// TSAheadSeconds is how far the newest ts accepted in the last cycle
	// lay ahead of this consumer's clock (ts_ahead_seconds): a producer
	// clock running ahead, by at most --max-clock-skew.
	TSAheadSeconds float64 `json:"ts_ahead_seconds"`
	// MaxClockSkewSeconds is --max-clock-skew.
	MaxClockSkewSeconds float64 `json:"max_clock_skew_seconds"`
}

// Status reports what the consumer holds now. It is safe to call from any
// goroutine.
func (c *Consumer) Status() Status {
	c.mu.Lock()
	s := c.cur
	st := Status{LastCycle: c.lastCyc, TSAheadSeconds: time.Duration(c.tsAhead.Load()).Seconds(),
		MaxClockSkewSeconds: c.cfg.MaxClockSkew.Seconds()}
	if err := c.OwnerLost(); err != nil {
		st.Stopped = err.Error()
	}
	fatal := make(map[uint32]bool, len(c.fatal))
	for id := range c.fatal {
		fatal[id] = true
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, f := range c.d.Registry.Flows() {
		fs := FlowStatus{ID: f.ID, Catalog: f.Info.CatalogName, Name: f.Info.FlowName,
			Tables: f.Info.SourceTableIDs, Fatal: fatal[f.ID]}
		if cur, _, err := c.d.Store.Windows(ctx, f.ID); err == nil {
			for _, t := range slices.Sorted(maps.Keys(cur)) {
				fs.Windows = append(fs.Windows, cur[t])
			}
		}
		if snaps, err := c.d.Store.Snapshots(ctx, f.ID); err == nil && len(snaps) > 0 {
			fs.SnapshotTS = snaps[len(snaps)-1].TS
		}
		fs.TruncatedBefore, _, _ = c.d.Store.TruncatedBefore(ctx, f.ID)
		st.Flows = append(st.Flows, fs)
	}
	if s == nil {
		return st
	}
	st.Running = true
	s.mu.Lock()
	st.Paused = s.paused
	st.TempBytes = s.gen.bytes
	for _, ps := range s.parts {
		lag := int64(0)
		if ps.next >= 0 && ps.hwm > ps.next {
			lag = ps.hwm - ps.next
		}
		st.Partitions = append(st.Partitions, PartitionStatus{Partition: ps.partition, LeaseEpoch: ps.lease.Epoch,
			Next: ps.next, HighWatermark: ps.hwm, Lag: lag, Regions: len(ps.regions)})
	}
	s.mu.Unlock()
	sort.Slice(st.Partitions, func(i, j int) bool { return st.Partitions[i].Partition < st.Partitions[j].Partition })
	st.InflightBytes = s.fl.inflightBytes()
	s.fl.mu.Lock()
	st.InflightCycles = len(s.fl.inflight)
	s.fl.mu.Unlock()
	return st
}

// Stalled returns an error when the consume loop has handled no record for
// --stall-timeout although records wait (a DLQ that refuses, a fatal flow, a
// flush that never ends), and nil otherwise.
func (c *Consumer) Stalled() error {
	if p := c.tempFault.Load(); p != nil {
		return fmt.Errorf("temp files cannot be written (nothing committed since): %w", *p)
	}
	if c.cfg.StallTimeout <= 0 {
		return nil
	}
	since := time.Since(time.Unix(0, c.progress.Load()))
	if since > c.cfg.StallTimeout {
		return fmt.Errorf("consume loop stalled: no record handled for %s while records wait", since.Round(time.Second))
	}
	return nil
}

// Ready reports whether the consumer is in a group session.
func (c *Consumer) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur != nil
}
