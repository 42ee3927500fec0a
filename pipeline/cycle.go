package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/flowlog/flowlog/meta"
)

// cycle is one frozen generation on its way to GCS and the commit.
type cycle struct {
	id      string // <unix ms>-<seq>-<16 hex digits of random bits> (newCycleID)
	seq     uint64
	trigger string
	files   []*tempFile
	bytes   int64
	mem     int64 // memory its files hold (tempFile.mem), counted in the temp budget
	raw     int64 // bytes of its files' raw runs, counted again in the temp budget (pack.go)
	parts   []partCommit
	// coverage are the partition reports of pending coverage windows,
	// covLeases the leases of their partitions and covFlows the flows the
	// reports are of, named as the consume loop last knew them.
	coverage  []meta.CoverageReport
	covLeases []meta.Lease
	covFlows  map[meta.FlowID]*meta.Flow

	// sealOnce seals the cycle once (flusher.seal): on the flusher's
	// goroutine, or ahead of it on a preseal goroutine while the cycle
	// before uploads. sealErr is its outcome, presealing whether a preseal
	// goroutine was started for it.
	sealOnce   sync.Once
	sealErr    error
	presealing bool
	// uploads are the cycle's objects, built on the first attempt: one
	// data object and meta per flow in layout v1, one of each for the
	// whole cycle in layout v2 (none when it has nothing to upload).
	uploads []*upload
	// flows are the flows with a chunk in the cycle, by id.
	flows   []*meta.Flow
	started time.Time
	// firstObject is when the first object under the current names was
	// uploaded (commitage.go), under upMu.
	upMu        sync.Mutex
	firstObject time.Time

	done chan struct{}
	err  error
	// waiters are told the cycle's outcome when it is done (POST /flush):
	// each channel has room for it.
	waiters []chan<- error
}

// served are the flows the cycle's objects serve: those with a chunk in
// it and those with a coverage report in it (the flows a layout v2 meta
// names), by id. A failed upload counts against each of them and a commit
// clears them (fatal), so a cycle of coverage reports only that cannot
// upload makes its flows fatal like any other.
func (cyc *cycle) served() []*meta.Flow {
	out := slices.Clone(cyc.flows)
	for _, id := range slices.Sorted(maps.Keys(cyc.covFlows)) {
		fl := cyc.covFlows[id]
		if fl != nil && !slices.ContainsFunc(out, func(g *meta.Flow) bool { return g.ID == id }) {
			out = append(out, fl)
		}
	}
	return out
}

// complete records the cycle's outcome and tells whoever waits for it.
func (cyc *cycle) complete(err error) {
	cyc.err = err
	close(cyc.done)
	for _, w := range cyc.waiters {
		w <- err
	}
}

// discard removes the cycle's temp files, once a preseal of them has
// ended (a cycle not sealed yet never will be).
func (cyc *cycle) discard() {
	cyc.sealOnce.Do(func() { cyc.sealErr = errDiscarded })
	for _, tf := range cyc.files {
		tf.remove()
	}
}

// attempt is one try of a cycle: upload what is not uploaded yet, commit in
// Redis, commit in Kafka. The checkpoint advance follows on its own
// goroutine (flusher.committed).
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
	if commit := f.commitOf(cyc); len(commit.Partitions) > 0 || len(commit.Metas) > 0 || len(commit.Coverage) > 0 {
		if err := c.d.Store.Commit(ctx, commit); err != nil {
			return fmt.Errorf("commit cycle %s: %w", cyc.id, err)
		}
	}
	c.m.flushDuration.WithLabelValues("commit").Observe(time.Since(start).Seconds())
	c.fatal.committed(cyc.served())
	c.tempFault.Store(nil)

	start = time.Now()
	f.commitKafka(ctx, cyc)
	c.m.flushDuration.WithLabelValues("kafka_commit").Observe(time.Since(start).Seconds())

	return nil
}

// commitOf is the Redis commit of the cycle (meta.Store.Commit): every
// partition's offsets and checkpoint, the coverage reports, and the metas
// the cycle uploaded, listed for every flow they name (upload.refs).
func (f *flusher) commitOf(cyc *cycle) meta.Commit {
	commit := meta.Commit{LastFlushTS: uint64(time.Now().UnixMilli()) << 18}
	for _, p := range cyc.parts {
		commit.Leases = append(commit.Leases, p.lease)
		commit.Partitions = append(commit.Partitions, p.commit())
	}
	for _, l := range cyc.covLeases {
		if !slices.ContainsFunc(commit.Leases, func(h meta.Lease) bool { return h.Topic == l.Topic && h.Partition == l.Partition }) {
			commit.Leases = append(commit.Leases, l)
		}
	}
	commit.Coverage = cyc.coverage
	for _, u := range cyc.uploads {
		commit.Metas = append(commit.Metas, u.refs()...)
	}
	for _, fl := range cyc.flows {
		commit.Flows = append(commit.Flows, fl.ID)
	}
	return commit
}

// seal closes the cycle's temp files once and lays them out as its
// uploads, or waits for a preseal of the cycle to have done so, and returns
// the outcome.
func (f *flusher) seal(cyc *cycle) error {
	cyc.sealOnce.Do(func() { cyc.sealErr = f.sealNow(cyc) })
	return cyc.sealErr
}

// errDiscarded is the seal outcome of a cycle discarded before it was
// sealed.
var errDiscarded = errors.New("cycle discarded")

// sealNow is seal's work: close the files, pack their raw runs (pack.go),
// group them into uploads.
func (f *flusher) sealNow(cyc *cycle) error {
	start := time.Now()
	for _, tf := range cyc.files {
		if err := tf.close(); err != nil {
			return fmt.Errorf("%w: %w", ErrTempWrite, err)
		}
	}
	if err := packFiles(cyc.files); err != nil {
		return err
	}
	if f.c.cfg.v2() {
		cyc.uploads, cyc.flows = groupV2(cyc)
	} else {
		cyc.uploads, cyc.flows = groupByFlow(cyc.files)
	}
	f.c.m.tempWrite.WithLabelValues("close").Observe(time.Since(start).Seconds())
	return nil
}

// announce records a committed cycle for /status and logs it, once the
// checkpoint advance after its commit has run.
func (f *flusher) announce(cyc *cycle) {
	c := f.c
	c.lastCyc.Store(&CycleStatus{ID: cyc.id, Trigger: cyc.trigger, Files: len(cyc.files), Bytes: cyc.bytes,
		Flows: len(cyc.flows), Finished: time.Now().UTC(), Duration: time.Since(cyc.started).Seconds()})
	// An interval cycle without files (offsets and checkpoints only) is
	// most of an idle consumer's cycles: debug, so that the log holds what
	// moved data. A stop's or a revoke's cycle is logged even when empty:
	// it says the stop committed.
	level := slog.LevelInfo
	if len(cyc.files) == 0 && cyc.trigger == triggerInterval {
		level = slog.LevelDebug
	}
	c.log.Log(context.Background(), level, "flush cycle committed", "cycle", cyc.id, "trigger", cyc.trigger, "files", len(cyc.files),
		"bytes", cyc.bytes, "flows", len(cyc.flows), "objects", 2*len(cyc.uploads), "partitions", len(cyc.parts),
		"took", time.Since(cyc.started).Round(time.Millisecond))
}
