package pipeline

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/event"
	"github.com/flowlog/flowlog/meta"
)

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
	var mixed []int32
	for k, f := range s.gen.files {
		held := 0
		for p := range gone {
			if f.holdsPartition(p) {
				held++
			}
		}
		switch {
		case held == 0:
		case f.key.set == nil || held == len(f.parts):
			s.gen.bytes -= f.size
			f.remove()
			delete(s.gen.files, k)
		default:
			mixed = f.parts
		}
	}
	s.gen.last = nil
	if mixed != nil && s.lost == nil {
		// A layout v2 file holds these partitions' events beside those of
		// partitions still owned, and cannot give them back alone: the
		// session ends, drops what it has not committed and rejoins, and
		// every partition is consumed again from its last commit.
		s.lost = fmt.Errorf("%w: partitions %v of %s lost while the current cycle held their events in chunks shared with partitions %v",
			meta.ErrLeaseLost, lost[s.c.d.ApplyTopic], s.c.d.ApplyTopic, mixed)
	}
}
