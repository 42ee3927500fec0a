package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/flowlog/flowlog/meta"
)

// flusher runs cycles one at a time, in freeze order, on its own goroutine
// (start; runSession owns it and waits for it to end). A cycle is retried
// with backoff until it commits; its files stay on disk until then. Cycles
// queue behind it while the consume loop goes on, bounded by
// --max-temp-bytes (the loop pauses fetching past it).
type flusher struct {
	c   *Consumer
	cl  *kgo.Client  // the session's group client: Kafka offset commits
	adm *kadm.Client // on cl: end and start offsets for the checkpoint

	mu       sync.Mutex
	queue    []*cycle
	wake     chan struct{}
	kickCh   chan struct{}
	closed   bool
	err      error // a fencing failure: the session must end
	lastFail error // the last failed attempt of a cycle, for UncommittedError
	inflight []*cycle
	// kafkaPending are the Redis-committed offsets not yet acknowledged by
	// Kafka's group coordinator, by apply partition.
	kafkaPending map[int32]int64
	// kafkaGone are partitions revoked or lost since their assignment: a
	// cycle of theirs that commits late must not queue a Kafka commit over
	// the new owner's.
	kafkaGone map[int32]bool
	// failing is the cycle being retried, while it is.
	failing failingCycle
	// ckptWritten is the value this flusher last wrote to the layout v2
	// global checkpoint object, catalogsInit whether it made the flows of
	// an older version dirty, and flowCkptsDone whether one advance of its
	// moved every flow's checkpoint_ts (advanceCheckpoint's goroutine only).
	ckptWritten   uint64
	catalogsInit  bool
	flowCkptsDone bool

	// advWait are the cycles committed since the advance in progress
	// started, in commit order: the next advance completes them
	// (advanceLoop). advWake has room for one wake-up.
	advMu   sync.Mutex
	advWait []*cycle
	advWake chan struct{}

	// busy is whether run is processing a cycle (under mu); presealWG
	// counts the preseal goroutines (preseal), which run waits for before
	// it returns.
	busy      bool
	presealWG sync.WaitGroup
}

// failingCycle is a cycle whose attempts keep failing.
type failingCycle struct {
	id       string
	attempts int // failed in a row
	err      error
}

// maxInflightCycles bounds the frozen cycles waiting for their commit: past
// it the interval trigger freezes no other and fetching pauses. A cycle
// that cannot upload (one that owes a dropped flow's data, say) thus never
// makes the queue grow without end while heartbeats keep coming. The size
// and files triggers still freeze (they keep a cycle within --flush-size
// and --max-cycle-files; --max-temp-bytes bounds what they can add), and so
// do the triggers a correct backup needs (DDL, revoke, shutdown, POST
// /flush).
const maxInflightCycles = 8

// full reports whether maxInflightCycles cycles wait.
func (f *flusher) full() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.inflight) >= maxInflightCycles
}

// readyFailedAttempts is how many failed attempts in a row of a cycle make
// /readyz report it (at most --fatal-after).
const readyFailedAttempts = 5

// stuck returns an error naming the cycle being retried once its attempts
// failed readyFailedAttempts times in a row (or --fatal-after, if fewer),
// and nil otherwise.
func (f *flusher) stuck() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fc := f.failing; fc.attempts > 0 && fc.attempts >= min(readyFailedAttempts, f.c.cfg.FatalAfter) {
		return fmt.Errorf("flush cycle %s cannot upload or commit: %d attempts failed in a row, the last with: %w", fc.id, fc.attempts, fc.err)
	}
	return nil
}

func newFlusher(c *Consumer) *flusher {
	return &flusher{c: c, wake: make(chan struct{}, 1), kickCh: make(chan struct{}, 1), advWake: make(chan struct{}, 1),
		kafkaPending: map[int32]int64{}, kafkaGone: map[int32]bool{}}
}

// start runs the flusher on a goroutine of its own with the session's
// clients, until close and an empty queue or ctx's end, and the checkpoint
// advances on another (advanceLoop); done is closed when both have
// returned.
func (f *flusher) start(ctx context.Context, cl *kgo.Client, adm *kadm.Client) (done <-chan struct{}) {
	f.cl, f.adm = cl, adm
	ch := make(chan struct{})
	stop := make(chan struct{})
	advDone := make(chan struct{})
	go func() {
		defer close(advDone)
		f.advanceLoop(ctx, stop)
	}()
	go func() {
		defer close(ch)
		f.run(ctx)
		close(stop)
		<-advDone
	}()
	return ch
}

// committed hands a cycle that committed to the checkpoint advance: it is
// complete (its waiters told) once an advance that started after its
// commit has run. The flusher goes on with the next cycle meanwhile, so an
// advance that takes long (the first at width writes every flow's catalog)
// no longer holds the next upload back. The cycle's waiters (POST /flush, a
// revoke, the stop) still see the checkpoint that its commit allows.
func (f *flusher) committed(cyc *cycle) {
	f.mu.Lock()
	f.dropInflight(cyc)
	f.mu.Unlock()
	f.advMu.Lock()
	f.advWait = append(f.advWait, cyc)
	f.advMu.Unlock()
	select {
	case f.advWake <- struct{}{}:
	default:
	}
}

// advanceLoop advances the checkpoint after commits, one advance for every
// cycle that committed while the one before ran, and completes those
// cycles. Once stop is closed it runs one last advance for what is left
// and returns. An advance that fails is logged and retried after the next
// commit (an interval cycle commits even without new data).
func (f *flusher) advanceLoop(ctx context.Context, stop <-chan struct{}) {
	for {
		stopped := false
		select {
		case <-f.advWake:
		case <-stop:
			stopped = true
		}
		f.advMu.Lock()
		batch := f.advWait
		f.advWait = nil
		f.advMu.Unlock()
		if len(batch) > 0 {
			start := time.Now()
			if err := f.advanceCheckpoint(ctx); err != nil {
				f.c.log.Warn("advancing the global checkpoint failed; retried after the next commit", "err", err)
			}
			f.c.m.flushDuration.WithLabelValues("checkpoint").Observe(time.Since(start).Seconds())
			for _, cyc := range batch {
				f.announce(cyc)
				cyc.complete(nil)
			}
		}
		if stopped {
			return
		}
	}
}

// enqueue hands a frozen cycle over. It never blocks.
func (f *flusher) enqueue(cyc *cycle) {
	f.mu.Lock()
	if f.err != nil || f.closed {
		err := errors.New("flusher stopped")
		if f.err != nil {
			err = f.err
		}
		f.mu.Unlock()
		cyc.discard()
		cyc.complete(err)
		return
	}
	f.queue = append(f.queue, cyc)
	f.inflight = append(f.inflight, cyc)
	f.c.m.inflightCycles.Set(float64(len(f.inflight)))
	f.presealLocked()
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
			tf.eachFlow(func(fl *meta.Flow) { out[flowLabel(fl.Info.CatalogName, fl.Info.FlowName)] += float64(tf.size) })
		}
	}
	return out
}

// next takes the next cycle from the queue, waiting for one; nil once
// the flusher is closed and the queue empty. The cycle after it, if
// queued, starts sealing (presealLocked).
func (f *flusher) next() *cycle {
	for {
		f.mu.Lock()
		f.busy = false
		if len(f.queue) > 0 {
			cyc := f.queue[0]
			f.queue = f.queue[1:]
			f.busy = true
			f.presealLocked()
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
	f.mu.Lock()
	f.dropInflight(cyc)
	f.mu.Unlock()
	cyc.complete(err)
}

// dropInflight removes cyc from the cycles in flight, under mu.
func (f *flusher) dropInflight(cyc *cycle) {
	for i, c := range f.inflight {
		if c == cyc {
			f.inflight = append(f.inflight[:i], f.inflight[i+1:]...)
			break
		}
	}
	f.c.m.inflightCycles.Set(float64(len(f.inflight)))
}

// presealLocked starts sealing the cycle at the head of the queue while
// run processes the one before it, so that packing a cycle's raw runs
// (pack.go, the bulk of a wide cycle's seal) overlaps the upload before it
// instead of following it. One cycle at most is sealed ahead: its packed
// bytes are already counted in the temp budget (cycle.raw). A preseal
// changes nothing of the order: cycles upload and commit in queue order,
// and their object names are chosen at upload. Must hold f.mu.
func (f *flusher) presealLocked() {
	if !f.busy || len(f.queue) == 0 || f.queue[0].presealing {
		return
	}
	cyc := f.queue[0]
	cyc.presealing = true
	f.presealWG.Go(func() { _ = f.seal(cyc) })
}

// run processes cycles until close is called and the queue is empty, or ctx
// is canceled (a hard stop: files stay for the next start to clean up).
// It returns once a preseal it started has ended.
func (f *flusher) run(ctx context.Context) {
	defer f.presealWG.Wait()
	for {
		cyc := f.next()
		if cyc == nil {
			return
		}
		err := f.process(ctx, cyc)
		if err == nil {
			cyc.discard()
			f.committed(cyc)
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
		f.mu.Lock()
		f.failing = failingCycle{}
		if err != nil {
			f.failing = failingCycle{id: cyc.id, attempts: attempt, err: err}
		}
		f.mu.Unlock()
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
	f.cl.CommitOffsetsSync(cctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
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
