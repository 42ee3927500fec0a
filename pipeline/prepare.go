package pipeline

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// The flusher is a two-stage pipeline. A builder goroutine takes frozen
// cycles in freeze order, seals their temp files and builds each flow's
// data object into its spool file (prepare); the committer (flusher.run)
// then uploads, commits in Redis and Kafka and advances the checkpoint,
// one cycle at a time and in the same order. The builder works at most one
// cycle ahead: it hands a built cycle over on an unbuffered channel and
// does not take the next one until the committer has taken it, so while
// cycle N uploads only cycle N+1 is being built or waits built.
//
// Why commits stay exactly-once: preparing only writes local spool files.
// Nothing reaches GCS or Redis before the committer's turn, the committer
// handles cycles strictly in order, and a cycle whose commit fails is
// retried by the committer alone (attempt), which rebuilds whatever the
// builder left unbuilt. A spool, once built, is the bytes every retry
// uploads, as before.

// builderStages is how many flows of a cycle the builder compresses at
// once: no more than the flows uploading at once, nor than the CPUs (the
// committer's uploads and the consume loop need CPU too). Each holds one
// pooled zstd encoder while it builds.
func (f *flusher) builderStages() int {
	return max(1, min(f.c.cfg.UploadParallel, runtime.GOMAXPROCS(0)))
}

// build runs the builder stage until the queue is closed and drained, or
// the session fails (f.err set), handing prepared cycles to built, which it
// closes on return. A cycle it cannot hand over because the committer has
// stopped (stop closed) is discarded and finished with the session's
// error.
func (f *flusher) buildLoop(ctx context.Context, built chan<- *cycle, stop <-chan struct{}) {
	defer close(built)
	for {
		cyc := f.next()
		if cyc == nil {
			return
		}
		if ctx.Err() == nil {
			f.prepare(cyc)
		}
		select {
		case built <- cyc:
		case <-stop:
			f.abandon(cyc)
		}
	}
}

// abandon discards a cycle the committer will never process and finishes
// it with the session's error.
func (f *flusher) abandon(cyc *cycle) {
	err := f.failure()
	if err == nil {
		err = errors.New("flusher stopped")
	}
	cyc.discard()
	f.finish(cyc, err)
}

// prepare seals the cycle's temp files and builds the spool of each of its
// flows, builderStages at a time. A failed seal is kept in cyc.prepErr for
// the committer's first attempt (a temp file lost bytes: the session must
// end); a failed build is left to the attempt, which builds the flow again
// and reports the error as a failed cycle.
func (f *flusher) prepare(cyc *cycle) {
	if err := f.seal(cyc); err != nil {
		cyc.prepErr = err
		return
	}
	sem := make(chan struct{}, f.builderStages())
	var wg sync.WaitGroup
	for _, fu := range cyc.flows {
		if fu.spool != "" {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_ = f.buildFlow(cyc, fu)
		})
	}
	wg.Wait()
}

// seal closes the cycle's temp files once and groups them by flow.
func (f *flusher) seal(cyc *cycle) error {
	if cyc.closed {
		return nil
	}
	start := time.Now()
	for _, tf := range cyc.files {
		if err := tf.close(); err != nil {
			return fmt.Errorf("%w: %w", ErrTempWrite, err)
		}
	}
	cyc.flows = groupByFlow(cyc.files)
	cyc.closed = true
	f.c.m.tempWrite.WithLabelValues("close").Observe(time.Since(start).Seconds())
	return nil
}

// buildFlow builds fu's spool and records the build's duration.
func (f *flusher) buildFlow(cyc *cycle, fu *flowUpload) error {
	start := time.Now()
	if err := f.build(cyc, fu); err != nil {
		return fmt.Errorf("flow %s/%s: build data object: %w", fu.flow.Info.CatalogName, fu.flow.Info.FlowName, err)
	}
	f.c.m.flushDuration.WithLabelValues("build").Observe(time.Since(start).Seconds())
	return nil
}
