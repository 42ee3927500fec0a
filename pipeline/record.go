package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

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
		key := fileKey{set: p.set, table: p.table, cf: p.ev.CF, op: p.ev.Op, isMeta: p.isMeta}
		if p.set != nil {
			if err := s.appendTo(key, nil, ps.partition, p); err != nil {
				return err
			}
		}
		key.partition, key.region = ps.partition, s.batch.RegionID // layout v1: a file per partition and region
		for _, f := range p.flows {
			key.flow = f.ID
			if err := s.appendTo(key, f, ps.partition, p); err != nil {
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

// appendTo appends p's entry, of apply partition part, to the temp file of
// key: of flow f in layout v1, whose key holds the partition and region; in
// layout v2 (f nil) the key's file of every partition and region, which
// records the batch's region and the partition for the entry.
func (s *session) appendTo(key fileKey, f *meta.Flow, part int32, p *parsedEvent) error {
	var tf *tempFile
	var err error
	if f == nil {
		tf, err = s.gen.regionFile(key, s.batch.RegionID)
	} else {
		tf, err = s.gen.file(key, f)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTempWrite, err)
	}
	before := tf.size
	if err := tf.append(p.ev.Key, p.ev.Value, p.ts, p.beginTS); err != nil {
		return fmt.Errorf("%w: %w", ErrTempWrite, err)
	}
	if f == nil {
		tf.countRegion(s.batch.RegionID)
		tf.countPartition(part)
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
