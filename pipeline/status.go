package pipeline

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
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
	ID      uint32 `json:"id"`
	Catalog string `json:"catalog"`
	Name    string `json:"name"`
	// Tables are the flow's source tables, left out (TableCount only)
	// when there are more than statusMaxTables.
	Tables     []uint32 `json:"tables,omitempty"`
	TableCount int      `json:"table_count"`
	Fatal      bool     `json:"fatal"`
	// Windows are the tables' current coverage windows; absent
	// while they are being established, when the flow has more than
	// statusMaxTables windows (WindowCount still says how many) or when
	// Redis has not answered yet.
	Windows     []meta.Window `json:"windows,omitempty"`
	WindowCount int           `json:"window_count"`
	// SnapshotTS is the ts of the newest listed snapshot and
	// TruncatedBefore the truncation point; 0 for none or when
	// Redis has not answered yet. `consumer flows` also shows the log
	// bytes after the snapshot, which takes reading the metas from GCS.
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
	// FlowsAsOf is when the flows' Redis part (windows, snapshot,
	// truncation point) was read; FlowsError says why it is older than
	// this request, when it is.
	FlowsAsOf  time.Time `json:"flows_as_of,omitzero"`
	FlowsError string    `json:"flows_error,omitempty"`
	// PartitionsAsOf is set when the consume loop was busy for the whole
	// of the request: the partitions are those of that time.
	PartitionsAsOf time.Time `json:"partitions_as_of,omitzero"`
	// Dependencies are the readiness checks of Redis, Kafka and GCS as
	// /readyz last ran them (the HTTP handler fills them in).
	Dependencies []DependencyStatus `json:"dependencies,omitempty"`
	// TSAheadSeconds is how far the newest ts accepted in the last cycle
	// lay ahead of this consumer's clock (ts_ahead_seconds): a producer
	// clock running ahead, by at most --max-clock-skew.
	TSAheadSeconds float64 `json:"ts_ahead_seconds"`
	// MaxClockSkewSeconds is --max-clock-skew.
	MaxClockSkewSeconds float64 `json:"max_clock_skew_seconds"`
}

// statusMaxTables bounds the tables and windows /status lists per flow:
// a flow of 100,000 tables would make every request megabytes.
const statusMaxTables = 1000

// How long Status waits for Redis and for the consume loop before it
// answers from what it read before: within the 1 s a probe gives it.
const (
	statusRedisWait = 500 * time.Millisecond
	statusLockWait  = 200 * time.Millisecond
	statusRedisTime = 5 * time.Second // one read of the flows' Redis part
)

// Status reports what the consumer holds now. It is safe to call from any
// goroutine and returns within statusRedisWait + statusLockWait whatever
// Redis and the consume loop do: the flows' Redis part comes from the
// newest read that finished (statusCache), the partitions from the last
// time the consume loop let go of its state.
func (c *Consumer) Status() Status {
	c.mu.Lock()
	s := c.cur
	st := Status{TSAheadSeconds: time.Duration(c.tsAhead.Load()).Seconds(),
		MaxClockSkewSeconds: c.cfg.MaxClockSkew.Seconds()}
	if err := c.OwnerLost(); err != nil {
		st.Stopped = err.Error()
	}
	c.mu.Unlock()
	if last := c.lastCyc.Load(); last != nil {
		st.LastCycle = *last
	}
	fatal := c.fatal.ids()
	flows := c.d.Registry.Flows()
	sums, asOf, serr := c.status.read(c, flows, statusRedisWait)
	st.FlowsAsOf = asOf
	if serr != nil {
		st.FlowsError = serr.Error()
	}
	for _, f := range flows {
		fs := FlowStatus{ID: f.ID, Catalog: f.Info.CatalogName, Name: f.Info.FlowName,
			TableCount: len(f.Info.SourceTableIDs), Fatal: fatal[f.ID]}
		if fs.TableCount <= statusMaxTables {
			fs.Tables = f.Info.SourceTableIDs
		}
		if sum, ok := sums[f.ID]; ok {
			fs.WindowCount, fs.SnapshotTS, fs.TruncatedBefore = sum.WindowCount, sum.SnapshotTS, sum.TruncatedBefore
			for _, t := range slices.Sorted(maps.Keys(sum.Windows)) {
				fs.Windows = append(fs.Windows, sum.Windows[t])
			}
		}
		st.Flows = append(st.Flows, fs)
	}
	if s == nil {
		return st
	}
	st.Running = true
	parts, paused, tempBytes, at, fresh := s.partitionStatus(statusLockWait)
	st.Partitions, st.Paused, st.TempBytes = parts, paused, tempBytes
	if !fresh {
		st.PartitionsAsOf = at
	}
	st.InflightBytes = s.fl.inflightBytes()
	s.fl.mu.Lock()
	st.InflightCycles = len(s.fl.inflight)
	s.fl.mu.Unlock()
	return st
}

// partitionStatus reads the session's partitions, waiting up to wait for
// the consume loop to let go of them (it holds them while it routes a
// fetch, and while a rebalance callback talks to Redis); past that, it
// returns those of the last read, with when it was, and fresh false.
func (s *session) partitionStatus(wait time.Duration) (parts []PartitionStatus, paused bool, tempBytes int64, at time.Time, fresh bool) {
	deadline := time.Now().Add(wait)
	for !s.mu.TryLock() {
		if time.Now().After(deadline) {
			s.statusMu.Lock()
			defer s.statusMu.Unlock()
			return s.lastStatus.parts, s.lastStatus.paused, s.lastStatus.tempBytes, s.lastStatus.at, false
		}
		time.Sleep(5 * time.Millisecond)
	}
	paused, tempBytes = s.paused, s.gen.bytes
	for _, ps := range s.parts {
		lag := int64(0)
		if ps.next >= 0 && ps.hwm > ps.next {
			lag = ps.hwm - ps.next
		}
		parts = append(parts, PartitionStatus{Partition: ps.partition, LeaseEpoch: ps.lease.Epoch,
			Next: ps.next, HighWatermark: ps.hwm, Lag: lag, Regions: len(ps.regions)})
	}
	s.mu.Unlock()
	sort.Slice(parts, func(i, j int) bool { return parts[i].Partition < parts[j].Partition })
	s.statusMu.Lock()
	s.lastStatus = partSnapshot{parts: parts, paused: paused, tempBytes: tempBytes, at: time.Now()}
	s.statusMu.Unlock()
	return parts, paused, tempBytes, time.Time{}, true
}

// partSnapshot is the partitions part of the last Status that got them.
type partSnapshot struct {
	parts     []PartitionStatus
	paused    bool
	tempBytes int64
	at        time.Time
}

// statusCache holds the newest read of the flows' Redis part. A Status
// call wants a read that started after it was called; it starts one unless
// one is running, waits for it up to its wait, and otherwise answers with
// the newest read that finished and the reason it is not newer. At most
// one read runs at a time, so a Redis that does not answer costs one
// stuck read, not one per request.
type statusCache struct {
	mu      sync.Mutex
	running chan struct{} // closed when the running read ends; nil if none
	started time.Time     // when the running read started
	sums    map[meta.FlowID]meta.FlowSummary
	at      time.Time // when the newest finished read started
	err     error     // the error of the last read, nil if it succeeded
}

func (sc *statusCache) read(c *Consumer, flows []*meta.Flow, wait time.Duration) (map[meta.FlowID]meta.FlowSummary, time.Time, error) {
	called := time.Now()
	deadline := called.Add(wait)
	for {
		sc.mu.Lock()
		if !sc.at.Before(called) && sc.err == nil {
			defer sc.mu.Unlock()
			return sc.sums, sc.at, nil
		}
		if sc.running == nil {
			sc.start(c, flows)
		}
		running, started := sc.running, sc.started
		sc.mu.Unlock()
		left := time.Until(deadline)
		if left <= 0 {
			return sc.stale(started)
		}
		t := time.NewTimer(left)
		select {
		case <-running:
			t.Stop()
			sc.mu.Lock()
			err := sc.err
			sc.mu.Unlock()
			if err != nil && !started.Before(called) {
				return sc.stale(time.Time{})
			}
		case <-t.C:
			return sc.stale(started)
		}
	}
}

// start starts a read; must hold sc.mu.
func (sc *statusCache) start(c *Consumer, flows []*meta.Flow) {
	done := make(chan struct{})
	started := time.Now()
	sc.running, sc.started = done, started
	ids := make([]meta.FlowID, len(flows))
	for i, f := range flows {
		ids[i] = f.ID
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), statusRedisTime)
		sums, err := c.d.Store.FlowSummaries(ctx, ids, statusMaxTables)
		cancel()
		sc.mu.Lock()
		if err == nil {
			sc.sums, sc.at = sums, started
		}
		sc.err, sc.running = err, nil
		sc.mu.Unlock()
		close(done)
	}()
}

// stale answers with the newest finished read and why nothing newer is
// there: the last read's error, or a read running since started.
func (sc *statusCache) stale(started time.Time) (map[meta.FlowID]meta.FlowSummary, time.Time, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch {
	case sc.running != nil && !started.IsZero():
		return sc.sums, sc.at, fmt.Errorf("redis: no answer for %.1fs", time.Since(started).Seconds())
	case sc.err != nil:
		return sc.sums, sc.at, fmt.Errorf("redis: %w", sc.err)
	}
	return sc.sums, sc.at, nil
}

// Stalled returns an error when a flush cycle keeps failing (flusher.stuck),
// or when the consume loop has handled no record for --stall-timeout
// although records wait (a DLQ that refuses, a fatal flow, a flush that
// never ends), and nil otherwise.
func (c *Consumer) Stalled() error {
	if p := c.tempFault.Load(); p != nil {
		return fmt.Errorf("temp files cannot be written (nothing committed since): %w", *p)
	}
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s != nil {
		if err := s.fl.stuck(); err != nil {
			return err
		}
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
