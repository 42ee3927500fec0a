package pipeline

import (
	"fmt"
	"log/slog"
	"syscall"
)

// Defaults of --max-open-files and --max-cycle-files, also used when a
// Config leaves them zero.
const (
	defaultMaxOpenFiles  = 384
	defaultMaxCycleFiles = 10000
)

// applyFileLimits fills in the defaults of MaxOpenFiles and MaxCycleFiles
// and keeps the open temp files within the process's descriptors: it raises
// the soft RLIMIT_NOFILE to the hard limit where allowed (Go does this by
// itself on Linux; a process started with a lower soft limit may not have
// it), and caps MaxOpenFiles at half the soft limit, leaving the other half
// to Kafka, Redis and GCS connections, the chunk files the flusher uploads
// and the HTTP server.
func (c *Config) applyFileLimits(log *slog.Logger) {
	if c.MaxOpenFiles == 0 {
		c.MaxOpenFiles = defaultMaxOpenFiles
	}
	if c.MaxCycleFiles == 0 {
		c.MaxCycleFiles = defaultMaxCycleFiles
	}
	soft, err := raiseFileLimit()
	if err != nil {
		log.Warn("cannot read RLIMIT_NOFILE; --max-open-files not checked against it", "err", err)
		return
	}
	if n := capOpenFiles(c.MaxOpenFiles, soft); n != c.MaxOpenFiles {
		log.Info("--max-open-files lowered to half the open file limit", "max_open_files", n,
			"flag", c.MaxOpenFiles, "rlimit_nofile", soft)
		c.MaxOpenFiles = n
	}
}

// capOpenFiles is n, at most half the soft open file limit and at least 1.
func capOpenFiles(n int, soft uint64) int {
	if uint64(n) > soft/2 {
		return int(max(soft/2, 1))
	}
	return n
}

// raiseFileLimit raises the soft RLIMIT_NOFILE to the hard limit if it is
// below, and returns the soft limit in effect.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Cur < lim.Max {
		up := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up); err == nil {
			lim = up
		}
	}
	return uint64(lim.Cur), nil
}

// cycleFull reports whether the current generation has reached
// --max-cycle-files: its files' bookkeeping (fileOverhead each) and the
// chunks of its data and meta objects grow with their number, however few
// bytes they hold. Or maxCycleRuns region runs in its layout v2 files: each
// is a pair in its chunk's file entry (docs/FORMAT.md, "Meta objects,
// version 2"), up to 43 bytes of the meta, and a cycle of events that
// alternate between regions would otherwise take a run for nearly every
// event.
func (s *session) cycleFull() bool {
	return len(s.gen.files) >= s.c.cfg.MaxCycleFiles || s.gen.runs >= maxCycleRuns
}

// maxCycleRuns is the most region runs the files of a cycle hold: 1,048,576
// runs are at most 43 MiB of the meta, which with --max-cycle-files file
// entries stays below the 64 MiB a meta may be. A variable so that a test
// can lower it.
var maxCycleRuns = 1 << 20

// sizeReached is the size trigger: the current generation has reached
// --flush-size, or alone fills --max-temp-bytes. Raw runs count against
// the second only (generation.diskCost), so a generation of many raw runs
// can fill the temp budget below --flush-size; were it not frozen then,
// fetching would pause with nothing in flight to free the budget, and wait
// for the interval. Must hold s.mu.
func (s *session) sizeReached() bool {
	return s.gen.cost() >= int64(s.c.cfg.FlushSize) || s.gen.diskCost() >= int64(s.c.cfg.MaxTempBytes)
}

// overBudget reports whether the current generation and the cycles in
// flight together exceed --max-temp-bytes (bytes plus the memory of their
// files, generation.cost) or hold more than twice --max-cycle-files files.
// Either pauses fetching.
func (s *session) overBudget() (bytes, files bool) {
	cost, n := s.fl.inflightCost()
	bytes = s.gen.diskCost()+cost > int64(s.c.cfg.MaxTempBytes)
	files = len(s.gen.files)+n > 2*s.c.cfg.MaxCycleFiles
	return bytes, files
}

// inflightCost is the cost (bytes plus file memory) and the number of
// files of the cycles in flight.
func (f *flusher) inflightCost() (cost int64, files int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.inflight {
		cost += c.bytes + c.mem + c.raw
		files += len(c.files)
	}
	return cost, files
}
