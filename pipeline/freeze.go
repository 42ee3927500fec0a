package pipeline

import (
	crand "crypto/rand"
	"fmt"
	"time"
)

// freeze ends the current generation and hands it, with the offsets and
// resolved ts it covers, to the flusher as one cycle; waiters are told its
// outcome. Must hold s.mu.
func (s *session) freeze(trigger string, waiters ...chan<- error) *cycle {
	c := s.c
	now := time.Now()
	gen := s.gen
	s.gen = newGeneration(c.cfg.TempDir, s.nextGen(), c.cfg.MaxOpenFiles, c.cfg.Compression)
	s.last = now

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
