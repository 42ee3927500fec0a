package pipeline

import (
	crand "crypto/rand"
	"fmt"
	"time"

	"github.com/flowlog/flowlog/sink"
)

// freeze ends the current generation and hands it, with the offsets and
// resolved ts it covers, to the flusher as one cycle; waiters are told its
// outcome. Must hold s.mu.
func (s *session) freeze(trigger string, waiters ...chan<- error) *cycle {
	c := s.c
	now := time.Now()
	gen := s.gen
	s.gen = newGeneration(c.cfg.TempDir, s.nextGen(), c.cfg.MaxOpenFiles, c.cfg.Compression, c.spares)
	s.last = now
	if s.lost != nil {
		// The generation holds events of lost partitions (onLost): none
		// of it may commit, and the session is ending. Its partitions'
		// offsets stay where they were committed.
		gen.drop()
		cyc := &cycle{seq: c.cycleSeq.Add(1), trigger: trigger, done: make(chan struct{}), waiters: waiters}
		cyc.complete(s.lost)
		return cyc
	}

	s.trackBacklog(trigger)
	// The files' resolved ts come from their region runs, which the seal
	// writes to disk.
	var rv resolvedView
	for _, f := range gen.files {
		f.resolvedTS = s.resolvedOf(f, &rv)
	}
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

// resolvedOf is the resolved ts of a frozen file's chunk: the last resolved
// ts of its region, or of a layout v2 file the lowest of its regions'
// (docs/FORMAT.md, "Meta objects, version 2"); 0 for a region no partition
// of the session tracks any longer. A layout v2 file holds several
// partitions' regions: rv, built on first use, holds each region's lowest
// last resolved ts over the partitions. Must hold s.mu.
func (s *session) resolvedOf(f *tempFile, rv *resolvedView) uint64 {
	if f.key.set == nil {
		if ps := s.parts[f.key.partition]; ps != nil {
			if rs := ps.regions[f.key.region]; rs != nil {
				return rs.resolved
			}
		}
		return 0
	}
	if rv.regions == nil {
		rv.regions = map[uint64]uint64{}
		for _, ps := range s.parts {
			for id, rs := range ps.regions {
				if ts, ok := rv.regions[id]; !ok || rs.resolved < ts {
					rv.regions[id] = rs.resolved
				}
			}
		}
	}
	var res uint64
	first := true
	f.runs.each(func(r sink.RegionRun) {
		if ts := rv.regions[r.Region]; first || ts < res {
			res, first = ts, false
		}
	})
	return res
}

// resolvedView is the last resolved ts of every region the session
// tracks, the lowest where partitions share a region, as of a freeze.
type resolvedView struct{ regions map[uint64]uint64 }

// newCycleID is a cycle's id, <unix ms>-<seq>-<16 hex digits>: the digits
// are 64 random bits, so that no one can place an object at a name the
// consumer will write before it does (a taken name costs a rename, never a
// wedge: uploadRenaming).
func newCycleID(now time.Time, seq uint64) string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%d-%d-%016x", now.UnixMilli(), seq, b)
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
