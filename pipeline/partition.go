package pipeline

import (
	"time"

	"github.com/flowlog/flowlog/meta"
)

// Partition state: what the consume loop knows of each apply partition it
// owns (offsets, regions and their resolved ts, the coverage boundary
// values), and what a frozen cycle takes of it to commit. The partition's
// checkpoint is the min resolved ts of its live regions: every region
// announces a resolved ts only after everything below it was sent, so all
// of the partition's events at or below that ts have been handled once the
// cycle holding them commits (docs/FORMAT.md, "Checkpoint rule").

// regionState is what a partition knows of one region.
type regionState struct {
	resolved uint64
	seen     time.Time
}

// partState is the consume loop's view of one assigned apply partition.
type partState struct {
	partition  int32
	lease      meta.Lease
	next       int64  // offset after the last record handled
	cycleFrom  int64  // first offset not yet part of a frozen cycle
	stored     int64  // offset:<topic>:<p> once the cycles frozen so far commit (-1: absent)
	frozenCkpt uint64 // checkpoint handed to the last cycle
	frozenIdle bool   // the last cycle had no live region (ckpt idle)
	// lateBelow is the highest checkpoint the partition committed or handed
	// to a cycle: a write at or below it arrived late (late_events_total).
	lateBelow uint64
	regions   map[uint64]*regionState
	hwm       int64
	maxTS     uint64 // highest ts of the records handled (and committed before)
	cov       partCoverage
}

// checkpoint is the min resolved ts over the partition's regions seen within
// ttl, and false when there is none. Regions silent longer than ttl are
// forgotten on the way.
func (p *partState) checkpoint(now time.Time, ttl time.Duration) (uint64, bool) {
	var ck uint64
	ok := false
	for id, r := range p.regions {
		if now.Sub(r.seen) > ttl {
			delete(p.regions, id)
			continue
		}
		if !ok || r.resolved < ck {
			ck, ok = r.resolved, true
		}
	}
	return ck, ok
}

// partCommit is a partition's part of a cycle: the offsets [from, to) it
// consumed since the previous cycle and its checkpoint at the freeze.
type partCommit struct {
	lease    meta.Lease
	from, to int64
	stored   int64 // offset:<topic>:<p> as the commit must find it (-1: absent)
	ckpt     uint64
	hasCkpt  bool
	idle     bool // no live region: left out of the global checkpoint
	maxTS    uint64
	regions  map[uint64]uint64
}

// commit is what the cycle's commit writes for the partition: compare-and-set
// on the offset it started from.
func (p partCommit) commit() meta.PartitionCommit {
	return meta.PartitionCommit{
		Topic: p.lease.Topic, Partition: p.lease.Partition, NextOffset: p.to,
		Checkpoint: p.ckpt, HasCheckpoint: p.hasCkpt, Idle: p.idle, Regions: p.regions, MaxTS: p.maxTS,
		CheckFrom: true, From: p.stored,
	}
}
