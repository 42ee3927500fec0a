package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flowlog/flowlog/internal/dlq"
	"github.com/flowlog/flowlog/meta"
	"github.com/flowlog/flowlog/sink"
)

// Deps are the parts a Consumer is built from; cmd/consumer assembles them.
type Deps struct {
	ApplyTopic string
	Group      string
	KafkaOpts  []kgo.Opt // connection options (seeds, TLS, SASL)
	GroupOpts  []kgo.Opt // extra options for the group client only (e.g. kprom hooks)
	Store      *meta.Store
	Registry   *meta.Registry
	Applier    *meta.Applier
	Bucket     sink.Bucket
	GCSPrefix  string
	DLQ        *dlq.Writer
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	RedactLogs bool // keep record keys and values out of logs (default on)
}

// ErrTempWrite marks a failed write of a temp file (disk full, I/O error):
// the session's uncommitted data is dropped and consumed again from the
// committed offsets once the consumer has paused and rejoined.
var ErrTempWrite = errors.New("temp file write failed")

// Consumer is the data path and the commit protocol (docs/FORMAT.md, "How an
// apply record is handled" and "Commit protocol"). It joins the consumer
// group on the apply topic; every polled batch first passes the DDL barrier
// (Applier.CatchUp), then its events are routed to per-table temp files. A
// flush cycle freezes the files together with the consumed offsets and region
// resolved ts, uploads one data and one meta object per flow, and only then
// commits in Redis (fenced by the partition leases), in Kafka, and advances
// the global checkpoint.
//
// Why nothing is lost or duplicated:
//   - offsets only move in Redis in the same transaction that references the
//     objects holding every record below them, and only while this member's
//     leases are intact; a crash before it leaves the objects unreferenced
//     and the records are consumed again from the last committed offset;
//   - a partition always restarts at the Redis offset (the Kafka commit is
//     advisory), so a record is in exactly one referenced cycle;
//   - a zombie that lost a partition fails the lease check and its objects
//     stay unreferenced; it then drops its state and rejoins.
type Consumer struct {
	cfg Config
	d   Deps
	log *slog.Logger
	m   *metrics

	cycleSeq atomic.Uint64
	// progress is when the consume loop last handled a record or found
	// nothing waiting (UnixNano); /readyz reads it without a lock.
	progress atomic.Int64
	// tsAhead is the session's ahead of the last freeze, in nanoseconds
	// (ts_ahead_seconds), for /status.
	tsAhead atomic.Int64
	// tempFault is the last temp-file write error, until a cycle commits
	// again (/readyz reports it).
	tempFault atomic.Pointer[error]
	// ownerLost is the *meta.OwnerLostError that stopped the consumer for
	// good: Redis lost the prefix's state (/readyz reports it).
	ownerLost atomic.Pointer[error]

	// spares are released segment files kept for the next segments to
	// write over (spare.go).
	spares *spareFiles

	// fatal owns the fatal-flow state of every session.
	fatal *fatal

	status statusCache // the flows' Redis part of /status

	// lastCyc is the last committed cycle, for /status. The flusher
	// stores it without taking mu: the flusher never waits on the
	// Consumer's lock.
	lastCyc atomic.Pointer[CycleStatus]

	mu  sync.Mutex
	cur *session // the running session, for Flush and Status

	// flowLabels are the flow labels with metric series; the consume loop
	// owns it (observeFlows).
	flowLabels map[string]bool
}

// New validates cfg and returns a Consumer. Leftover temp files of an earlier
// process are removed, --max-open-files is fitted to the process's open
// file limit (applyFileLimits), and --max-open-files and --max-cycle-files
// to --max-memory (applyMemoryLimits).
func New(cfg Config, d Deps) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if err := cleanTempDir(cfg.TempDir); err != nil {
		return nil, err
	}
	if cfg.MaxClockSkew == 0 {
		cfg.MaxClockSkew = DefaultMaxClockSkew
	}
	cfg.applyFileLimits(d.Logger)
	cfg.applyMemoryLimits(d.Logger)
	c := &Consumer{cfg: cfg, d: d, log: d.Logger, m: newMetrics(d.Registerer),
		spares: newSpareFiles(cfg.TempDir, spareBudget(int64(cfg.FlushSize), int64(cfg.MaxTempBytes)))}
	c.fatal = newFatal(d.Store, d.Registry, c.m, d.Logger, cfg.FatalAfter)
	c.m.maxTempBytes.Set(float64(cfg.MaxTempBytes))
	return c, nil
}

// cleanTemp removes the temp dir's leftovers (cleanTempDir) and forgets
// the spares among them.
func (c *Consumer) cleanTemp() error {
	err := cleanTempDir(c.cfg.TempDir)
	c.spares.reset()
	return err
}

// Run consumes until ctx is canceled, then finishes the cycle in flight,
// flushes and commits what it holds, leaves the group and returns nil. A
// session that loses a lease (it was fenced) is dropped and a new one joins.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.spares.clear()
	backoff := time.Second
	for {
		err := c.runSession(ctx)
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, meta.ErrOwnerLost):
			return c.haltOwnerLost(ctx, err)
		case errors.Is(err, meta.ErrLeaseLost):
			c.log.Warn("fenced: a partition lease moved to another member; dropping uncommitted state and rejoining", "err", err)
			if err := c.cleanTemp(); err != nil {
				return err
			}
			continue
		case errors.Is(err, ErrTempWrite):
			// Disk full or failing: what was not committed cannot be
			// trusted. Drop it, stay out of the group (no fetching) for a
			// while, and consume it again from the committed offsets.
			c.tempFault.Store(&err)
			c.m.tempWriteErrors.Inc()
			c.log.Error("writing temp files failed: uncommitted data dropped, consuming it again from the committed offsets after a pause",
				"temp_dir", c.cfg.TempDir, "retry_in", backoff, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 30*time.Second)
			if err := c.cleanTemp(); err != nil {
				c.log.Error("cleaning the temp dir failed; retrying", "temp_dir", c.cfg.TempDir, "err", err)
			}
			continue
		}
		return err
	}
}

// haltOwnerLost stops the consumer for good after Redis lost the prefix's
// state (the owner key is gone or names another group): rejoining would take
// leases, offsets, flow ids and metas over from nothing while the bucket
// holds the backup they describe. The session has ended (nothing of its
// uncommitted cycles was committed); the consumer stays out of the group,
// logs the cause once, reports it on /readyz and /status, and returns it
// when ctx ends. The way back is `consumer recover`, then a restart.
func (c *Consumer) haltOwnerLost(ctx context.Context, err error) error {
	c.ownerLost.Store(&err)
	c.m.ownerLost.Set(1)
	c.log.Error("stopped: Redis lost this prefix's state; nothing more is committed until `consumer recover` rebuilds it and the consumer restarts", "err", err)
	if cerr := c.cleanTemp(); cerr != nil {
		c.log.Warn("cleaning the temp dir failed", "temp_dir", c.cfg.TempDir, "err", cerr)
	}
	<-ctx.Done()
	return err
}

// OwnerLost returns the error that stopped the consumer because Redis lost
// the prefix's state, or nil.
func (c *Consumer) OwnerLost() error {
	if p := c.ownerLost.Load(); p != nil {
		return *p
	}
	return nil
}

// noteOwnerLost records err when it says Redis lost the prefix's state, so
// that the consume loop ends the session with it (a lease taken on
// assignment runs in a group callback, whose error kgo keeps to itself).
func (c *Consumer) noteOwnerLost(err error) {
	if errors.Is(err, meta.ErrOwnerLost) {
		c.ownerLost.CompareAndSwap(nil, &err)
	}
}

// Flush starts a flush cycle now and waits until it is committed (POST
// /flush). It returns an error if no session is running or the cycle fails.
func (c *Consumer) Flush(ctx context.Context) error {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return errors.New("flush: consumer is not running")
	}
	done := make(chan error, 1)
	select {
	case s.flushReq <- done:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stopped:
		return errors.New("flush: session ended")
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runSession is one membership of the group: it builds the session and its
// Kafka client, starts the flusher, runs the consume loop until ctx ends or
// the session fails, and then ends the session (end), which stops all it
// started.
func (c *Consumer) runSession(ctx context.Context) error {
	s := &session{
		c:        c,
		parts:    map[int32]*partState{},
		flushReq: make(chan chan error),
		stopped:  make(chan struct{}),
		clReady:  make(chan struct{}),
		router:   NewRouter(c.d.Registry),
	}
	// The flusher exists before the client: the group's callbacks may run
	// as soon as kgo.NewClient starts joining.
	s.fl = newFlusher(c)
	s.gen = newGeneration(c.cfg.TempDir, s.nextGen(), c.cfg.MaxOpenFiles, c.cfg.Compression, c.spares)
	c.fatal.reset() // the cycles that failed belonged to the session before
	opts, err := s.clientOpts()
	if err != nil {
		return err // nothing started yet
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		s.dec.close() // the only part started yet
		return fmt.Errorf("kafka client: %w", err)
	}
	s.cl = cl
	s.sizer.setClient(cl)
	s.adm = kadm.NewClient(cl)
	close(s.clReady)
	// The flusher's context outlives ctx: a graceful stop still commits
	// the final cycle. end cancels it.
	flCtx, flCancel := context.WithCancel(context.WithoutCancel(ctx))
	flDone := s.fl.start(flCtx, cl, s.adm)

	c.mu.Lock()
	c.cur = s
	c.mu.Unlock()
	return s.end(s.loop(ctx), flCancel, flDone)
}

// clientOpts are the options of the session's group client. It sets the
// session's fetch sizer and decompressor, which the caller closes.
func (s *session) clientOpts() ([]kgo.Opt, error) {
	c := s.c
	reset := kgo.NewOffset().AtStart()
	if c.cfg.StartOffset == "latest" {
		reset = kgo.NewOffset().AtEnd()
	}
	opts := append(append([]kgo.Opt{}, c.d.KafkaOpts...), c.d.GroupOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(c.d.Group),
		kgo.ConsumeTopics(c.d.ApplyTopic),
		kgo.ConsumeResetOffset(reset),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.AdjustFetchOffsetsFn(s.adjustOffsets),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
	)
	// Fetch sizes, concurrency and wait from --max-memory; a poll is also
	// at most a quarter of --max-temp-bytes, which bounds the overshoot of
	// the fetch pause (Config.fetchMaxBytes).
	opts = append(opts, c.cfg.FetchOpts()...)
	// ... counted decompressed: the limit follows the compression ratio of
	// the batches fetched (fetchsize.go).
	sizer, first := newFetchSizer(c.cfg.fetchMaxBytes(), func(n int32) { c.m.fetchMaxBytes.Set(float64(n)) })
	s.sizer = sizer
	opts = append(opts, kgo.FetchMaxBytes(first), kgo.FetchMaxPartitionBytes(first), kgo.WithHooks(sizer))
	// ... and decompressed within bounds of its own: per batch
	// --max-batch-bytes, per poll the fetch share (decompress.go).
	dec, err := newBatchDecompressor(c.cfg.batchMax(), c.cfg.MemoryBudget()/fetchShare)
	if err != nil {
		return nil, err
	}
	dec.onDefer = c.m.fetchDeferred.Inc
	s.dec = dec
	// Its buffers go back to it once a batch's records are recycled
	// (decompress_pool.go).
	opts = append(opts, kgo.WithDecompressor(dec), kgo.WithPools(dec))
	if st := c.cfg.SessionTimeout; st > 0 {
		// A heartbeat at most every third of the session, as Kafka advises.
		opts = append(opts, kgo.SessionTimeout(st), kgo.RebalanceTimeout(st), kgo.HeartbeatInterval(min(3*time.Second, st/3)))
	}
	return opts, nil
}

// end ends the session after its consume loop returned err (nil: ctx
// ended, a graceful stop), in this order, each step for its reason:
//
//  1. On a graceful stop, freeze what the session holds and wait up to
//     --shutdown-timeout for its commit: a stop commits everything it
//     consumed. A fenced final flush is no error: the new owner consumes
//     the uncommitted records again.
//  2. Close the flusher: it returns once its queue is drained. After a
//     failure its context is canceled first, so nothing more commits once
//     the session has failed (a hard stop; files stay for the next start).
//  3. Wait for the flusher's goroutine: nothing touches the session's files
//     or its Kafka client after it returned.
//  4. Mark the session closing: the revoke callbacks that closing the client
//     runs find nothing to flush.
//  5. Close the Kafka client: it leaves the group and the partitions move.
//  6. Remove the current generation's files (a graceful stop froze them
//     all in step 1; after a failure they are consumed again).
//  7. Unpublish the session and close stopped: POST /flush no longer
//     reaches it, and a Flush waiting to hand it a request returns.
//  8. Close the batch decompressor (its pooled zstd decoders): only now,
//     since the client decompresses fetches until step 5 returns.
//
// When end returns, nothing the session started still runs.
func (s *session) end(err error, flCancel context.CancelFunc, flDone <-chan struct{}) error {
	c := s.c
	if err == nil {
		s.mu.Lock()
		cyc := s.freeze(triggerShutdown)
		s.mu.Unlock()
		wctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownTimeout)
		switch werr := s.fl.waitCtx(wctx, cyc); {
		case errors.Is(werr, meta.ErrLeaseLost):
			c.log.Warn("final flush fenced: the partitions have a new owner, which consumes the uncommitted records again", "err", werr)
		case errors.Is(werr, context.DeadlineExceeded):
			err = s.fl.uncommitted(c.cfg.ShutdownTimeout)
		case werr != nil:
			err = fmt.Errorf("final flush (uncommitted data is consumed again on restart): %w", werr)
		}
		cancel()
	}
	if err != nil {
		flCancel()
	}
	s.fl.close()
	<-flDone
	flCancel()
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.cl.Close()
	s.dropAll()
	c.mu.Lock()
	c.cur = nil
	c.mu.Unlock()
	close(s.stopped)
	s.dec.close()
	return err
}
