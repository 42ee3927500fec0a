package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
)

// cpuProfileEnv names a file that `consumer run` writes a CPU profile of
// its whole run to (from start to exit). It is a debugging knob for
// measuring where the consumer's CPU goes (the e2e BenchmarkPipeline passes
// its environment on); unset, nothing is profiled.
const cpuProfileEnv = "FLOWLOG_CPU_PROFILE"

// startCPUProfile starts the CPU profile cpuProfileEnv asks for, if any,
// and returns the function that stops it and closes the file.
func startCPUProfile(log *slog.Logger) (stop func(), err error) {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return func() {}, nil
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
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.Warn("closing the CPU profile failed", "path", path, "err", err)
		}
	}, nil
}
