package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flowlog/flowlog/meta"
)

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

// cycle is one frozen generation on its way to GCS and the commit.
type cycle struct {
	id      string
	seq     uint64
	trigger string
	files   []*tempFile
	bytes   int64
	mem     int64 // memory its files hold (tempFile.mem), counted in the temp budget
	parts   []partCommit
	// coverage are the partition reports of pending coverage windows and
	// covLeases the leases of their partitions.
	coverage  []meta.CoverageReport
	covLeases []meta.Lease

	closed  bool
	flows   []*flowUpload // files grouped by flow, built on the first attempt
	started time.Time
	// firstObject is when the first object under the current names was
	// uploaded (commitage.go), under upMu; renames counts the renames.
	upMu        sync.Mutex
	firstObject time.Time
	renames     int

	done chan struct{}
	err  error
}

// discard removes the cycle's temp files.
func (cyc *cycle) discard() {
	for _, tf := range cyc.files {
		tf.remove()
	}
}

// flusher runs cycles one at a time, in freeze order, on its own goroutine.
// A cycle is retried with backoff until it commits; its files stay on disk
// until then. Cycles queue behind it while the consume loop goes on, bounded
// by --max-temp-bytes (the loop pauses fetching past it).
type flusher struct {
	c *Consumer
	s *session

	mu       sync.Mutex
	queue    []*cycle
	wake     chan struct{}
	kickCh   chan struct{}
	closed   bool
	err      error // a fencing failure: the session must end
	lastFail error // the last failed attempt of a cycle, for UncommittedError
	inflight []*cycle
	failures map[meta.FlowID]int
	// kafkaPending are the Redis-committed offsets not yet acknowledged by
	// Kafka's group coordinator, by apply partition.
	kafkaPending map[int32]int64
	// kafkaGone are partitions revoked or lost since their assignment: a
	// cycle of theirs that commits late must not queue a Kafka commit over
	// the new owner's.
	kafkaGone map[int32]bool
}

func newFlusher(c *Consumer, s *session) *flusher {
	return &flusher{c: c, s: s, wake: make(chan struct{}, 1), kickCh: make(chan struct{}, 1), failures: map[meta.FlowID]int{}, kafkaPending: map[int32]int64{}, kafkaGone: map[int32]bool{}}
}

// enqueue hands a frozen cycle over. It never blocks.
func (f *flusher) enqueue(cyc *cycle) {
	f.mu.Lock()
	if f.err != nil || f.closed {
		cyc.err = errors.New("flusher stopped")
		if f.err != nil {
			cyc.err = f.err
		}
		close(cyc.done)
		f.mu.Unlock()
		cyc.discard()
		return
	}
	f.queue = append(f.queue, cyc)
	f.inflight = append(f.inflight, cyc)
	f.c.m.inflightCycles.Set(float64(len(f.inflight)))
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// close lets run return once the queue is drained.
func (f *flusher) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// kick cuts a retry backoff short (after a resume DDL).
func (f *flusher) kick() {
	select {
	case f.kickCh <- struct{}{}:
	default:
	}
}

// failure is the error that ends the session, if any.
func (f *flusher) failure() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *flusher) wait(cyc *cycle) error {
	<-cyc.done
	return cyc.err
}

func (f *flusher) waitCtx(ctx context.Context, cyc *cycle) error {
	select {
	case <-cyc.done:
		return cyc.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *flusher) inflightBytes() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, c := range f.inflight {
		n += c.bytes
	}
	return n
}

func (f *flusher) inflightByFlow() map[string]float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]float64{}
	for _, c := range f.inflight {
		for _, tf := range c.files {
			out[flowLabel(tf.flow.Info.CatalogName, tf.flow.Info.FlowName)] += float64(tf.size)
		}
	}
	return out
}

func (f *flusher) anyFatal() bool {
	f.c.mu.Lock()
	defer f.c.mu.Unlock()
	return len(f.c.fatal) > 0
}

func (f *flusher) next() *cycle {
	for {
		f.mu.Lock()
		if len(f.queue) > 0 {
			cyc := f.queue[0]
			f.queue = f.queue[1:]
			f.mu.Unlock()
			return cyc
		}
		closed := f.closed
		f.mu.Unlock()
		if closed {
			return nil
		}
		<-f.wake
	}
}

func (f *flusher) finish(cyc *cycle, err error) {
	cyc.err = err
	f.mu.Lock()
	for i, c := range f.inflight {
		if c == cyc {
			f.inflight = append(f.inflight[:i], f.inflight[i+1:]...)
			break
		}
	}
	f.c.m.inflightCycles.Set(float64(len(f.inflight)))
	f.mu.Unlock()
	close(cyc.done)
}

// run processes cycles until close is called and the queue is empty, or ctx
// is canceled (a hard stop: files stay for the next start to clean up).
func (f *flusher) run(ctx context.Context) {
	for {
		cyc := f.next()
		if cyc == nil {
			return
		}
		err := f.process(ctx, cyc)
		if err == nil {
			cyc.discard()
			f.finish(cyc, nil)
			continue
		}
		f.finish(cyc, err)
		if errors.Is(err, meta.ErrLeaseLost) || errors.Is(err, ErrTempWrite) {
			result := "fenced"
			if errors.Is(err, ErrTempWrite) {
				result = "temp_write"
			}
			f.c.m.cyclesTotal.WithLabelValues(cyc.trigger, result).Inc()
			f.mu.Lock()
			f.err = err
			rest := f.queue
			f.queue = nil
			f.mu.Unlock()
			cyc.discard()
			for _, r := range rest {
				r.discard()
				f.finish(r, err)
			}
			return
		}
		// Canceled: a hard stop.
		for {
			c := f.next()
			if c == nil {
				return
			}
			f.finish(c, err)
		}
	}
}

// process retries one cycle until it commits, the session is fenced, or ctx
// ends.
func (f *flusher) process(ctx context.Context, cyc *cycle) error {
	c := f.c
	cyc.started = time.Now()
	backoff := c.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		err := f.attempt(ctx, cyc)
		if err == nil {
			c.m.cyclesTotal.WithLabelValues(cyc.trigger, "ok").Inc()
			c.m.flushDuration.WithLabelValues("total").Observe(time.Since(cyc.started).Seconds())
			return nil
		}
		if errors.Is(err, meta.ErrLeaseLost) || errors.Is(err, ErrTempWrite) || ctx.Err() != nil {
			return err
		}
		c.m.cyclesTotal.WithLabelValues(cyc.trigger, "failed").Inc()
		f.mu.Lock()
		f.lastFail = err
		f.mu.Unlock()
		c.log.Warn("flush cycle failed; files kept, retrying", "cycle", cyc.id, "attempt", attempt, "retry_in", backoff, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-f.kickCh:
		case <-time.After(backoff/2 + rand.N(backoff/2+1)):
		}
		backoff = min(backoff*2, c.cfg.MaxRetryDelay)
	}
}

// attempt is one try of a cycle: upload what is not uploaded yet, commit in
// Redis, commit in Kafka, advance the checkpoint.
func (f *flusher) attempt(ctx context.Context, cyc *cycle) error {
	c := f.c
	if err := f.seal(cyc); err != nil {
		return err
	}

	start := time.Now()
	if err := f.uploadAll(ctx, cyc); err != nil {
		return err
	}
	if f.refreshStale(cyc) {
		// Committed right after, however long this takes: renaming again
		// here could loop forever on a slow store.
		if err := f.uploadAll(ctx, cyc); err != nil {
			return err
		}
	}
	c.m.flushDuration.WithLabelValues("upload").Observe(time.Since(start).Seconds())

	start = time.Now()
	commit := meta.Commit{LastFlushTS: uint64(time.Now().UnixMilli()) << 18}
	for _, p := range cyc.parts {
		commit.Leases = append(commit.Leases, p.lease)
		commit.Partitions = append(commit.Partitions, meta.PartitionCommit{
			Topic: p.lease.Topic, Partition: p.lease.Partition, NextOffset: p.to,
			Checkpoint: p.ckpt, HasCheckpoint: p.hasCkpt, Idle: p.idle, Regions: p.regions, MaxTS: p.maxTS,
			CheckFrom: true, From: p.stored,
		})
	}
	for _, l := range cyc.covLeases {
		if !slices.ContainsFunc(commit.Leases, func(h meta.Lease) bool { return h.Topic == l.Topic && h.Partition == l.Partition }) {
			commit.Leases = append(commit.Leases, l)
		}
	}
	commit.Coverage = cyc.coverage
	for _, fu := range cyc.flows {
		commit.Metas = append(commit.Metas, meta.MetaRef{FlowID: fu.flow.ID, Path: fu.metaPath, MinResolvedTS: fu.minResolved})
		commit.Flows = append(commit.Flows, fu.flow.ID)
	}
	if len(commit.Partitions) > 0 || len(commit.Metas) > 0 || len(commit.Coverage) > 0 {
		if err := c.d.Store.Commit(ctx, commit); err != nil {
			return fmt.Errorf("commit cycle %s: %w", cyc.id, err)
		}
	}
	c.m.flushDuration.WithLabelValues("commit").Observe(time.Since(start).Seconds())
	f.recovered(cyc)
	c.tempFault.Store(nil)

	start = time.Now()
	f.commitKafka(ctx, cyc)
	c.m.flushDuration.WithLabelValues("kafka_commit").Observe(time.Since(start).Seconds())

	start = time.Now()
	if err := f.advanceCheckpoint(ctx); err != nil {
		c.log.Warn("advancing the global checkpoint failed; retried next cycle", "err", err)
	}
	c.m.flushDuration.WithLabelValues("checkpoint").Observe(time.Since(start).Seconds())

	c.mu.Lock()
	c.lastCyc = CycleStatus{ID: cyc.id, Trigger: cyc.trigger, Files: len(cyc.files), Bytes: cyc.bytes,
		Flows: len(cyc.flows), Finished: time.Now().UTC(), Duration: time.Since(cyc.started).Seconds()}
	c.mu.Unlock()
	// An interval cycle without files (offsets and checkpoints only) is
	// most of an idle consumer's cycles: debug, so that the log holds what
	// moved data. A stop's or a revoke's cycle is logged even when empty:
	// it says the stop committed.
	level := slog.LevelInfo
	if len(cyc.files) == 0 && cyc.trigger == triggerInterval {
		level = slog.LevelDebug
	}
	c.log.Log(ctx, level, "flush cycle committed", "cycle", cyc.id, "trigger", cyc.trigger, "files", len(cyc.files),
		"bytes", cyc.bytes, "flows", len(cyc.flows), "partitions", len(cyc.parts), "took", time.Since(cyc.started).Round(time.Millisecond))
	return nil
}

// commitKafka mirrors the Redis offsets to the group's Kafka commits. They
// are advisory (a partition restarts from Redis first), so a failure is
// logged, not retried.
//
// Offsets whose commit failed stay pending and go out again with the next
// cycle (an interval cycle runs even without new data), so Kafka catches up
// with Redis once the group coordinator answers again.
func (f *flusher) commitKafka(ctx context.Context, cyc *cycle) {
	f.mu.Lock()
	for _, p := range cyc.parts {
		if !f.kafkaGone[p.lease.Partition] {
			f.kafkaPending[p.lease.Partition] = p.to
		}
	}
	if len(f.kafkaPending) == 0 {
		f.mu.Unlock()
		return
	}
	topic := f.c.d.ApplyTopic
	offs := map[string]map[int32]kgo.EpochOffset{topic: {}}
	for p, o := range f.kafkaPending {
		offs[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: o}
	}
	f.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	f.s.cl.CommitOffsetsSync(cctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			f.c.log.Warn("kafka offset commit failed (Redis holds the offsets); retried next cycle", "err", err)
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if t.Topic != topic {
					continue
				}
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					f.c.log.Warn("kafka offset commit failed for a partition; retried next cycle", "partition", p.Partition, "err", perr)
					continue
				}
				if f.kafkaPending[p.Partition] == offs[topic][p.Partition].Offset {
					delete(f.kafkaPending, p.Partition)
				}
			}
		}
	})
}

// forgetKafka drops pending Kafka commits of partitions this member no
// longer owns, so it never overwrites the new owner's commit.
func (f *flusher) forgetKafka(partitions []int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range partitions {
		delete(f.kafkaPending, p)
		f.kafkaGone[p] = true
	}
}

// ownKafka marks partition p assigned again.
func (f *flusher) ownKafka(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.kafkaGone, p)
}
