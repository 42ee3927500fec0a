package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"time"
)

// cpuProfileEnv names a file that `consumer run` and `consumer replay`
// write a CPU profile of their whole run to (from start to exit). It is a
// debugging knob for measuring where the consumer's CPU goes (the e2e
// benchmarks pass their environment on); unset, nothing is profiled.
const cpuProfileEnv = "FLOWLOG_CPU_PROFILE"

// heapProfileEnv names a file that `consumer run` and `consumer replay`
// write a heap profile to each time the heap in use reaches a new high
// (checked every heapProfileEvery): the profile left is that of the peak. Like
// cpuProfileEnv, a debugging knob; unset, nothing is profiled.
const heapProfileEnv = "FLOWLOG_HEAP_PROFILE"

// heapProfileEvery is how often the heap in use is checked for a new high.
const heapProfileEvery = 200 * time.Millisecond

// startCPUProfile starts the CPU profile cpuProfileEnv asks for, if any,
// and returns the function that stops it and closes the file.
func startCPUProfile(log *slog.Logger) (stop func(), err error) {
	stopHeap := startHeapProfile(log)
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return stopHeap, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	log.Info("writing a CPU profile", "path", path)
	return func() {
		stopHeap()
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.Warn("closing the CPU profile failed", "path", path, "err", err)
		}
	}, nil
}

// startHeapProfile writes the heap profile heapProfileEnv asks for, if
// any, at every new high of the heap in use, until the returned function
// is called.
func startHeapProfile(log *slog.Logger) (stop func()) {
	path := os.Getenv(heapProfileEnv)
	if path == "" {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		var high uint64
		var ms runtime.MemStats
		t := time.NewTicker(heapProfileEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse <= high {
				continue
			}
			high = ms.HeapInuse
			if err := writeHeapProfile(path); err != nil {
				log.Warn("writing the heap profile failed", "path", path, "err", err)
				return
			}
		}
	}()
	log.Info("writing a heap profile at the heap's high", "path", path)
	return func() {
		close(done)
		<-finished
	}
}

// writeHeapProfile writes the heap profile to path, through a file beside
// it, so that path always holds a whole profile.
func writeHeapProfile(path string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
