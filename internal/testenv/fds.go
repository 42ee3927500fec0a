package testenv

import (
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// OpenFDs counts the open file descriptors of process pid (0: this
// process), or returns -1 where /proc cannot tell.
func OpenFDs(pid int) int {
	dir := "/proc/self/fd"
	if pid > 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/fd"
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	return len(ents)
}

// FDSampler keeps the largest count of open descriptors of a process it
// sampled; its goroutine ends at Halt or with the test.
type FDSampler struct {
	mu   sync.Mutex
	peak int
	stop chan struct{}
	done chan struct{}
}

// SampleFDs counts process pid's (0: this process's) open descriptors now
// and then every interval until Halt.
func SampleFDs(t testing.TB, pid int, every time.Duration) *FDSampler {
	s := &FDSampler{peak: max(OpenFDs(pid), 0), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(every):
			}
			n := OpenFDs(pid)
			s.mu.Lock()
			s.peak = max(s.peak, n)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { s.Halt() })
	return s
}

// Halt stops the sampling and returns the largest count seen. It may be
// called more than once.
func (s *FDSampler) Halt() int {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}
