// Package pipeline is the consumer's data path: it reads the apply topic in
// a consumer group, routes every event to the flows that cover its table,
// appends it to temp files, and flushes the files to the bucket in cycles
// that commit in Redis before Kafka. docs/FORMAT.md describes every format
// it reads and writes and gives each rule below in full, with the reason it
// holds. Where each guarantee lives:
//
//   - DDL barrier: session.go (loop runs catchUpDDL after every poll and
//     before process routes a record; meta.Applier.CatchUp applies the DDL
//     topic up to its end offsets). A flow created before its data is
//     never missed. See docs/FORMAT.md, "DDL barrier".
//   - Exactly-once commit: cycle.go (attempt: upload, then the Redis
//     commit, then Kafka, then the checkpoint; commitOf, what the commit
//     lists), flusher.go (cycles one at a time, retried), build.go (the data
//     object and meta of each layout), upload.go (the objects, an ErrExists
//     taken as the cycle's own only when it is, and new names at once when
//     it is not), commitage.go (objects older than --max-commit-age are
//     uploaded again before they are committed) and meta.Store.Commit (the
//     fenced transaction). consumer.go drops a fenced session and rejoins.
//     See docs/FORMAT.md, "Commit protocol" and "Layout v2".
//   - Checkpoint: partition.go (partState.checkpoint, a partition's min
//     resolved ts over its live regions), freeze.go (freeze hands it to
//     the cycle with the offsets it covers) and checkpoint.go (the global
//     min over the partitions, read before coverage is finalised; the flows'
//     catalogs and the checkpoint objects after). See docs/FORMAT.md,
//     "Checkpoint rule".
//   - Fatal flows: fatal.go owns the count of failed cycles and the fatal
//     state (Redis, gauge, the fetch pause), under one lock.
//   - Coverage: flowchanges.go (observeFlows captures each partition's
//     routing boundary when the flows change) and coverage.go (the reports
//     that ride in commits); meta/coverage.go makes windows final. See
//     docs/FORMAT.md, "Coverage rule".
//   - Backpressure: session.go (backpressure pauses fetching) and budget.go
//     (overBudget: temp bytes and file memory over --max-temp-bytes, or more
//     than twice --max-cycle-files files, current and in-flight cycles
//     together); a fatal flow pauses fetching too, and so do
//     maxInflightCycles cycles waiting (flusher.go).
//   - Bounded memory: memory.go (--max-memory split into fetch, buffer,
//     upload and file-bookkeeping shares), fetchsize.go (fetch sizes follow
//     the decompressed bytes), generation.go and tempfile.go (at most
//     --max-open-files write buffers, one segment file per generation,
//     segment.go), spill.go (full buffers written in bounded batches) and
//     pack.go (partial buffers packed into frames off the consume loop).
//     Nothing grows with the backlog.
//
// The routing itself is router.go, the temp directory's safety rules
// tempdir.go, and the HTTP surface http.go and status.go.
//
// # Files
//
// The consume loop and what it does, one file each:
//
//   - consumer.go: Consumer, Run, and one session after another.
//   - session.go: the loop of one group membership (poll, DDL barrier,
//     routing a fetch, flush triggers, backpressure, gauges).
//   - record.go: one apply record, taken whole or, to the DLQ, not at all
//     (decode, ts bounds, routing, appending to temp files).
//   - freeze.go: freeze, which ends a generation and hands it to the
//     flusher as one cycle with the offsets and checkpoints it covers.
//   - assign.go: the rebalance callbacks (leases and start offsets of
//     assigned partitions, the final flush of revoked ones, what is dropped
//     of lost ones).
//   - partition.go: partition and region state.
//   - flusher.go, cycle.go, build.go, upload.go, commitage.go,
//     checkpoint.go, coverage.go: a cycle from freeze to commit.
//   - fatal.go: fatal-flow state.
//   - generation.go, segment.go, tempfile.go, spill.go, pack.go,
//     tempdir.go: temp files.
//   - budget.go, memory.go, fetchsize.go, decompress.go, bigbatch.go:
//     the bounds on disk, memory and fetches.
//   - flowchanges.go, router.go: what the flows are and where an event goes.
//   - http.go, health.go, status.go, listener.go, metrics.go: the HTTP
//     surface and metrics.
//   - shutdown.go: a stop's errors; config.go: Config.
//
// # Goroutines
//
// Every goroutine has one owner and one way to stop:
//
//   - The consume loop (session.loop) runs on the goroutine that called
//     Consumer.Run, one session after another. It returns when Run's ctx
//     ends or the session fails; session.end (consumer.go) then stops
//     everything below that the session started, in the numbered order
//     written there, and Run returns once a stop's session has ended.
//   - The flusher (flusher.start): one per session, owned by runSession.
//     end closes it and waits for it; it returns once its queue is drained,
//     or at once after a failure, when end cancels its context first.
//   - The session's Kafka client and its rebalance callbacks (assign.go):
//     the callbacks run on the client's goroutines while the loop is inside
//     PollFetches, and a revoke waits for its cycle at most 45s. end closes
//     the client after the flusher has returned.
//   - Upload and spill workers (upload.go uploadAll, spill.go parallel):
//     started and waited for by the one call that needs them.
//   - Health probes (health.go), the /status Redis read (status.go) and a
//     POST /flush (http.go): at most one of each at a time, on a context
//     of their own that ends within probeTimeout, statusRedisTime and
//     flushWait; no request waits for longer than its own deadline.
//   - The HTTP server is cmd/consumer's (runHTTP): the run stops it after
//     Run returns, and a failure of it ends the run as a signal does and is
//     the run's error.
//
// TestSessionEndLeavesNoGoroutine checks the first three from the
// goroutines' stacks after a session fails and after a stop.
package pipeline
