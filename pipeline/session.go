package pipeline

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
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
	// by size has been read to the end (docs/OPERATING.md, "Flush
	// triggers").
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
	paused  bool

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

type parsedEvent struct {
	ev      *event.Event
	ts      uint64
	beginTS uint64
	table   int64
	isMeta  bool
	flows   []*meta.Flow  // layout v1
	set     *meta.FlowSet // layout v2
	skip    string
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
			return
		}
		ps.hwm = fp.HighWatermark
		for _, r := range fp.Records {
			if r.Offset < ps.next {
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
	case s.gen.cost() >= int64(c.cfg.FlushSize):
		s.freeze(triggerSize)
	case s.caughtUp():
		s.freeze(triggerCaughtUp)
	case time.Since(s.last) >= c.cfg.cycleInterval() && !s.fl.full():
		s.freeze(triggerInterval)
	}
	s.backpressure()
	return nil
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

// handle decodes one apply record and appends its events to temp files. A
// record is atomic: if it or any of its events is bad, nothing of it is
// written and it goes to the DLQ.
func (s *session) handle(ctx context.Context, ps *partState, r *kgo.Record) error {
	c := s.c
	if len(r.Value) > int(c.cfg.MaxValueSize) {
		return s.toDLQ(ctx, r, 1, reasonTooLarge, fmt.Errorf("record value %d bytes exceeds --max-value-size %d", len(r.Value), c.cfg.MaxValueSize))
	}
	if err := event.DecodeBatch(&s.batch, r.Value, event.ContentType(r)); err != nil {
		return s.toDLQ(ctx, r, 1, decodeReason(err), err)
	}
	maxSize := int(c.cfg.MaxValueSize)
	now := time.Now()
	// No ts of the record may lie further ahead of this clock than the
	// skew allows: one such ts would count toward maxts, the region's
	// resolved ts, the checkpoint and coverage windows for good.
	bound := event.MaxTS(now, c.cfg.MaxClockSkew)
	if s.batch.ResolvedTS > bound {
		return s.toDLQ(ctx, r, len(s.batch.Events), reasonTSFuture, futureErr("resolved ts", s.batch.ResolvedTS, now, c.cfg.MaxClockSkew))
	}
	s.parsed = s.parsed[:0]
	lock, late := 0, 0
	var lateTS, recMaxTS uint64
	for i := range s.batch.Events {
		ev := &s.batch.Events[i]
		if ev.CF == event.CF_CF_LOCK {
			lock++
			continue
		}
		if len(ev.Key) > maxSize || len(ev.Value) > maxSize {
			return s.toDLQ(ctx, r, len(s.batch.Events), reasonTooLarge, fmt.Errorf("event %d: key %d or value %d bytes exceeds --max-value-size %d", i, len(ev.Key), len(ev.Value), maxSize))
		}
		enc, ts, err := event.SplitDataKey(ev.Key)
		if err != nil {
			return s.toDLQ(ctx, r, len(s.batch.Events), reasonBadKey, fmt.Errorf("event %d: %w", i, err))
		}
		if ts > bound {
			return s.toDLQ(ctx, r, len(s.batch.Events), reasonTSFuture, fmt.Errorf("event %d: %w", i, futureErr("ts", ts, now, c.cfg.MaxClockSkew)))
		}
		p := parsedEvent{ev: ev, ts: ts}
		if ev.CF == event.CF_CF_WRITE && ev.Op == event.Op_OP_PUT {
			w, err := event.DecodeWrite(ev.Value)
			if err != nil {
				return s.toDLQ(ctx, r, len(s.batch.Events), "write_record", fmt.Errorf("event %d: %w", i, err))
			}
			p.beginTS = w.StartTS
			if ts <= ps.lateBelow {
				late, lateTS = late+1, ts
			}
		}
		recMaxTS = max(recMaxTS, ts)
		if c.cfg.v2() {
			p.set, p.table, p.isMeta, p.skip = s.router.RouteSet(enc)
		} else {
			p.flows, p.table, p.isMeta, p.skip = s.router.Route(enc)
		}
		if p.skip == reasonBadKey {
			return s.toDLQ(ctx, r, len(s.batch.Events), reasonBadKey, fmt.Errorf("event %d: table key too short for a table id", i))
		}
		s.parsed = append(s.parsed, p)
	}

	// The record is accepted whole: only now may it count.
	ps.maxTS = max(ps.maxTS, recMaxTS)
	s.ahead = max(s.ahead, event.Ahead(max(recMaxTS, s.batch.ResolvedTS), now))
	appendStart := time.Now()
	rs := ps.regions[s.batch.RegionID]
	if rs == nil {
		rs = &regionState{}
		ps.regions[s.batch.RegionID] = rs
	}
	rs.resolved = max(rs.resolved, s.batch.ResolvedTS)
	rs.seen = now

	if lock > 0 {
		c.m.skipLock.Add(float64(lock))
	}
	if late > 0 {
		s.lateEvents(ps, late, lateTS, now)
	}
	written, noFlow, noTable := 0, 0, 0
	for i := range s.parsed {
		p := &s.parsed[i]
		switch p.skip {
		case reasonNoFlow:
			noFlow++
			continue
		case reasonNoTbl:
			noTable++
			continue
		}
		key := fileKey{partition: ps.partition, set: p.set, table: p.table, region: s.batch.RegionID,
			cf: p.ev.CF, op: p.ev.Op, isMeta: p.isMeta}
		if p.set != nil {
			if err := s.appendTo(key, nil, p); err != nil {
				return err
			}
		}
		for _, f := range p.flows {
			key.flow = f.ID
			if err := s.appendTo(key, f, p); err != nil {
				return err
			}
		}
		written++
	}
	if written > 0 {
		c.m.written.Add(float64(written))
	}
	if noFlow > 0 {
		c.m.skipNoFlow.Add(float64(noFlow))
	}
	if noTable > 0 {
		c.m.skipNoTable.Add(float64(noTable))
	}
	if len(s.parsed) > 0 || lock > 0 {
		c.m.appendSeconds.Observe(time.Since(appendStart).Seconds())
	}
	return nil
}

// appendTo appends p's entry to the temp file of key (of flow f in layout
// v1, nil in layout v2).
func (s *session) appendTo(key fileKey, f *meta.Flow, p *parsedEvent) error {
	tf, err := s.gen.file(key, f)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTempWrite, err)
	}
	before := tf.size
	if err := tf.append(p.ev.Key, p.ev.Value, p.ts, p.beginTS); err != nil {
		return fmt.Errorf("%w: %w", ErrTempWrite, err)
	}
	s.gen.bytes += tf.size - before
	return nil
}

// lateEvents counts late events of one record: write-CF puts at or below the
// partition's last checkpoint, which the upstream's resolved ts had claimed
// complete (the upstream assumption of docs/FORMAT.md, "Checkpoint rule":
// each region announces its resolved ts before its data). They are backed up
// anyway, but the checkpoint and coverage windows committed before may claim
// them too early. Logged at most once a minute, with positions and ts only.
func (s *session) lateEvents(ps *partState, n int, ts uint64, now time.Time) {
	s.c.m.lateEvents.Add(float64(n))
	s.lateCount += n
	if now.Sub(s.lateLogged) < time.Minute {
		return
	}
	s.c.log.Warn("late apply events: commit ts at or below the partition's checkpoint (a region sent data below a resolved ts already reported); backed up, but an earlier checkpoint or coverage window claimed them too early",
		"partition", ps.partition, "region", s.batch.RegionID, "commit_ts", ts, "checkpoint", ps.lateBelow,
		"late_events", s.lateCount)
	s.lateLogged, s.lateCount = now, 0
}

// futureErr describes a ts that lies more than skew ahead of now.
func futureErr(what string, ts uint64, now time.Time, skew time.Duration) error {
	return fmt.Errorf("%s %d (%s) is %v ahead of the consumer's clock, more than --max-clock-skew %v",
		what, ts, event.PhysicalTime(ts).Format(time.RFC3339Nano), event.Ahead(ts, now).Round(time.Millisecond), skew)
}

func decodeReason(err error) string {
	var de *event.DecodeError
	if errors.As(err, &de) && de.Reason != "" {
		return de.Reason
	}
	return "decode"
}

// toDLQ sends a bad record to the DLQ, retrying until it is acknowledged:
// skipping it without the DLQ copy would lose it. A record the DLQ topic
// cannot take whole goes there truncated (dlq.Writer.Send), so only a DLQ
// that is down holds the partition. events is how many events it carried
// (1 for a record that did not decode). Must hold s.mu; released meanwhile.
func (s *session) toDLQ(ctx context.Context, r *kgo.Record, events int, reason string, cause error) error {
	c := s.c
	c.m.events.WithLabelValues(resultDLQ, reason).Add(float64(max(events, 1)))
	attrs := []any{"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "reason", reason}
	switch {
	case !c.d.RedactLogs:
		attrs = append(attrs, "err", cause, "key", string(r.Key), "value_bytes", len(r.Value))
	case reason != event.ReasonJSON:
		// protojson's errors quote the offending input (payload bytes), so
		// a redacted log gets only their reason; the DLQ header has all.
		attrs = append(attrs, "err", cause)
	}
	c.log.Warn("apply record sent to the DLQ", attrs...)
	// The consume loop holds s.mu here. It lets go while the DLQ answers,
	// so /status and /flush never wait on a broker. Nothing else changes the
	// session meanwhile: rebalance callbacks wait for AllowRebalance.
	s.mu.Unlock()
	defer s.mu.Lock()
	backoff := 100 * time.Millisecond
	for {
		err := c.d.DLQ.Send(ctx, r, reason, cause.Error())
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.log.Error("DLQ produce failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// freeze ends the current generation and hands it, with the offsets and
// resolved ts it covers, to the flusher as one cycle; waiters are told its
// outcome. Must hold s.mu.
func (s *session) freeze(trigger string, waiters ...chan<- error) *cycle {
	c := s.c
	now := time.Now()
	gen := s.gen
	s.gen = newGeneration(c.cfg.TempDir, s.nextGen(), c.cfg.MaxOpenFiles, c.cfg.Compression)
	s.last = now

	s.trackBacklog(trigger)
	files, mem := gen.seal() // the cycle holds no file open while it waits
	cyc := &cycle{
		seq:     c.cycleSeq.Add(1),
		trigger: trigger,
		files:   files,
		bytes:   gen.bytes,
		mem:     mem,
		raw:     gen.raw,
		done:    make(chan struct{}),
		waiters: waiters,
	}
	cyc.id = newCycleID(now, cyc.seq)
	for _, f := range cyc.files {
		if ps := s.parts[f.key.partition]; ps != nil {
			if rs := ps.regions[f.key.region]; rs != nil {
				f.resolvedTS = rs.resolved
			}
		}
	}
	for _, ps := range s.parts {
		if ps.next < 0 {
			continue // no record yet, no committed offset to repeat
		}
		ck, ok := ps.checkpoint(now, c.cfg.RegionTTL)
		same := ok && ck == ps.frozenCkpt && !ps.frozenIdle || !ok && ps.frozenIdle
		if ps.next == ps.cycleFrom && same {
			continue // nothing new to commit for this partition
		}
		ps.frozenCkpt, ps.frozenIdle = ck, !ok
		if ok {
			ps.lateBelow = max(ps.lateBelow, ck)
		}
		regions := make(map[uint64]uint64, len(ps.regions))
		for id, r := range ps.regions {
			regions[id] = r.resolved
		}
		cyc.parts = append(cyc.parts, partCommit{
			lease: ps.lease, from: ps.cycleFrom, to: ps.next, stored: ps.stored,
			ckpt: ck, hasCkpt: ok, idle: !ok, regions: regions, maxTS: ps.maxTS,
		})
		ps.cycleFrom, ps.stored = ps.next, ps.next
	}
	s.takeReports(cyc)
	c.m.tsAhead.Set(s.ahead.Seconds())
	c.tsAhead.Store(int64(s.ahead))
	s.ahead = 0
	c.m.tempWrite.WithLabelValues("freeze").Observe(time.Since(now).Seconds())
	s.fl.enqueue(cyc)
	return cyc
}

// newCycleID is a cycle's id, <unix ms>-<seq>-<16 hex digits>: the digits
// are 64 random bits, so that no one can place an object at a name the
// consumer will write before it does (a taken name costs a rename, never a
// wedge: uploadRenaming).
func newCycleID(now time.Time, seq uint64) string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%d-%d-%016x", now.UnixMilli(), seq, b)
}

// onAssigned is registered so that assignment is serialized with polls.
func (s *session) onAssigned(context.Context, *kgo.Client, map[string][]int32) {}

// adjustOffsets takes the lease of each newly assigned partition and starts
// it at the Redis offset, else the Kafka committed offset (or the reset
// offset) that kgo fetched.
func (s *session) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	c := s.c
	// kgo may call this before NewClient has returned to runSession.
	select {
	case <-s.clReady:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	member, _ := s.cl.GroupMetadata()
	if member == "" {
		member = c.cfg.StoreID
	}
	member = c.cfg.StoreID + "/" + member
	parts := offsets[c.d.ApplyTopic]
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, off := range parts {
		lease, err := c.d.Store.AcquireLease(ctx, c.d.ApplyTopic, p, member)
		if err != nil {
			c.noteOwnerLost(err)
			return nil, fmt.Errorf("lease %s/%d: %w", c.d.ApplyTopic, p, err)
		}
		s.fl.ownKafka(p)
		start, err := c.d.Store.PartitionStart(ctx, c.d.ApplyTopic, p)
		if err != nil {
			return nil, err
		}
		start = s.boundStart(p, start)
		ps := &partState{partition: p, lease: lease, regions: map[uint64]*regionState{},
			maxTS: start.MaxTS, cov: newPartCoverage(start)}
		if s.flows.tables != nil {
			ps.cov.startSeqs = s.flows.seqs // routes from its start with this view
		}
		if start.HasCkpt {
			ps.lateBelow = start.Ckpt
		}
		s.covDirty = true
		known, err := c.d.Store.PartitionRegions(ctx, c.d.ApplyTopic, p)
		if err != nil {
			return nil, err
		}
		now := time.Now()
		bound := event.MaxTS(now, c.cfg.MaxClockSkew)
		for r, ts := range known {
			if ts > bound {
				// Stored by a version that took any ts: the region counts
				// again once it sends a ts within the bound.
				c.log.Warn("dropping a region whose stored resolved ts lies in the future", "partition", p, "region", r,
					"resolved_ts", ts, "ahead", event.Ahead(ts, now).Round(time.Second))
				continue
			}
			ps.regions[r] = &regionState{resolved: ts, seen: now}
		}
		if o, ok, err := c.d.Store.Offset(ctx, c.d.ApplyTopic, p); err != nil {
			return nil, fmt.Errorf("offset %s/%d: %w", c.d.ApplyTopic, p, err)
		} else if ok {
			off = kgo.NewOffset().At(o).WithEpoch(-1)
			parts[p] = off
			ps.next, ps.cycleFrom, ps.stored = o, o, o
		} else {
			ps.next, ps.cycleFrom, ps.stored = -1, -1, -1 // next and cycleFrom set by the first record
			if at := off.EpochOffset().Offset; at > 0 || at == -1 {
				// Starting past the log start without a Redis offset (a
				// Kafka commit, or --start-offset latest): records before
				// were never routed here, and their ts is unknown. A
				// coverage window may only start after them: now.
				ps.cov.start.MaxTS = max(ps.cov.start.MaxTS, event.ComposeTS(time.Now().UnixMilli(), 0))
				ps.maxTS = ps.cov.start.MaxTS
			}
		}
		s.parts[p] = ps
		c.log.Info("partition assigned", "topic", c.d.ApplyTopic, "partition", p, "lease_epoch", lease.Epoch, "start", offsetString(off, ps.next))
	}
	return offsets, nil
}

// boundStart caps what Redis holds of a partition's committed position at
// the clock plus --max-clock-skew. Only a version that took any ts could
// have stored more; kept, a maxts of 2^63 would make every later coverage
// window start in the future. The next commit stores the capped values.
func (s *session) boundStart(p int32, st meta.PartitionStart) meta.PartitionStart {
	now := time.Now()
	bound := event.MaxTS(now, s.c.cfg.MaxClockSkew)
	if st.MaxTS > bound {
		s.c.log.Warn("stored maxts lies in the future; capped at the clock plus --max-clock-skew", "partition", p,
			"maxts", st.MaxTS, "ahead", event.Ahead(st.MaxTS, now).Round(time.Second), "capped_to", bound)
		st.MaxTS = bound
	}
	if st.HasCkpt && st.Ckpt > bound {
		st.Ckpt = bound
	}
	return st
}

func offsetString(_ kgo.Offset, redis int64) string {
	if redis >= 0 {
		return "redis offset " + strconv.FormatInt(redis, 10)
	}
	return "kafka committed offset, else --start-offset"
}

// onRevoked flushes and commits everything before the partitions move, so
// the next owner starts exactly where this one stopped.
func (s *session) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	s.mu.Lock()
	if s.closing || len(revoked[s.c.d.ApplyTopic]) == 0 {
		s.mu.Unlock()
		return
	}
	cyc := s.freeze(triggerRevoke)
	s.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	err := s.fl.waitCtx(wctx, cyc)
	cancel()
	if err != nil {
		s.c.log.Warn("flush on revoke did not finish; the next owner resumes from the last commit", "err", err)
	}
	s.fl.forgetKafka(revoked[s.c.d.ApplyTopic])
	s.mu.Lock()
	for _, p := range revoked[s.c.d.ApplyTopic] {
		delete(s.parts, p)
		s.c.m.consumerLag.DeleteLabelValues(s.c.d.ApplyTopic, strconv.Itoa(int(p)))
	}
	s.mu.Unlock()
}

// onLost forgets partitions that were taken away without a revoke; what was
// not committed for them will fail the lease check.
func (s *session) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	if len(lost[s.c.d.ApplyTopic]) > 0 {
		s.c.log.Warn("partitions lost (the group session expired): dropping their uncommitted records; the new owner consumes them from the last commit",
			"topic", s.c.d.ApplyTopic, "partitions", lost[s.c.d.ApplyTopic])
	}
	s.fl.forgetKafka(lost[s.c.d.ApplyTopic])
	s.mu.Lock()
	defer s.mu.Unlock()
	gone := map[int32]bool{}
	for _, p := range lost[s.c.d.ApplyTopic] {
		delete(s.parts, p)
		gone[p] = true
	}
	// Their records in the current generation must not ride along in the
	// next cycle: that commit would no longer check these partitions'
	// leases, and whoever owns them now consumes them from the last commit.
	for k, f := range s.gen.files {
		if gone[k.partition] {
			s.gen.bytes -= f.size
			f.remove()
			delete(s.gen.files, k)
		}
	}
	s.gen.last = nil
}

// dropAll removes the files of the current generation (after a failure; a
// graceful stop has frozen them already).
func (s *session) dropAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for _, f := range s.gen.files {
		f.remove()
	}
	s.gen = newGeneration(s.c.cfg.TempDir, s.nextGen(), s.c.cfg.MaxOpenFiles, s.c.cfg.Compression)
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

// trackBacklog updates behind as a cycle freezes, before the partitions'
// cycle offsets move on. A cycle frozen by size with at least its own
// number of records still waiting means a backlog; one frozen by the
// interval or at the end of a backlog means none. Steady traffic, however
// heavy, freezes by size with little waiting, so it never counts as a
// backlog and keeps its full-size objects. Must hold s.mu.
func (s *session) trackBacklog(trigger string) {
	switch trigger {
	case triggerSize, triggerFiles:
		var routed, waiting int64
		for _, ps := range s.parts {
			if ps.next < 0 {
				continue
			}
			if ps.cycleFrom >= 0 {
				routed += ps.next - ps.cycleFrom
			}
			waiting += max(ps.hwm-ps.next, 0)
		}
		if routed > 0 && waiting >= routed {
			s.behind = true
		}
	case triggerInterval, triggerCaughtUp:
		s.behind = false
	}
}

// caughtUp is the catch-up trigger: the session was reading a backlog,
// every partition it owns has now been read up to its high watermark, and
// the files hold at least an eighth of --flush-size (so the end of a
// backlog makes one object worth its requests, never a trickle of tiny
// ones). Without it the last cycle of a catch-up waits for the interval
// with nothing left to read. Must hold s.mu.
func (s *session) caughtUp() bool {
	return s.behind && s.gen.cost() >= int64(s.c.cfg.FlushSize)/8 && s.drained()
}

// drained reports whether every partition the session owns has been read up
// to the high watermark its last fetch reported. Must hold s.mu.
func (s *session) drained() bool {
	for _, ps := range s.parts {
		if ps.next >= 0 && ps.hwm > ps.next {
			return false
		}
	}
	return true
}
