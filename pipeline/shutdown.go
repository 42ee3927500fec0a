package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// UncommittedError is a graceful stop whose final flush did not commit
// within --shutdown-timeout (GCS or Redis refusing): the stop ends anyway,
// and this is what it left uncommitted. Nothing is lost: the next start
// consumes the partitions again from their committed offsets, and the
// cycles' temp files are removed then.
type UncommittedError struct {
	Timeout time.Duration
	// Cycles are the cycles frozen but not committed, Bytes their temp
	// bytes.
	Cycles int
	Bytes  int64
	// Partitions are the apply partitions with records in those cycles,
	// by partition, each with the offsets left uncommitted.
	Partitions []UncommittedRange
	// LastErr is the last failure of a flush attempt, if one failed.
	LastErr error
}

// UncommittedRange is one partition's offsets [From, To) that no commit
// covers.
type UncommittedRange struct {
	Topic     string
	Partition int32
	From, To  int64
}

func (e *UncommittedError) Error() string {
	parts := make([]string, len(e.Partitions))
	for i, p := range e.Partitions {
		parts[i] = fmt.Sprintf("%s/%d offsets %d-%d", p.Topic, p.Partition, p.From, p.To-1)
	}
	s := fmt.Sprintf("final flush did not commit within --shutdown-timeout %v: left %d cycles (%d bytes) uncommitted, of partitions [%s]; "+
		"the next start consumes them again from the committed offsets (nothing is lost)",
		e.Timeout, e.Cycles, e.Bytes, strings.Join(parts, ", "))
	if e.LastErr != nil {
		s += "; last flush error: " + e.LastErr.Error()
	}
	return s
}

func (e *UncommittedError) Unwrap() error { return e.LastErr }

// uncommitted describes the cycles the flusher has not committed, for a
// stop that gives up on them after timeout.
func (f *flusher) uncommitted(timeout time.Duration) *UncommittedError {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := &UncommittedError{Timeout: timeout, Cycles: len(f.inflight), LastErr: f.lastFail}
	ranges := map[string]*UncommittedRange{}
	for _, cyc := range f.inflight {
		e.Bytes += cyc.bytes
		for _, p := range cyc.parts {
			if p.to <= p.from {
				continue
			}
			key := fmt.Sprintf("%s/%d", p.lease.Topic, p.lease.Partition)
			r, ok := ranges[key]
			if !ok {
				r = &UncommittedRange{Topic: p.lease.Topic, Partition: p.lease.Partition, From: p.from, To: p.to}
				ranges[key] = r
			}
			r.From, r.To = min(r.From, p.from), max(r.To, p.to)
		}
	}
	for _, r := range ranges {
		e.Partitions = append(e.Partitions, *r)
	}
	slices.SortFunc(e.Partitions, func(a, b UncommittedRange) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	return e
}
