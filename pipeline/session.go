package pipeline

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

// Flush triggers, the trigger label of flush_cycles_total.
const (
	triggerSize     = "size"
	triggerInterval = "interval"
	triggerRevoke   = "revoke"
	triggerDDL      = "ddl"
	triggerShutdown = "shutdown"
	triggerRequest  = "request"
	triggerFiles    = "files"
	// triggerCaughtUp ends a catch-up: the backlog that made cycles freeze
	// by size has been read to the end (docs/FORMAT.md, "Flush cycle").
	triggerCaughtUp = "caught_up"
)

// session is one membership of the consumer group: a kgo client, the
// partitions it owns and their temp files. The consume loop owns it; the
// rebalance callbacks run only while the loop is inside PollFetches
// (BlockRebalanceOnPoll), and mu makes that hand-over explicit.
type session struct {
	c      *Consumer
	cl     *kgo.Client
	adm    *kadm.Client
	fl     *flusher
	router *Router
	sizer  *fetchSizer        // the client's fetch size hook
	dec    *batchDecompressor // the client's, bounded (decompress.go)

	mu      sync.Mutex
	parts   map[int32]*partState
	gen     *generation
	genSeq  uint64
	last    time.Time // last freeze
	closing bool
	// lost ends the session (a meta.ErrLeaseLost) once partitions were
	// lost whose uncommitted events share temp files with others' (onLost).
	lost   error
	paused bool

	flushReq chan chan error
	stopped  chan struct{}
	clReady  chan struct{} // closed once cl and adm are set
	flows    flowView      // the consume loop's
	covDirty bool          // pending coverage entries may await reports
	// covFlows are the flows of pending coverage entries, as
	// collectCoverage last saw them (a dropped one by its last definition).
	covFlows map[meta.FlowID]*meta.Flow

	batch  event.Batch
	parsed []parsedEvent

	statusMu   sync.Mutex   // guards lastStatus
	lastStatus partSnapshot // the partitions as Status last read them

	// behind is set when a cycle froze by size while at least as many
	// records again still waited in Kafka: the session is reading a
	// backlog, and the cycle after it freezes as soon as the backlog is
	// read (caughtUp), not at the interval.
	behind bool

	lateLogged time.Time // when late events were last logged
	lateCount  int       // late events since then
	// ahead is how far the newest ts of the records accepted since the
	// last freeze lay ahead of the clock when they arrived.
	ahead time.Duration
}

func (s *session) nextGen() uint64 { s.genSeq++; return s.genSeq }

// loop polls, applies DDL up to the DDL topic's end, routes records and
// freezes cycles when a trigger trips. It returns nil when ctx is canceled.
func (s *session) loop(ctx context.Context) error {
	s.mu.Lock()
	s.last = time.Now()
	s.c.progress.Store(s.last.UnixNano())
	s.mu.Unlock()
	lastGauge := time.Time{}
	for {
		if err := s.fl.failure(); err != nil {
			return err
		}
		if err := s.c.OwnerLost(); err != nil {
			return err
		}
		s.mu.Lock()
		last := s.last
		s.mu.Unlock()
		wait := max(time.Until(last.Add(s.c.cfg.cycleInterval())), 10*time.Millisecond)
		wait = min(wait, time.Second)
		pctx, cancel := context.WithTimeout(ctx, wait)
		fetches := s.cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			s.cl.AllowRebalance()
			return nil
		}
		if fetches.IsClientClosed() {
			return errors.New("kafka client closed")
		}
		fetches.EachError(func(t string, p int32, err error) {
			var tooLarge *kgo.ErrDecompressTooLarge
			switch {
			case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			case errors.Is(err, errFetchBudget):
				// Fetched again after this poll (decompress.go).
			case errors.As(err, &tooLarge):
				// To the DLQ in process (bigbatch.go).
			default:
				s.c.log.Warn("fetch error", "topic", t, "partition", p, "err", err)
			}
		})

		// DDL barrier: every DDL published before these records were
		// fetched is applied before any of them is routed.
		applied, err := s.catchUpDDL(ctx)
		if err != nil {
			s.cl.AllowRebalance()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}

		if fetches.NumRecords() == 0 {
			s.mu.Lock()
			idle := !s.paused
			s.mu.Unlock()
			if idle {
				s.c.progress.Store(time.Now().UnixNano()) // nothing waits
			}
		}
		s.mu.Lock()
		err = s.process(ctx, fetches, applied)
		if err == nil {
			err = s.lost
		}
		s.mu.Unlock()
		s.dec.reset() // what was decompressed for this poll is handled
		s.cl.AllowRebalance()
		if err != nil {
			return err
		}
		if time.Since(lastGauge) > time.Second {
			lastGauge = time.Now()
			s.updateGauges(ctx)
		}
	}
}

// catchUpDDL runs the DDL barrier, retrying while Redis or Kafka fail: no
// record may be routed before the DDL ahead of it is applied.
func (s *session) catchUpDDL(ctx context.Context) ([]meta.Applied, error) {
	backoff := 100 * time.Millisecond
	for {
		applied, err := s.c.d.Applier.CatchUp(ctx)
		if err == nil {
			return applied, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, meta.ErrOwnerLost) {
			return nil, err
		}
		s.c.log.Warn("applying flow DDL failed; retrying before routing data", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (s *session) process(ctx context.Context, fetches kgo.Fetches, applied []meta.Applied) error {
	c := s.c
	for _, a := range applied {
		if a.Op == meta.OpResume && !a.Skipped {
			s.fl.resume(a.FlowID)
		}
	}
	// A drop or replace, applied here or by another replica, ends the
	// cycle: what was routed under the old definitions goes out alone.
	changed := s.observeFlows()
	if s.covDirty {
		s.collectCoverage(ctx)
	}
	if changed {
		// What was routed under the old definitions goes out now.
		s.freeze(triggerDDL)
	}
	start := time.Now()
	n := 0
	var perr error
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if perr != nil {
			return
		}
		ps := s.parts[fp.Partition]
		if ps == nil {
			recycle(fp.Records)
			return
		}
		ps.hwm = fp.HighWatermark
		for _, r := range fp.Records {
			if r.Offset < ps.next {
				r.Recycle()
				continue
			}
			if ps.cycleFrom < 0 {
				ps.cycleFrom = r.Offset
			}
			if err := s.handle(ctx, ps, r); err != nil {
				perr = err
				return
			}
			ps.next = r.Offset + 1
			// Handled: its bytes are copied, and its batch's buffer may
			// go back to the decompressor (decompress_pool.go).
			r.Recycle()
			n++
			c.progress.Store(time.Now().UnixNano())
			if s.cycleFull() {
				// Checked per record: one fetch can hold many
				// thousand records of distinct regions.
				s.freeze(triggerFiles)
			}
		}
		var tooLarge *kgo.ErrDecompressTooLarge
		if errors.As(fp.Err, &tooLarge) {
			perr = s.skipBatch(ctx, ps, tooLarge)
		}
	})
	if perr != nil {
		return perr
	}
	if n > 0 {
		c.m.batchSeconds.Observe(time.Since(start).Seconds())
	}

	var req chan error
	select {
	case req = <-s.flushReq:
	default:
	}
	switch {
	case req != nil:
		s.freeze(triggerRequest, req)
	case s.sizeReached():
		s.freeze(triggerSize)
	case s.caughtUp():
		s.freeze(triggerCaughtUp)
	case time.Since(s.last) >= c.cfg.cycleInterval() && !s.fl.full():
		s.freeze(triggerInterval)
	}
	s.backpressure()
	return nil
}

// recycle gives records that will not be handled back to their batches'
// buffers.
func recycle(records []*kgo.Record) {
	for _, r := range records {
		r.Recycle()
	}
}

// backpressure pauses fetching while temp files (current and in flight)
// exceed --max-temp-bytes or twice --max-cycle-files (overBudget), a flow
// is fatal or maxInflightCycles cycles wait, and resumes it after.
func (s *session) backpressure() {
	over, tooMany := s.overBudget()
	fatal, queued := s.c.fatal.any(), s.fl.full()
	stop := over || tooMany || fatal || queued
	switch {
	case stop && !s.paused:
		s.paused = true
		s.cl.PauseFetchTopics(s.c.d.ApplyTopic)
		s.c.log.Warn("fetching paused", "temp_bytes_over_limit", over, "temp_files_over_limit", tooMany, "fatal_flow", fatal,
			"cycles_waiting_over_limit", queued)
	case !stop && s.paused:
		s.paused = false
		s.cl.ResumeFetchTopics(s.c.d.ApplyTopic)
		s.c.log.Info("fetching resumed")
	}
}

// dropAll removes the files of the current generation (after a failure; a
// graceful stop has frozen them already).
func (s *session) dropAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	s.gen.drop()
	s.gen = newGeneration(s.c.cfg.TempDir, s.nextGen(), s.c.cfg.MaxOpenFiles, s.c.cfg.Compression, s.c.spares)
}

// updateGauges refreshes temp_bytes{flow} and consumer_lag_records.
func (s *session) updateGauges(ctx context.Context) {
	c := s.c
	// The high watermark of the last fetch goes stale while fetching is
	// paused, so ask the broker for the end offsets.
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	ends, err := s.adm.ListEndOffsets(lctx, c.d.ApplyTopic)
	cancel()
	s.mu.Lock()
	if err == nil {
		ends.Each(func(o kadm.ListedOffset) {
			if ps := s.parts[o.Partition]; ps != nil && o.Err == nil && o.Offset > ps.hwm {
				ps.hwm = o.Offset
			}
		})
	}
	per := map[string]float64{}
	for _, f := range s.gen.files {
		f.eachFlow(func(fl *meta.Flow) { per[flowLabel(fl.Info.CatalogName, fl.Info.FlowName)] += float64(f.size) })
	}
	for _, ps := range s.parts {
		if ps.next >= 0 && ps.hwm > 0 {
			c.m.consumerLag.WithLabelValues(c.d.ApplyTopic, strconv.Itoa(int(ps.partition))).Set(float64(max(ps.hwm-ps.next, 0)))
		}
	}
	s.mu.Unlock()
	for flow, b := range s.fl.inflightByFlow() {
		per[flow] += b
	}
	for _, f := range c.d.Registry.Flows() {
		l := flowLabel(f.Info.CatalogName, f.Info.FlowName)
		c.m.tempBytes.WithLabelValues(l).Set(per[l])
	}
}
